"""Probe: when each chunk of a request arrives from the engine, and how the pacer would play it.

    python -m lab.chunk_trace --model DIR [--quantize int8|int4|none] [--seed 1] [--schedule FIRST,NEW,GROWTH,MAX]
        TEXT... > trace.jsonl
    python -m lab.chunk_trace --replay trace.jsonl

The first form runs each TEXT through one in-process engine (the CPU one where there is no GPU), one after another,
and prints a JSON line per text: its chunks as [seconds since the request, audio seconds, sentence, sentence end,
planned seconds, pause]. The second replays such lines through engine.pacing as `speak` would use it with the
traced engine's pacer (on a CPU: its first sentence probed, its schedule's windows; a release on the clock between
chunks) and prints, for each sentence, when it would start playing and its slack: how long before it is due the
least timely chunk arrives (negative: a gap). Traces from a lent machine can thus be replayed here against pacing
changes.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from engine.bench.playback import paced_sentence
from engine.pacing import Pacer

WINDOWS_S = (0.08, 0.24, 0.48, 0.96, 1.92)
"""The default schedule's windows (engine.factory.windows_s): the replay's pacer plans with these where a trace
does not name its engine's."""


def trace(model: str, quantize: str, seed: int, texts: list[str], schedule: str | None = None) -> None:
    from engine.config import SamplingOptions, SynthesisRequest
    from engine.factory import EngineConfig, build_synthesizer
    from engine.windowing import WindowSchedule

    knobs = dict(zip(("first_new", "new", "growth", "max_new"), map(float, schedule.split(",")))) if schedule else {}
    windows = WindowSchedule(**{k: v if k == "growth" else int(v) for k, v in knobs.items()})
    synth = build_synthesizer(EngineConfig(model=model, quantize=quantize, schedule=windows))

    async def one(text: str) -> list[tuple]:
        t0, rows = time.perf_counter(), []
        async for c in synth.synthesize(SynthesisRequest(text, options=SamplingOptions(seed=seed))):
            rows.append((round(time.perf_counter() - t0, 4), c.seconds, c.sentence_index, c.sentence_end,
                         c.planned_s, c.pause, None if c.made_at is None else round(c.made_at - t0, 4)))
        return rows

    for text in texts:
        print(json.dumps({"text": text, "quantize": quantize, "schedule": schedule, "windows_s": synth.pacer.windows_s,
                          "ahead_windows_s": synth.pacer.ahead_windows_s, "probe_first": synth.pacer.probe_first,
                          "chunks": asyncio.run(one(text))}), flush=True)


def sentences(chunks: list[list]) -> list[tuple[list[tuple[float, float, bool, float | None]], list[float] | None]]:
    """A trace's chunks per sentence, pauses left out: ((time, seconds, end, planned) each, when each was made where
    the sentence was rendered ahead of its turn, else None). Traces before made times were recorded have 6 fields."""
    out, current, made = [], [], []
    for at, seconds, _, end, planned, pause, *rest in chunks:
        if not pause:
            current.append((at, seconds, end, planned))
            made.append(rest[0] if rest else None)
            if end:
                out.append((current, made if made[0] is not None else None))
                current, made = [], []
    return out


def replay_file(path: str) -> None:
    for line in open(path, encoding="utf-8"):
        record = json.loads(line)
        pacer = Pacer(probe_first=record.get("probe_first", True),
                      windows_s=tuple(record.get("windows_s", WINDOWS_S)),
                      ahead_windows_s=tuple(record.get("ahead_windows_s", ())))
        pace = pacer.request()
        made = sum(c[1] for c in record["chunks"] if not c[5])
        print(f"{record.get('quantize', '?')} {record.get('schedule') or ''}: {record['text'][:50]} "
              f"(RTF {record['chunks'][-1][0] / made:.3f})")
        for i, (sentence, made_at) in enumerate(sentences(record["chunks"])):
            start, slack = paced_sentence(pace, sentence, made_at)
            print(f"  sentence {i}: first chunk {sentence[0][0]:6.2f} s, starts {start:6.2f} s, "
                  f"slack {slack:+.2f} s, speed {pacer.speed or 0:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("texts", nargs="*")
    parser.add_argument("--model")
    parser.add_argument("--quantize", default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--schedule", metavar="FIRST,NEW,GROWTH,MAX", help="the streaming windows (WindowSchedule)")
    parser.add_argument("--replay", metavar="TRACE")
    args = parser.parse_args(argv)
    if args.replay:
        replay_file(args.replay)
    elif args.model and args.texts:
        trace(args.model, args.quantize, args.seed, args.texts, args.schedule)
    else:
        parser.error("give --model and TEXT, or --replay TRACE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
