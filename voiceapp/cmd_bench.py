"""Provides `voicectl bench`: does this machine keep up, and how fast? Our pipeline at 1..128 concurrent streams on
one checkpoint (first audio, real-time streams, RTF), a table on stdout, JSON with --json; or, with --load RATES, an
open-loop load test (requests arriving at random) in process or against a running `voicectl serve --http`.

The lab's variants of this benchmark (decoder checks, the reference pipeline, other first windows, start-up cases,
the export check, the minute's reading) are scripts over engine.bench in lab/ (lab/README.md)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="does this machine keep up, and how fast: first audio, real-time streams, RTF")
    add_checkpoint_args(p)
    p.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    p.add_argument("--levels", default="1,8,32,64,128", help="concurrent stream counts (default 1,8,32,64,128)")
    p.add_argument("--tokens", type=int, default=250, help="semantic tokens per sentence, fixed (default 250 = 5 s)")
    p.add_argument("--sentences", type=int, default=2, help="sentences per stream (default 2)")
    p.add_argument("--backend", choices=["auto", "torch", "vllm", "fake"], default="auto",
                   help="fake: the CPU fake engine (engine.fakes; --load only, no checkpoint)")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    add_load_args(p)
    p.set_defaults(run=run)


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """--synthetic or --model: the checkpoint a benchmark runs on (checkpoint_for reads them)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--synthetic", choices=["tiny", "full"],
                     help="build a random-weight checkpoint of this size in a temporary folder and bench it")
    src.add_argument("--model", metavar="DIR",
                     help="checkpoint directory (default: $VOICEAPP_MODEL, then the HF cache)")


def add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load (--load)")
    g.add_argument("--load", metavar="RATES",
                   help="instead: an open-loop load test, requests of one short sentence arriving at random "
                        "(Poisson) at each of these rates in turn (comma-separated, requests a second, e.g. 5,10,20); "
                        "per rate: first audio p50/p95/max, the share of streams a real-time listener heard run dry, "
                        "peak concurrency and refusals (429)")
    g.add_argument("--load-seconds", type=float, metavar="SECONDS",
                   help=f"how long requests are sent at each rate (default {LOAD_SECONDS:g})")
    g.add_argument("--load-seed", type=int, metavar="N", help="the arrivals' and sentences' seed (default 0)")
    g.add_argument("--http", metavar="URL",
                   help="load a running `voicectl serve --http` at this address (http://HOST:PORT) instead of an "
                        "engine in this process; its key from $VOICEAPP_API_KEY")
    g.add_argument("--fake-streams", type=int, metavar="N",
                   help="with --backend fake: a fake engine of fixed throughput whose tokens take turns, fast "
                        "enough for N streams in real time and no more")


LOAD_SECONDS = 30.0
"""--load-seconds' default."""


def run(args: argparse.Namespace) -> int:
    from engine import bench
    from engine.errors import InputError

    given = [f"--{n.replace('_', '-')}" for n in ("load_seconds", "load_seed", "http", "fake_streams")
             if getattr(args, n) is not None]
    if given and not args.load:
        raise InputError(f"{', '.join(given)}: only with --load")
    if args.backend == "fake" and not args.load:
        raise InputError("--backend fake: only with --load")
    if args.load:
        return run_load(args)
    levels = parse_levels(args.levels)
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, log) as (model, checkpoint):
        opts = bench.BenchOptions(model=model, tokens=args.tokens, sentences=args.sentences, levels=levels,
                                  backend=args.backend, threads=args.threads)
        result = report_head(opts, checkpoint)
        result["pipeline"] = run_pipeline(opts, log)
    finish(result, started, command_line("voicectl bench"))
    if args.json:
        write_json(Path(args.json), result)
    return 0


def parse_levels(text: str) -> tuple[int, ...]:
    """--levels' stream counts; a bad list is a one-line InputError."""
    from engine.errors import InputError

    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"--levels: expected comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise InputError("--levels: need at least one stream count >= 1")
    return levels


def report_head(opts, checkpoint: str) -> dict:
    """A pipeline report's first keys: the device, the checkpoint, its family and the run's options (`opts`: an
    engine.bench.BenchOptions)."""
    from dataclasses import asdict

    from engine import bench
    from engine.families import detect

    family = detect(opts.model)
    schedule = opts.schedule or family.schedule
    return {"device": bench.device_name(), "checkpoint": checkpoint, "family": family.name,
            "options": {"tokens_per_sentence": opts.tokens, "sentences_per_stream": opts.sentences,
                        "levels": list(opts.levels), "preroll_s": opts.preroll_s, "schedule": asdict(schedule),
                        "decoder_autotune": opts.decoder_autotune}}


def run_pipeline(opts, log: Callable[[str], None]) -> dict:
    """engine.bench's pipeline run on `opts`: each level's (and variant's) numbers."""
    from engine import bench

    log(f"pipeline ({opts.tokens} tokens x {opts.sentences} sentences per stream)")
    return asyncio.run(bench.run_pipeline_bench(opts, log))


def finish(result: dict, started: datetime.datetime, command: str) -> None:
    """Date and command line into `result`; with a pipeline run, its headline (also at the top level: what readers
    of docs/benchmarks/latest.json look up) and the table printed."""
    from engine import bench

    result["date"] = started.date().isoformat()
    result["command"] = command
    if "pipeline" not in result:
        return
    result["headline"] = bench.headline(result)
    result.update({key: value for key, value in result["headline"].items() if key not in result})
    print()
    print(bench.format_table(result))
    print()
    for key, value in result["headline"].items():
        print(f"{key}: {value}")


