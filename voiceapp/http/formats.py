"""Provides streamed encoders for the speech API's response formats, written by FFmpeg (through PyAV): float32
chunks in, bytes out as soon as the codec gives them.

  wav   16-bit PCM. Sized: exact RIFF and data sizes. Streamed: sizes 0x7FFFF000 (`WAV_UNKNOWN_SIZE`), the value
        SoX itself writes for a length it does not know (see docs/http.md for what each reader makes of it)
  pcm   raw 16-bit little-endian samples, no header
  flac  16-bit FLAC. Sized: STREAMINFO carries the total sample count and the MD5. Streamed: the count is 0, FLAC's
        "unknown"
  mp3   constant-bitrate MP3 (LAME) behind a Xing/LAME info frame: the encoder delay is known from the start, so
        decoders that read the frame trim it even when streamed; sized bodies also carry the frame count and the
        end padding (gapless)
  opus  Ogg Opus, a page at least every OGG_PAGE_MS; the last page's granule trims the end
  aac   AAC-LC in ADTS frames (streamable). ADTS has no field for the encoder's 1024-sample priming, and FFmpeg
        decodes it as audio; where the audio's first frame is quiet, the priming packet is left out (the first frame
        sent then carries it), else where its last, partial frame is, that packet is (`_Muxer._lets_go`)

"Sized" is a body encoded whole before it is sent (`StreamEncoder(sized=True)`): the muxer may seek back to write
what it only knows at the end. Streamed bodies go to a `_Tail`, a file that keeps only what is not yet sent: the
seeks back land on bytes already gone and are dropped, so what the muxer wrote at the start stays.

Every format gets the same 16-bit integers, round(x * 32767) of the engine's float samples clipped to [-1, 1]
(`pcm16`), so the lossless ones carry exactly what a client can compute from `voicectl say --out`. Where the output
rate is not the engine's, a streaming soxr resampler runs first; where `speed` is not 1, FFmpeg's `atempo` filter
(`Tempo`) changes the tempo and keeps the pitch.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

OGG_PAGE_MS = 50.0
"""Longest an Ogg page holds Opus audio back (FFmpeg's default, a second, is too late to stream)."""
WAV_UNKNOWN_SIZE = 0x7FFFF000
"""A streamed WAV's data size: SoX's own mark for "unknown" (it reads to the end of the data without a warning)."""
SPEED_RANGE = (0.25, 4.0)
"""The `speed` values the API takes (OpenAI's range)."""
ATEMPO_STAGE = (0.5, 2.0)
"""The factor one atempo stage is asked for at most: a wider factor is split into equal stages within this."""
QUIET_PEAK = 32
"""The largest 16-bit sample (-60 dBFS) of a frame that an AAC stream may rebuild from one packet instead of two, or
leave out at its end (`_Muxer._lets_go`); the decoded samples then differ from the whole stream's by about that
much, in that frame only."""
EDGE = 4096
"""Samples kept from each end of a stream whose container cannot state the priming: more than a codec frame."""
TEMPO_TAIL_S = 0.1
"""Silence fed to atempo after the last sample: the filter holds back up to a window of the input (flushing it
alone cuts the last tens of milliseconds), and this pushes all of it out; the output is then cut to its length."""


@dataclass(frozen=True, slots=True)
class Format:
    """How FFmpeg writes a response format."""

    media_type: str
    """The response's Content-Type."""
    muxer: str
    """FFmpeg's container name ("" for raw samples, written without FFmpeg)."""
    codec: str
    """FFmpeg's encoder name."""
    bit_rate: int = 0
    """For the lossy codecs; 0: the codec's own choice."""
    muxer_options: dict[str, str] = field(default_factory=dict)
    """The container's FFmpeg options (a streamed body also gets flush_packets, so each packet goes out at once)."""
    codec_options: dict[str, str] = field(default_factory=dict)
    """The encoder's FFmpeg options."""
    states_priming: bool = True
    """Whether the container tells a decoder how many samples the encoder's priming and end padding are (MP3's info
    frame, Opus's pre-skip and granule); ADTS cannot."""


FORMATS = {
    "wav": Format("audio/wav", "wav", "pcm_s16le", muxer_options={"fflags": "+bitexact"}),
    "pcm": Format("audio/pcm", "", "pcm_s16le"),
    "flac": Format("audio/flac", "flac", "flac", codec_options={"compression_level": "0"}),
    "mp3": Format("audio/mpeg", "mp3", "libmp3lame", 64000, {"id3v2_version": "0"}),
    "opus": Format("audio/ogg", "ogg", "libopus", 32000, {"page_duration": str(int(OGG_PAGE_MS * 1000))}),
    "aac": Format("audio/aac", "adts", "aac", 64000, states_priming=False),
}
"""response_format -> how to write it, in the order the API lists them."""


def supported_formats() -> tuple[str, ...]:
    """The response formats the installed FFmpeg (PyAV's) can write."""
    try:
        import av
    except ImportError:
        return ("pcm",)
    return tuple(name for name, spec in FORMATS.items()
                 if not spec.muxer or (spec.codec in av.codecs_available and spec.muxer in av.formats_available))


def pcm16(samples: np.ndarray) -> np.ndarray:
    """float samples -> 16-bit integers: round(x * 32767), x clipped to [-1, 1] (computed in float64)."""
    return np.rint(np.clip(np.asarray(samples, np.float64), -1.0, 1.0) * 32767.0).astype(np.int16)


def atempo_stages(speed: float) -> list[float]:
    """`speed` as equal atempo factors, each within ATEMPO_STAGE (2.5 -> [1.58, 1.58]; 0.25 -> [0.5, 0.5])."""
    low, high = ATEMPO_STAGE
    count = 1
    while not low <= speed ** (1 / count) <= high:
        count += 1
    return [speed ** (1 / count)] * count


class Tempo:
    """FFmpeg's atempo on a stream of 16-bit mono samples: `push` a block, get what the filter gives back so far;
    `flush` at the end for the rest. The whole output is round(input / speed) samples long."""

    def __init__(self, rate: int, speed: float) -> None:
        import av

        self.rate, self.speed = rate, speed
        self._in = self._out = 0
        self._graph = av.filter.Graph()
        node = self._graph.add_abuffer(sample_rate=rate, format="s16", layout="mono", time_base=Fraction(1, rate))
        self._source = node
        for factor in atempo_stages(speed):
            stage = self._graph.add("atempo", f"{factor:.6f}")
            node.link_to(stage)
            node = stage
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()
        self._pts = 0

    def push(self, samples: np.ndarray) -> np.ndarray:
        if not len(samples):
            return np.zeros(0, np.int16)
        import av

        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, np.int16)[None, :], format="s16",
                                           layout="mono")
        frame.sample_rate, frame.pts = self.rate, self._pts
        self._pts += len(samples)
        self._in += len(samples)
        self._source.push(frame)
        return self._pull()

    def flush(self) -> np.ndarray:
        """What the filter still holds, pushed out by TEMPO_TAIL_S of silence, then cut (or padded with silence)
        to make the whole output round(input / speed) samples."""
        real = self._in
        tail = self.push(np.zeros(int(TEMPO_TAIL_S * self.rate), np.int16))
        self._source.push(None)
        tail = np.concatenate([tail, self._pull()])
        self._in = real
        want = max(0, round(real / self.speed) - (self._out - len(tail)))
        self._out += want - len(tail)
        return np.concatenate([tail[:want], np.zeros(max(0, want - len(tail)), np.int16)])

    def _pull(self) -> np.ndarray:
        import av

        out = []
        while True:
            try:
                out.append(self._graph.pull().to_ndarray().reshape(-1))
            except (av.BlockingIOError, av.EOFError):
                break
        got = np.concatenate(out).astype(np.int16, copy=False) if out else np.zeros(0, np.int16)
        self._out += len(got)
        return got


