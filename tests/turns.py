"""Turns for tests run by several pytest-xdist workers: a `serial` test runs while no other test does (its timing
budget would not hold with the other core busy); every other test shares the machine."""
from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator


class Turns:
    """Under xdist, a `serial` test runs alone and every other test shares the machine: a readers-writer lock over
    two files in the run's temporary folder, which only this run's workers share. A serial test first takes the
    gate, so the other worker's next test waits for it rather than starving it; it then waits until the other
    worker's current test has ended."""

    def __init__(self, folder: Path) -> None:
        self.gate = open(folder / "serial.gate", "a+")
        self.lock = open(folder / "serial.lock", "a+")

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        fcntl.flock(self.lock, fcntl.LOCK_SH)
        fcntl.flock(self.gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
