"""CPU probe: what the speech API's encoders (voiceapp.http.formats) hand clients, measured without a server.

  python lab/http_formats_probe.py [--rate R] > out.json

- speed: for each factor, a 3 s two-tone test signal (220 Hz, louder, and 660 Hz) through `StreamEncoder("pcm",
  speed=...)` in 20 ms chunks: output length against round(input / speed), the dominant frequency before and after
  (an FFT of the whole signal; pitch kept means the same peak), the share of the output that came out before
  `finish` (streaming), and the encoding cost per second of audio.
- formats: each response format, streamed and sized, for a 2.5 s tone: what PyAV (FFmpeg's libavformat, as ffprobe
  reads it) and soundfile (libsndfile) decode, in samples against the input, and the bytes out before `finish`.
- wav readers: the streamed and the sized WAV handed to `soxi` and `sox ... -n stat` where SoX is installed, and to
  PyAV's duration estimate.

The rate defaults to 16000 (today's family); pass the engine's rate of another family with --rate.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voiceapp.http.formats import StreamEncoder, supported_formats  # noqa: E402

SPEEDS = (0.25, 0.5, 0.8, 1.25, 1.5, 2.0, 3.0, 4.0)


def tones(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 660 * t)).astype(np.float32)


def dominant_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64) * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def run(fmt: str, x: np.ndarray, rate: int, piece: int, **options) -> tuple[bytes, int, float]:
    enc = StreamEncoder(fmt, rate, rate, **options)
    start = time.perf_counter()
    early = b"".join(enc.encode(x[i:i + piece]) for i in range(0, len(x), piece))
    data = early + enc.finish()
    return data, len(early), time.perf_counter() - start


def av_decode(data: bytes) -> tuple[int, int, float | None]:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        n = sum(frame.samples for frame in container.decode(audio=0))
        estimate = container.duration / 1e6 if container.duration else None
        return n, stream.rate, estimate


def sf_decode(data: bytes) -> dict:
    import soundfile as sf

    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="int16")
        return {"samples": len(samples), "rate": rate}
    except Exception as err:  # what libsndfile says to the reader
        return {"error": f"{type(err).__name__}: {str(err)[:80]}"}


def speed_table(rate: int) -> list[dict]:
    x = tones(3.0, rate)
    before = dominant_hz(x, rate)
    rows = []
    for speed in SPEEDS:
        data, early, seconds = run("pcm", x, rate, rate // 50, speed=speed)
        y = np.frombuffer(data, "<i2")
        want = round(len(x) / speed)
        rows.append({"speed": speed, "samples": len(y), "expected": want, "error_samples": len(y) - want,
                     "dominant_hz_before": round(before, 1), "dominant_hz_after": round(dominant_hz(y, rate), 1),
                     "streamed_share": round(early / len(data), 3),
                     "encode_ms_per_audio_s": round(1000 * seconds / (len(x) / rate), 2)})
    return rows


def format_table(rate: int) -> list[dict]:
    x = tones(2.5, rate)
    rows = []
    for fmt in supported_formats():
        for sized in (False, True):
            data, early, _ = run(fmt, x, rate, rate // 50, sized=sized)
            row = {"format": fmt, "sized": sized, "bytes": len(data), "bytes_before_finish": early,
                   "input_samples": len(x)}
            if fmt != "pcm":
                n, out_rate, estimate = av_decode(data)
                row.update(pyav_samples=n, pyav_rate=out_rate, pyav_extra=n - len(x) * out_rate // rate,
                           pyav_duration_estimate_s=estimate)
                if fmt != "aac":
                    row["soundfile"] = sf_decode(data)
            rows.append(row)
    return rows


def wav_readers(rate: int) -> dict:
    x = tones(2.5, rate)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for sized in (False, True):
            data, _, _ = run("wav", x, rate, rate // 50, sized=sized)
            path = Path(d) / f"{'sized' if sized else 'streamed'}.wav"
            path.write_bytes(data)
            entry = {"data_size_field": int.from_bytes(data[40:44], "little"),
                     "pyav_duration_estimate_s": av_decode(data)[2]}
            if shutil.which("soxi") and shutil.which("sox"):
                soxi = subprocess.run(["soxi", str(path)], capture_output=True, text=True)
                stat = subprocess.run(["sox", str(path), "-n", "stat"], capture_output=True, text=True)
                entry["soxi_duration"] = next((line.split(":", 1)[1].strip() for line in soxi.stdout.splitlines()
                                               if line.startswith("Duration")), None)
                entry["sox_samples_read"] = next((int(line.split(":")[1]) for line in stat.stderr.splitlines()
                                                  if line.startswith("Samples read")), None)
                entry["sox_warnings"] = [line for line in stat.stderr.splitlines() if "WARN" in line]
            out["sized" if sized else "streamed"] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=16000)
    args = parser.parse_args()
    import av

    print(json.dumps({"rate": args.rate, "pyav": av.__version__, "libavformat": av.library_versions["libavformat"],
                      "speed": speed_table(args.rate), "formats": format_table(args.rate),
                      "wav_readers": wav_readers(args.rate)}, indent=1))


if __name__ == "__main__":
    main()
