"""A timeline of a graph lane's worker (lab only): when each admission, prefill launch, burst of steps, read-back
wait and delivery began and ended, and when each job arrived, from wrappers around those methods.

`timeline(lane)` wraps one GraphLane and returns the list it appends to. `install(path)` does so for the lane of
every engine the bench builds (`python -m lab.bench --lane-trace PATH`) and marks where each level's streams start;
the marks (name, seconds since the first) are written to PATH as JSON at exit.
"""
from __future__ import annotations

import atexit
import json
import time
from pathlib import Path
from typing import Any

MAX_MARKS = 400_000
"""Marks kept at most (a long bench makes millions): the first ones, where a crowd starts."""


def timeline(lane: Any, marks: list | None = None) -> list:
    """Wrap the lane's steps to record (name, perf_counter) as each begins and ends into `marks` (a new list when
    None), which is returned."""
    marks = [] if marks is None else marks

    def wrap(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if len(marks) < MAX_MARKS:
                marks.append((label, time.perf_counter()))
            try:
                return inner(*args, **kwargs)
            finally:
                if len(marks) < MAX_MARKS:
                    marks.append((label + " end", time.perf_counter()))
        setattr(owner, name, timed)

    for owner, name in ((lane, "_admit"), (lane, "_burst"), (lane.runner, "prefill"), (lane.runner, "tokens_of"),
                        (lane.scheduler, "deliver"), (lane.runner, "set_allowed"), (lane.scheduler, "add")):
        wrap(owner, name, name)
    return marks


def install(path: str) -> None:
    """Trace the lane of each engine lab.bench builds, and mark each level's start; write the marks at exit."""
    import engine.bench.levels as levels
    import engine.factory as factory

    marks: list = []
    build, streams = factory.build_synthesizer, levels.run_streams

    def traced_build(*args: Any, **kwargs: Any) -> Any:
        synth = build(*args, **kwargs)
        lane = getattr(synth.generator, "lane", None)
        if lane is not None:
            timeline(lane, marks)
        return synth

    async def traced_streams(synth: Any, gen: Any, n: int, **kwargs: Any) -> Any:
        marks.append((f"level {n} {kwargs.get('label', '')}", time.perf_counter()))
        return await streams(synth, gen, n, **kwargs)

    def write() -> None:
        t0 = marks[0][1] if marks else 0.0
        Path(path).write_text(json.dumps([(name, round((t - t0) * 1e3, 3)) for name, t in marks]))

    factory.build_synthesizer, levels.run_streams = traced_build, traced_streams
    atexit.register(write)
