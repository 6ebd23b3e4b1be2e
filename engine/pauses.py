"""Provides GcPauses: how long each run of Python's cyclic garbage collector held this process (every thread stops
for it), for the benchmarks' reports and a server's status. A full (generation 2) collection walks every object not
frozen, so its length is what tells whether a heap was left unfrozen. LoopLag and HeldInterpreter time the other two
ways a process stops all its streams at once: its event loop held, the interpreter held by one thread."""
from __future__ import annotations

import gc
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator

RECENT = 256
"""Collector runs of at least `least_ms` kept, newest last (a server runs for days)."""


NO_FULL_COLLECTION = 2 ** 30
"""A third threshold no run of young collections reaches."""


class _Holds:
    """How many holds are on, and the third threshold from before the first (holds may overlap and end in any
    order: the last to end puts it back)."""

    count = 0
    saved = 0
    lock = threading.Lock()


@contextmanager
def full_collections_held() -> Iterator[None]:
    """Inside, the collector runs no full (generation 2) collection of its own accord; the young generations are
    collected as before. Background work that builds much (a graph lane compiled shape by shape) would otherwise set
    off full collections that walk all it built while every thread, the live streams' too, stands still. Whoever
    holds them collects once after (a server's tuning freezes its heap)."""
    with _Holds.lock:
        if _Holds.count == 0:
            _Holds.saved = gc.get_threshold()[2]
            gc.set_threshold(*gc.get_threshold()[:2], NO_FULL_COLLECTION)
        _Holds.count += 1
    try:
        yield
    finally:
        with _Holds.lock:
            _Holds.count -= 1
            if _Holds.count == 0:
                gc.set_threshold(*gc.get_threshold()[:2], _Holds.saved)


class GcPauses:
    """A gc.callbacks entry, on while used as a context manager (or between `start` and `stop`): counts every run
    by generation and keeps the recent ones of at least `least_ms` as (started at, on `clock`; generation; ms)."""

    def __init__(self, least_ms: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.least_ms, self.clock = least_ms, clock
        self.runs = [0, 0, 0]
        """Runs by generation."""
        self.longest_ms = [0.0, 0.0, 0.0]
        """The longest run by generation."""
        self.recent: deque[tuple[float, int, float]] = deque(maxlen=RECENT)
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = self.clock()
            return
        generation, ms = info["generation"], (self.clock() - self._t0) * 1e3
        self.runs[generation] += 1
        self.longest_ms[generation] = max(self.longest_ms[generation], ms)
        if ms >= self.least_ms:
            self.recent.append((self._t0, generation, ms))

    def start(self) -> "GcPauses":
        gc.callbacks.append(self)
        return self

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def __enter__(self) -> "GcPauses":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def status(self) -> dict[str, Any]:
        """What a server's status shows: runs and the longest by generation, the frozen objects' count."""
        return {"runs": list(self.runs), "longest_ms": [round(ms, 1) for ms in self.longest_ms],
                "frozen": gc.get_freeze_count()}


TICK_S = 0.005
"""A watcher's sleep (LateWakes): it wakes late by the time what it watches was held elsewhere."""
IDLE_TICK_S = 0.25
"""LoopLag's sleep while nothing it watches for is under way (`busy`): a server idle for hours should not wake
200 times a second to time a loop that holds no stream's audio."""


class LateWakes:
    """The wakes of a watcher that sleeps TICK_S again and again: the longest lateness, and each wake at least
    `least_ms` late, counted and kept as (started at, on `clock`; ms)."""

    def __init__(self, least_ms: float = 20.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.least_ms, self.clock = least_ms, clock
        self.longest_ms = 0.0
        self.late = 0
        """Wakes at least `least_ms` late."""
        self.recent: deque[tuple[float, float]] = deque(maxlen=RECENT)

    def note(self, start: float, woke: float) -> None:
        """One wake: at `woke` for a sleep begun at `start`."""
        ms = (woke - start - TICK_S) * 1e3
        self.longest_ms = max(self.longest_ms, ms)
        if ms >= self.least_ms:
            self.late += 1
            self.recent.append((start, ms))

    def status(self) -> dict[str, Any]:
        return {"late": self.late, "longest_ms": round(self.longest_ms, 1)}


class LoopLag(LateWakes):
    """How late an event loop answers: a task on it is the watcher. A late wake is the loop held by one callback (a
    blocking call on it, a long computation) or the interpreter held by another thread; either stops every stream's
    audio on that loop from going out. With `busy`, it times the loop only while that says streams are live, and
    otherwise looks again every IDLE_TICK_S."""

    def __init__(self, least_ms: float = 20.0, clock: Callable[[], float] = time.perf_counter,
                 busy: Callable[[], bool] | None = None) -> None:
        super().__init__(least_ms, clock)
        self.busy = busy
        self._task: Any = None

    def start(self) -> "LoopLag":
        import asyncio

        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        import asyncio

        while True:
            if self.busy is not None and not self.busy():
                await asyncio.sleep(IDLE_TICK_S)
                continue
            start = self.clock()
            await asyncio.sleep(TICK_S)
            self.note(start, self.clock())


class HeldInterpreter(LateWakes):
    """How long other threads held the interpreter: a thread of its own is the watcher (time.sleep lets the GIL go,
    and the thread wakes only once it has it back)."""

    def __init__(self, least_ms: float = 20.0, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(least_ms, clock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="held-interpreter", daemon=True)

    def start(self) -> "HeldInterpreter":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            start = self.clock()
            time.sleep(TICK_S)
            self.note(start, self.clock())