class StreamEncoder:
    """One response's encoder: `encode` each chunk and send what it returns (b"" while a codec fills a block),
    then send `finish()`. `close()` drops an unfinished one. `sized`: the whole body comes from `finish()`, with
    the lengths its container can carry filled in."""

    def __init__(self, fmt: str, in_rate: int, out_rate: int, *, speed: float = 1.0, sized: bool = False) -> None:
        self.fmt, self.rate, self.sized = fmt, out_rate, sized
        self._resampler = self._tempo = self._muxer = None
        if in_rate != out_rate:
            import soxr

            self._resampler = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
        if speed != 1:
            self._tempo = Tempo(out_rate, speed)
        if FORMATS[fmt].muxer:
            self._muxer = _Muxer(FORMATS[fmt], out_rate, sized)
        self._raw = bytearray()

    def encode(self, samples: np.ndarray) -> bytes:
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(np.asarray(samples, np.float32))
        ints = pcm16(samples)
        if self._tempo is not None:
            ints = self._tempo.push(ints)
        return self._write(ints)

    def finish(self) -> bytes:
        """The rest: what the resampler, the tempo filter and the codec still hold, and the container's trailer."""
        out = b""
        if self._resampler is not None:
            ints = pcm16(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
            out += self._write(self._tempo.push(ints) if self._tempo is not None else ints)
        if self._tempo is not None:
            out += self._write(self._tempo.flush())
        if self._muxer is None:
            out, self._raw = out + bytes(self._raw), bytearray()
            return out
        return out + self._muxer.finish()

    def close(self) -> None:
        if self._muxer is not None:
            self._muxer.close()

    def _write(self, ints: np.ndarray) -> bytes:
        if self._muxer is not None:
            return self._muxer.write(ints)
        if self.sized:
            self._raw += ints.astype("<i2").tobytes()
            return b""
        return ints.astype("<i2").tobytes()


class _Muxer:
    """An FFmpeg container with one mono stream, written to a `_Tail` (streamed) or a BytesIO (sized)."""

    def __init__(self, spec: Format, rate: int, sized: bool) -> None:
        import av

        self.spec, self.rate, self.sized = spec, rate, sized
        self._out: Any = io.BytesIO() if sized else _Tail()
        options = dict(spec.muxer_options)
        if not sized:
            options["flush_packets"] = "1"  # every packet goes out as soon as it is muxed
        self._container = av.open(self._out, "w", format=spec.muxer, options=options)
        stream = self._container.add_stream(spec.codec, rate=rate, layout="mono", options=dict(spec.codec_options))
        assert isinstance(stream, av.AudioStream)  # every format's codec is an audio codec
        self._stream = stream
        if spec.bit_rate:
            self._stream.codec_context.bit_rate = spec.bit_rate
        self._pts = 0
        self._closed = False
        self._lead = self._tail = np.zeros(0, np.int16)
        """The first and the last EDGE samples (kept where the container cannot state the priming)."""
        self._primed = True
        """The encoder's priming packet was sent."""

    def write(self, ints: np.ndarray) -> bytes:
        if len(ints):
            import av

            if not self.spec.states_priming:
                self._note_edges(ints)
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(ints, np.int16)[None, :], format="s16",
                                               layout="mono")
            frame.sample_rate, frame.pts = self.rate, self._pts
            self._pts += len(ints)
            for packet in self._stream.encode(frame):
                self._mux(packet, last=False)
        return self._take()

    def finish(self) -> bytes:
        packets = list(self._stream.encode(None))
        for i, packet in enumerate(packets):
            self._mux(packet, last=i == len(packets) - 1)
        self._closed = True
        self._container.close()
        if self.sized:
            return self._out.getvalue()
        return self._take()

    def _note_edges(self, ints: np.ndarray) -> None:
        """Keep the first and the last EDGE samples (the codec's frame size is known only once it has opened)."""
        if len(self._lead) < EDGE:
            self._lead = np.concatenate([self._lead, ints[:EDGE - len(self._lead)]])
        self._tail = np.concatenate([self._tail, ints[-EDGE:]])[-EDGE:]

    def _mux(self, packet: Any, last: bool) -> None:
        if self.spec.states_priming or not self._lets_go(packet, last):
            self._container.mux(packet)

    def _lets_go(self, packet: Any, last: bool) -> bool:
        """Whether to leave out this packet of a stream whose container cannot state the priming (ADTS). A decoder
        then makes a codec frame of every packet, the encoder's priming (its first packet, before the first sample)
        and the last one's padding included: over a frame more than the audio. Where the audio's first frame is
        quiet (QUIET_PEAK), the priming packet goes: the next one, the first the decoder gets, rebuilds that frame
        on its own (a frame needs two packets, so only quiet audio survives that). Else, where the samples only the
        last packet carries are quiet, that one goes: the stream ends on the frame before. Either way the decoder
        gives the audio's length plus less than a frame; audio that is loud at both ends keeps every packet."""
        size = self._stream.codec_context.frame_size
        start = int(packet.pts * packet.time_base * self.rate) if packet.pts is not None else 0
        length = int(packet.duration * packet.time_base * self.rate) if packet.duration else size
        if start + length <= 0 and _quiet(self._lead[:size]):
            self._primed = False
            return True
        return last and self._primed and 0 < length < size and start >= 0 and _quiet(self._tail[-length:])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._container.close()
            except Exception:  # an unfinished container: nothing of it is sent any more
                pass

    def _take(self) -> bytes:
        if self.sized:
            return b""
        data = self._out.take()
        if self.spec.muxer == "wav" and self._out.taken == len(data):  # the header: the sizes are not known yet
            data = _unknown_wav_sizes(data)
        return data


