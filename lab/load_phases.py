"""Where an open-loop request's first audio goes: the engine a tuned `voicectl serve` runs (backend auto: the one
listener's engine, then the crowd's parts tuned in the foreground here), loaded in process at each rate with
`voicectl bench --load`'s arrivals, every request's events recorded and its first audio split into phases:
queue (arrival to the request's start), prefill (to its first token), tokens (to its first window's decode call),
decode (that call, its wait in the batcher included) and hand-off (to the chunk reaching the caller).

    python -m lab.load_phases --model DIR [--rates 10] [--seconds 30] [--seeds 0,1] [--no-tune] [--variants V,...] [--json PATH]
        [--ready-file PATH]

Prints, per rate and seed, the phases at the median request and over the slowest 5%, with the streams in flight
when each of those arrived.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace

from engine.bench.load import SENTENCES, Arrival, schedule
from engine.events import ChunkDecoded, FirstAudio, FirstToken, RequestStarted

PHASES = ("queue", "prefill", "tokens", "decode", "handoff")
VARIANTS = {  # name: (the graph lane's AHEAD, the batcher's first_audio_hold_s, its first_audio_streams)
    "base": (2, 0.0, 0), "first": (2, 0.0, 16), "hold15": (2, 0.015, 16), "hold30": (2, 0.03, 16),
    "ahead1": (1, 0.0, 0), "ahead1_hold30": (1, 0.03, 16), "ahead1_hold30_8": (1, 0.03, 8), "today": (1, 0.03, 16)}
"""`today`: the engine as committed (run 43's choice). A 1 ms switch interval was a variant too (run 44: no gain)."""


def set_variant(synth, name: str) -> None:
    """Switch the running engine to a variant of VARIANTS (module and batcher settings read at each step)."""
    from engine.backends import graph_gen

    ahead, hold, streams = VARIANTS[name]
    graph_gen.AHEAD, synth.batcher.first_audio_hold_s, synth.batcher.first_audio_streams = ahead, hold, streams


def lane_gpu_ms(synth) -> tuple[float, float]:
    """(busy, idle) ms of the graph lanes' streams so far: idle is the stream empty between reads, the host late."""
    from engine.factory import _lanes  # a probe's look inside the engine

    lanes = _lanes(synth.generator)
    return sum(lane.busy_ms for lane in lanes), sum(lane.idle_ms for lane in lanes)


class Recorder:
    """The events of every request, by request id."""

    def __init__(self) -> None:
        self.by_id: dict[str, dict[str, float]] = {}

    def __call__(self, event) -> None:
        rid = getattr(event, "request_id", None)
        if rid is None:
            return
        rec = self.by_id.setdefault(rid, {})
        if isinstance(event, RequestStarted):
            rec.setdefault("started", event.t)
        elif isinstance(event, FirstToken):
            rec.setdefault("first_token", event.t)
        elif isinstance(event, ChunkDecoded) and "decoded" not in rec:
            rec["decode_call"], rec["decoded"], rec["codes"] = event.t - event.decode_s, event.t, event.codes
        elif isinstance(event, FirstAudio):
            rec.setdefault("first_audio", event.t)


async def run_rate(synth, voice: str, rec: Recorder, rate: float, seconds: float, seed: int,
                   variant: str = "base") -> list[dict]:
    """`voicectl bench --load`'s arrivals at `rate` (voiceapp.load_bench `drive`: each sent on time, open loop),
    each request's phases from its events."""
    from engine.config import SamplingOptions, SynthesisRequest
    from voiceapp.load_bench import drive

    rows: list[dict] = []
    live = 0

    async def send(arrival: Arrival, _log) -> None:
        nonlocal live
        rid = f"{variant}-r{rate:g}-{seed}-{len(rows)}"
        row = {"id": rid, "at": time.perf_counter(), "in_flight": live, "words": len(arrival.text.split())}
        rows.append(row)
        live += 1
        try:
            async for _ in synth.synthesize(SynthesisRequest(arrival.text, voice=voice, options=SamplingOptions(),
                                                             request_id=rid)):
                row.setdefault("chunk", time.perf_counter())
        finally:
            live -= 1

    t0 = time.perf_counter()
    await drive(send, schedule(rate, seconds, seed))
    for row in rows:
        ev = rec.by_id.get(row["id"], {})
        try:
            marks = [row["at"], ev["started"], ev["first_token"], ev["decode_call"], ev["decoded"], row["chunk"]]
        except KeyError:
            row["missing"] = True
            continue
        row.update({name: round((b - a) * 1e3, 2) for name, a, b in zip(PHASES, marks, marks[1:])})
        row["first_ms"] = round((row["chunk"] - row["at"]) * 1e3, 2)
        row["codes"] = ev.get("codes")
        row["at"] = round(row["at"] - t0, 3)
        del row["chunk"]
    return [r for r in rows if not r.get("missing")]


def summary(rows: list[dict]) -> dict:
    ranked = sorted(rows, key=lambda r: r["first_ms"])
    tail = ranked[int(len(ranked) * 0.95):] or ranked[-1:]
    mid = ranked[len(ranked) // 2]
    return {"requests": len(rows),
            "first_ms_p50": mid["first_ms"], "first_ms_p95": ranked[int(len(ranked) * 0.95) - 1]["first_ms"],
            "median_request": {k: mid[k] for k in (*PHASES, "in_flight")},
            "phase_p50": {p: round(statistics.median(r[p] for r in rows), 2) for p in PHASES},
            "tail": [{k: r[k] for k in ("at", "first_ms", *PHASES, "in_flight", "words", "codes")} for r in tail]}


async def main_async(args) -> dict:
    from engine.config import SynthesisRequest
    from engine.factory import EngineConfig, build_synthesizer
    from engine.tuning import crowd_tuning

    rec = Recorder()
    base = EngineConfig(model=args.model, backend="auto")
    synth = build_synthesizer(replace(base, one_listener=True), events=rec)
    report: dict = {"tuned": not args.no_tune, "runs": []}
    try:
        voice = synth.voices.default
        async for _ in synth.synthesize(SynthesisRequest(SENTENCES[0], voice=voice)):  # first-use costs
            pass
        if not args.no_tune:
            t = time.perf_counter()
            tuning = crowd_tuning(synth, replace(base, decoder_autotune="all", lane_rows=None), rec)
            await tuning.run()
            report["tuning_s"] = round(time.perf_counter() - t, 1)
            print(f"tuned in {report['tuning_s']} s", file=sys.stderr, flush=True)
        if args.ready_file:  # a profiler started by the harness records the load only
            open(args.ready_file, "w").close()
            await asyncio.sleep(1.0)
        for rate in args.rates:
            for variant in args.variants:
                set_variant(synth, variant)
                held = synth.batcher.held_s
                for seed in args.seeds:
                    busy, idle = lane_gpu_ms(synth)
                    rows = await run_rate(synth, voice, rec, rate, args.seconds, seed, variant)
                    s = summary(rows)
                    busy2, idle2 = lane_gpu_ms(synth)
                    s["lane_busy_ms"], s["lane_idle_ms"] = round(busy2 - busy, 1), round(idle2 - idle, 1)
                    print(f"{variant} {rate:g} req/s seed {seed}: p50 {s['first_ms_p50']} p95 {s['first_ms_p95']} "
                          f"phases p50 {s['phase_p50']}, lane busy/idle {s['lane_busy_ms']}/{s['lane_idle_ms']} ms",
                          file=sys.stderr, flush=True)
                    for r in s["tail"][-3:]:
                        print("   tail", r, file=sys.stderr, flush=True)
                    report["runs"].append({"variant": variant, "rate": rate, "seed": seed, **s, "rows": rows})
                report.setdefault("held_s", {})[f"{variant} {rate:g}"] = round(synth.batcher.held_s - held, 3)
        set_variant(synth, "base")
    finally:
        await synth.close()
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.load_phases", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rates", default="10", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--seeds", default="0,1", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--variants", default="base", type=lambda s: s.split(","),
                   help=f"comma-separated, each run at every rate and seed in turn: {', '.join(VARIANTS)}")
    p.add_argument("--json")
    p.add_argument("--ready-file", help="created once tuned, a second before the load starts")
    args = p.parse_args(argv)
    report = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
