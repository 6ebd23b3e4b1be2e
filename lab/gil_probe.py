"""Probe: what a neighbour in the server's process costs a live request's first audio (issue 42, first audio while
a server tunes): a thread that holds the interpreter (as graph captures op by op do), or Inductor compiling shape
after shape (as the lane step does), its compile workers at the usual priority or at nice 10 (as a server's
background lane build starts them: engine.backends.compile_pool).

    python -m lab.gil_probe --model MODEL --neighbour none|python|compile|compile-nice [--seconds 30] [--json OUT]

One engine in this process (the CPU engine of the checkpoint, as `voicectl serve` builds it), one neighbour per run
(a compile pool's priority is set when it starts, once a process); requests one after another for `--seconds`, each
timed from its start to its first chunk, from the moment the neighbour starts (a compile's imports and pool start
included, as in a server's lane step).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time

from engine.config import EngineConfig, SamplingOptions, SynthesisRequest
from engine.factory import build_synthesizer

TEXT = "The train leaves at seven tonight."
NEIGHBOURS = ("none", "python", "compile", "compile-nice")


def python_bound(stop: threading.Event, work: list[int]) -> None:
    """Dispatch tiny torch ops until `stop`: Python-bound work that rarely lets the interpreter go."""
    import torch

    x = torch.zeros(8)
    while not stop.is_set():
        for _ in range(100):
            x = x + 1
        work[0] += 100


def compiling(stop: threading.Event, work: list[int], nice: int | None) -> None:
    """Inductor compiles one small function for a new shape after another until `stop` (each a compile of its own,
    as the lane's steps are); with `nice`, its worker pool is spawned at that niceness first."""
    import torch

    if nice is not None:
        from engine.backends.compile_pool import start_compile_pool

        start_compile_pool(nice)
    torch._dynamo.config.recompile_limit = 1 << 12
    step = torch.compile(lambda x: (x.sin() * 2 + x.cos()).softmax(-1).sum(-1), dynamic=False)
    width = 8
    while not stop.is_set():
        step(torch.randn(4, width))
        width, work[0] = width + 8, work[0] + 1


async def first_audio_ms(synth, seed: int) -> float:
    req = SynthesisRequest(TEXT, options=SamplingOptions(seed=seed))
    t0 = time.perf_counter()
    stream = synth.synthesize(req)
    try:
        async for _ in stream:
            return (time.perf_counter() - t0) * 1e3
    finally:
        await stream.aclose()
    raise RuntimeError("no audio")


async def condition(synth, neighbour: str, seconds: float) -> dict:
    stop, work = threading.Event(), [0]
    target = {"python": (python_bound, (stop, work)), "compile": (compiling, (stop, work, None)),
              "compile-nice": (compiling, (stop, work, 10))}.get(neighbour)
    thread = threading.Thread(target=target[0], args=target[1], daemon=True) if target else None
    if thread:
        thread.start()
    times, seed, end = [], 0, time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            times.append(await first_audio_ms(synth, seed))
            seed += 1
    finally:
        stop.set()
        if thread:
            thread.join()
    times.sort()
    return {"neighbour": neighbour, "requests": len(times), "first_ms_p50": round(statistics.median(times), 1),
            "first_ms_p95": round(times[min(len(times) - 1, int(0.95 * len(times)))], 1),
            "first_ms_max": round(times[-1], 1), "neighbour_work": work[0], "load": os.getloadavg()[0]}


async def run(args: argparse.Namespace) -> dict:
    synth = build_synthesizer(EngineConfig(model=args.model, backend="torch", device="cpu"))
    try:
        await first_audio_ms(synth, 99)  # first request: lazy set-up, not timed
        return await condition(synth, args.neighbour, args.seconds)
    finally:
        await synth.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--neighbour", choices=NEIGHBOURS, default="python")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "result": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