def _quiet(ints: np.ndarray) -> bool:
    return int(np.abs(ints.astype(np.int32)).max(initial=0)) <= QUIET_PEAK


def _unknown_wav_sizes(head: bytes) -> bytes:
    """A streamed WAV's first bytes with the RIFF and data sizes set to WAV_UNKNOWN_SIZE (FFmpeg writes
    0xFFFFFFFF there, which SoX reads as 37 hours and then warns of a premature end)."""
    at = head.find(b"data", 12)
    if head[:4] != b"RIFF" or at < 0 or len(head) < at + 8:
        return head
    out = bytearray(head)
    struct.pack_into("<I", out, 4, WAV_UNKNOWN_SIZE + at)  # RIFF size: all after its own 8 bytes
    struct.pack_into("<I", out, at + 4, WAV_UNKNOWN_SIZE)
    return bytes(out)


class _Tail:
    """A write-only file for FFmpeg that hands out what was written (`take`) and keeps none of it: writes at or
    past what was taken land; the parts of a write over bytes already taken are dropped."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self.taken = 0
        self._pos = 0

    def write(self, data: Any) -> int:
        data = bytes(data)
        end = self._pos + len(data)
        size = self.taken + len(self._pending)
        if end > size:
            self._pending.extend(bytes(end - size))
        start = max(self._pos, self.taken)
        if start < end:
            self._pending[start - self.taken:end - self.taken] = data[start - self._pos:]
        self._pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self.taken + len(self._pending))[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        return b""  # the muxers do not read back what they write; an answer all the same

    def take(self) -> bytes:
        out = bytes(self._pending)
        self.taken += len(out)
        self._pending.clear()
        return out