@contextlib.contextmanager
def checkpoint_for(args: argparse.Namespace, log) -> Iterator[tuple[Path, str]]:
    """(the checkpoint directory, how the report names it): --synthetic's written to a temporary folder for the
    run, else --model's (or the default one)."""
    if not args.synthetic:
        from engine.model import resolve_model_dir

        model = resolve_model_dir(args.model)
        yield model, str(model)
        return
    from engine.synthetic import write_checkpoint

    with tempfile.TemporaryDirectory(prefix="voiceapp-synthetic-") as tmp:
        t = time.perf_counter()
        model = write_checkpoint(Path(tmp) / args.synthetic, size=args.synthetic, seed=0)
        log(f"wrote synthetic {args.synthetic} checkpoint in {time.perf_counter() - t:.0f} s")
        yield model, f"synthetic {args.synthetic} (random weights, seed 0)"


def command_line(prog: str) -> str:
    """This run's command line, as `prog ARGS...` (`voicectl bench ...`, `python -m lab.startup ...`)."""
    argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "bench" else sys.argv[1:]
    return " ".join([prog, *(shlex.quote(a) for a in argv)])


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def run_load(args: argparse.Namespace) -> int:
    """The open-loop load test (engine.bench.load, driven by voiceapp.load_bench); the table on stdout, the report
    to --json."""
    from engine.bench import load
    from engine.errors import InputError

    try:
        rates = load.parse_rates(args.load)
    except ValueError as err:
        raise InputError(f"--load: {err}") from None
    seconds = LOAD_SECONDS if args.load_seconds is None else args.load_seconds
    seed = 0 if args.load_seed is None else args.load_seed
    crowded = [r for r in rates if r * seconds > load.MAX_STREAMS]
    if crowded:
        raise InputError(f"--load {crowded[0]:g} for {seconds:g} s: more than {load.MAX_STREAMS} requests in one "
                         "rate; shorten --load-seconds")
    if args.fake_streams is not None and args.backend != "fake":
        raise InputError("--fake-streams: only with --backend fake")
    if args.http and (args.synthetic or args.model or args.backend != "auto"):
        raise InputError("--http loads a running server: --synthetic, --model and --backend are its own")
    plans = [(rate, seconds, load.schedule(rate, seconds, seed)) for rate in rates]
    started = datetime.datetime.now().astimezone()
    if args.http:
        from voiceapp.load_bench import PCM_RATE, HttpTarget

        target = HttpTarget(args.http)
        device, where = f"a server at {args.http}", args.http
        results = asyncio.run(_load_run(target, PCM_RATE, plans))
    else:
        device, where, results = _load_in_process(args, plans)
    result = {"device": device, "target": where, "date": started.date().isoformat(),
              "command": command_line("voicectl bench"),
              "options": {"seconds": seconds, "seed": seed, "preroll_s": load.PREROLL_S, "backend": args.backend,
                          "fake_streams": args.fake_streams},
              "rates": [load.rate_json(r) for r in results]}
    print(load.format_table(results))
    if args.json:
        write_json(Path(args.json), result)
    return 0


async def _load_run(target, sample_rate: int, plans, slow_calls=None) -> list:
    """One untimed request (first-use costs stay out), then the rates."""
    from engine.bench.load import SENTENCES, Arrival, StreamLog
    from voiceapp.load_bench import run_rates

    warm = StreamLog(time.perf_counter())
    await target(Arrival(0.0, SENTENCES[0]), warm)
    if warm.error:
        from engine.errors import GenerationError

        raise GenerationError(f"the first request failed: {warm.error}")
    return await run_rates(target, sample_rate, plans, log=log, slow_calls=slow_calls)


def _load_in_process(args: argparse.Namespace, plans) -> tuple[str, str, list]:
    """(device, target, results) of the rates on an engine built in this process."""
    from engine.factory import EngineConfig, build_synthesizer
    from voiceapp.load_bench import engine_target

    async def go(synth, voice: str) -> list:
        try:
            return await _load_run(engine_target(synth, voice), synth.sample_rate, plans,
                                   slow_calls=lambda: list(synth.batcher.stats.slow))
        finally:
            await synth.close()

    if args.backend == "fake":
        synth = build_synthesizer(EngineConfig(backend="fake"))
        if args.fake_streams is not None:
            from engine.fakes import fixed_throughput
            from engine.tokens import TokenIds

            ids = synth.grammar.token_ids
            assert isinstance(ids, TokenIds)  # the fake engine writes Spark's tokens
            tokens_per_s = synth.sample_rate / synth.decoder.samples_per_code * synth.grammar.tokens_per_code
            synth.swap_generator(fixed_throughput(ids, tokens_per_s, args.fake_streams))
        what = f", {args.fake_streams} streams' throughput" if args.fake_streams is not None else ""
        return f"fake engine (CPU{what})", "in-process", asyncio.run(go(synth, synth.voices.default))
    from engine import bench
    from engine.families import family_of
    from engine.voices import VoiceBank

    with checkpoint_for(args, log) as (model, _), tempfile.TemporaryDirectory(prefix="voiceapp-load-") as tmp:
        family = family_of(model)
        if family.cached_voices:
            voice, voices = bench.write_voice(Path(tmp) / "voices"), VoiceBank([Path(tmp) / "voices"])
        else:
            voices = family.voices()
            voice = voices.default
        synth = build_synthesizer(EngineConfig(model=str(model), backend=args.backend, voices=voices,
                                               cache_dir=tmp, threads=args.threads,
                                               decoder_autotune=bench.BenchOptions.decoder_autotune,
                                               lane_rows=None))
        return bench.device_name(), "in-process", asyncio.run(go(synth, voice))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m voiceapp.cmd_bench ...`: the same as `voicectl bench ...` (its option checks and one-line errors
    included), without loading the other commands."""
    from voiceapp.cli import main as voicectl

    return voicectl(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
