"""Launch-to-first-sound of `voicectl say` (through a warm server) and of `spd-say` (through voiceapp's speechd
module), taken in turns, measured at a PulseAudio sink's monitor; and `say`'s own launch-to-queued (--json phase
"queued") and TTFA.

Run it where the engine server, speech-dispatcher (with the module installed) and PulseAudio already run, with the
environment they need (PULSE_SERVER, VOICEAPP_SOCKET, XDG_*):

    python lab/first_sound.py --sink tts16 --rate 16000 --runs 7 --model DIR

Prints one JSON object: per command, each run's milliseconds and their median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def first_sound_ms(command: list[str], sink: str, rate: int, capture: Path) -> tuple[float, str]:
    """Milliseconds from launching `command` to its first non-zero sample at `sink`'s monitor; its stdout."""
    rec = subprocess.Popen(["parec", "-d", f"{sink}.monitor", "--raw", "--format=float32le", f"--rate={rate}",
                            "--channels=1", "--latency-msec=5", str(capture)])
    try:
        time.sleep(0.4)
        start = capture.stat().st_size // 4
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"{command[0]} failed: {proc.stderr[-500:]}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            heard = np.flatnonzero(np.fromfile(capture, np.float32)[start:])
            if len(heard):
                return heard[0] * 1000 / rate, proc.stdout
            time.sleep(0.02)
        raise SystemExit(f"no sound from {command[0]}")
    finally:
        rec.terminate()
        rec.wait()
        capture.unlink(missing_ok=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sink", default="tts16")
    p.add_argument("--rate", type=int, default=16000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--model", required=True)
    p.add_argument("--text", default="Hello there.")
    args = p.parse_args()
    capture = Path("/tmp") / f"first-sound-{time.time_ns()}.f32"
    say = [sys.executable, "-m", "voiceapp.cli", "say", args.text, "--model", args.model, "--max-tokens", "40",
           "--json"]
    spd = ["spd-say", "-l", "en", "-w", args.text]
    out: dict[str, list[float]] = {"say_first_sound_ms": [], "say_queued_ms": [], "say_ttfa_ms": [],
                                   "spd_say_first_sound_ms": []}
    for _ in range(args.runs):
        ms, stdout = first_sound_ms(say, args.sink, args.rate, capture)
        metrics = json.loads(stdout.strip().splitlines()[-1])
        out["say_first_sound_ms"].append(round(ms, 1))
        out["say_queued_ms"].append(round(1000 * metrics["phases"].get("queued", float("nan")), 1))
        out["say_ttfa_ms"].append(round(metrics["ttfa_ms"], 1))
        out["spd_say_first_sound_ms"].append(round(first_sound_ms(spd, args.sink, args.rate, capture)[0], 1))
        time.sleep(0.3)
    print(json.dumps({k: {"runs": v, "median": statistics.median(v)} for k, v in out.items()}))


if __name__ == "__main__":
    main()
