"""Probe: how much a thread that holds the interpreter (as a server's tuning does, capturing graphs op by op)
delays a live request's first audio, and how much a shorter thread switch interval gives back (issue 42, first
audio while tuning; `lab/variants.sh tuneswitch` is the same switch on a GPU server).

    python -m lab.gil_probe --model MODEL [--requests 15] [--json OUT]

One engine in this process (the CPU engine of the checkpoint, as `voicectl serve` builds it); requests one after
another, each timed from its start to its first chunk. Three conditions: alone; beside a busy thread at the
interpreter's default switch interval (5 ms); beside it at 0.5 ms. The busy thread dispatches tiny torch ops in a
Python loop, which holds the interpreter almost all the time as a graph capture's Python does.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time

from engine.config import EngineConfig, SamplingOptions, SynthesisRequest
from engine.factory import build_synthesizer

TEXT = "The train leaves at seven tonight."


def busy(stop: threading.Event, ops: list[int]) -> None:
    """Dispatch tiny torch ops until `stop`: Python-bound work that rarely lets the interpreter go."""
    import torch

    x = torch.zeros(8)
    while not stop.is_set():
        for _ in range(100):
            x = x + 1
        ops[0] += 100


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


async def condition(synth, requests: int, hog: bool, switch_s: float) -> dict:
    stop, ops = threading.Event(), [0]
    thread = threading.Thread(target=busy, args=(stop, ops), daemon=True) if hog else None
    default = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    if thread:
        thread.start()
    try:
        times = [await first_audio_ms(synth, seed) for seed in range(requests)]
    finally:
        stop.set()
        if thread:
            thread.join()
        sys.setswitchinterval(default)
    times.sort()
    return {"busy_thread": hog, "switch_interval_ms": switch_s * 1e3, "first_ms_p50": round(statistics.median(times), 1),
            "first_ms_p95": round(times[min(len(times) - 1, int(0.95 * len(times)))], 1),
            "first_ms_max": round(times[-1], 1), "busy_ops": ops[0]}


async def run(args: argparse.Namespace) -> list[dict]:
    synth = build_synthesizer(EngineConfig(model=args.model, backend="torch", device="cpu"))
    try:
        await first_audio_ms(synth, 99)  # first request: lazy set-up, not timed
        out = []
        for hog, switch_s in ((False, 0.005), (True, 0.005), (True, 0.0005), (False, 0.005)):
            out.append(await condition(synth, args.requests, hog, switch_s))
            print(json.dumps(out[-1]), flush=True)
        return out
    finally:
        await synth.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=15)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
