"""Turns for tests run by several pytest-xdist workers: a `serial` test runs while no other test does (its timing
budget would not hold with the other core busy); every other test shares the machine."""
from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator

import pytest


class Turns:
    """Under xdist, a `serial` test runs alone and every other test shares the machine: a readers-writer lock over
    two files in the run's temporary folder, which only this run's workers share. A serial test first takes the
    gate, so the other workers' next tests wait for it rather than starving it; it then waits until the other
    workers' current tests have ended."""

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


def serial_last(items: list[pytest.Item]) -> None:
    """Sort `serial` tests after all the others, each part in its order. A serial test waits for the other worker's
    current test to end, its own core idle meanwhile; spread through the run they waited on long tests (a minute
    behind the Ray export). Last, they follow one another and the wait is paid about once. (xdist's loadgroup hands
    out its groups first, then single tests in collection order.)"""
    items.sort(key=lambda item: item.get_closest_marker("serial") is not None)
