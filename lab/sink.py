"""Provides `private_sink`: a private PulseAudio server with one float32 null sink, and the recording of its monitor,
so that a benchmark times what reaches the speakers (a process's launch to its first sound) rather than what a
process says it queued. The server is tests/audio/conftest.py's (recipe B of the headless-audio notes); a machine
without PulseAudio (the lent GPU machines) has none, and `private_sink` yields None there.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

RATE = 16000
"""The sink's rate, and the capture's (PulseAudio resamples a stream at another rate, e.g. Orpheus's 24 kHz)."""
SETTLE_S = 0.4
"""The capture's own start-up, before anything is timed against it."""
FRAGMENT_MS = 5
"""parec's fragment: the capture lags the sink by about this much, so a launch's position in it is early by as
much and a first sound timed from it late by as much (never early)."""


class Capture:
    """parec of a sink's monitor into a file, float32 at RATE."""

    def __init__(self, path: Path, sink: str, env: dict[str, str]) -> None:
        self.path = path
        self.proc = subprocess.Popen(["parec", "-d", f"{sink}.monitor", "--raw", "--format=float32le",
                                      f"--rate={RATE}", "--channels=1", f"--latency-msec={FRAGMENT_MS}", str(path)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(SETTLE_S)

    def frames(self) -> int:
        """Frames recorded so far."""
        return self.path.stat().st_size // 4 if self.path.exists() else 0

    def first_sound_s(self, start: int, timeout_s: float = 10.0) -> float | None:
        """Seconds from frame `start` to the first non-zero sample after it; None when none came in `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            heard = np.flatnonzero(np.fromfile(self.path, np.float32, offset=4 * start))
            if len(heard):
                return float(heard[0]) / RATE
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def private_sink(work: Path) -> Iterator[tuple[dict[str, str], Capture] | None]:
    """(the environment a player needs to play into the sink, the sink's capture), or None where PulseAudio or
    parec is not installed. The server and the capture are stopped by their PIDs at the end."""
    if not (shutil.which("pulseaudio") and shutil.which("parec")):
        yield None
        return
    from tests.audio.conftest import start_pulse  # the tests' recipe (it imports pytest: only where it is used)

    server = start_pulse({"bench": RATE})
    capture = None
    try:
        capture = Capture(work / "sink.f32", "bench", {**os.environ, **server.env, "HOME": str(server.dir)})
        yield {**server.env, "PULSE_SINK": "bench"}, capture
    finally:
        if capture is not None:
            capture.close()
        server.stop()
