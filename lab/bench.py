"""The lab's warm benchmark: `voicectl bench`'s pipeline at 1..128 concurrent streams plus what only an experiment
needs: the GPU decoder's precision, seams, speed, cuDNN algorithms and Snake kernel; other configurations on the
same engine (VARIANTS: first windows, the graph lane off, switch interval, bursts); a fresh `voicectl export`'s
speed; and the upstream reference pipeline. A table on stdout, JSON with --json (docs/benchmarks/latest.json's
keys). Run from the repository root:

    python -m lab.bench --synthetic full --backend vllm --json $OUT/bench.json
    python -m lab.bench --synthetic full --decoder-only --json $OUT/decoder.json
"""
from __future__ import annotations

import argparse
import datetime
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from engine.bench import Variant
from engine.config import DECODER_AUTOTUNE
from engine.families.orpheus import SCHEDULE as ORPHEUS
from engine.windowing import WindowSchedule
from lab import lab_cli
from voiceapp.cmd_bench import (checkpoint_for, command_line, finish, log, parse_levels, report_head, run_pipeline,
                                write_json)

PROG = "python -m lab.bench"


def build_parser() -> argparse.ArgumentParser:
    p = lab_cli.parser(PROG, "voicectl bench's pipeline with the decoder checks, variants, export speed and the "
                             "upstream reference pipeline")
    p.add_argument("--tokens", type=int, default=250, help="semantic tokens per sentence, fixed (default 250 = 5 s)")
    p.add_argument("--sentences", type=int, default=2, help="sentences per stream (default 2)")
    p.add_argument("--levels", default="1,8,32,64,128", help="concurrent stream counts (default 1,8,32,64,128)")
    p.add_argument("--rounds-1", type=int, default=8, help="sequential runs at 1 stream (default 8)")
    p.add_argument("--export-sentences", type=int, default=EXPORT_SENTENCES,
                   help=f"sentences in the export run, a fresh `voicectl export` process (default "
                        f"{EXPORT_SENTENCES}; 0: skip)")
    p.add_argument("--no-reference", action="store_true", help="skip the spark_tts_lib reference pipeline")
    p.add_argument("--reference-tokens", type=int, help="tokens for the reference run (default: --tokens)")
    p.add_argument("--no-decoder-checks", action="store_true", help="skip decoder precision/speed (GPU only)")
    p.add_argument("--decoder-only", action="store_true",
                   help="only the decoder precision/seam/speed checks (GPU only; no LLM, no reference)")
    p.add_argument("--backend", choices=["auto", "torch", "vllm"], default="auto")
    p.add_argument("--decoder-dtype", choices=["auto", "fp32", "fp16", "bf16"], default="auto")
    p.add_argument("--decoder-autotune", choices=DECODER_AUTOTUNE, default="all",
                   help="GPU decoder graphs captured with cuDNN's timed algorithms (default all, as `voicectl "
                        "serve` does; in-process front ends use none)")
    p.add_argument("--first-new", type=int, help="WindowSchedule.first_new (default: the schedule's, 4)")
    p.add_argument("--first-right", type=int, help="WindowSchedule.first_right (default: right = 16)")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.add_argument("--no-variants", action="store_true",
                   help="skip the TTFA runs with other first-window schedules")
    p.add_argument("--variants", metavar="NAMES", help=f"only these variants (comma-separated: {', '.join(VARIANTS)})")
    p.add_argument("--lane-trace", metavar="PATH", help="write the graph lane's timeline to PATH (lab/lane_trace.py)")
    return p


EXPORT_SENTENCES = 512
"""--export-sentences' default."""
STARTUP_TIMEOUT_S = 900.0
"""The export run's longest wait: a first run on a fresh machine compiles its kernels."""
REFERENCE_RUNS = 3
"""Timed runs of the reference (the median counts): its batch-1 `generate()` is bound by the host's Python, so one
run's RTF varies widely across machines and runs (docs/lab/run-log.md)."""

VARIANTS = {"first_new2": (Variant(WindowSchedule(first_new=2)), (1,)),
            "no_lane": (Variant(lane=False), (1, 32)),
            "lane_again": (Variant(), (1, 32)),
            "busy8_24": (Variant(WindowSchedule(busy_first_new=8, busy_new=24)), (128,)),
            "busy16_16": (Variant(WindowSchedule(busy_first_new=16, busy_new=16)), (128,)),
            "busy24_24": (Variant(WindowSchedule(busy_first_new=24, busy_new=24)), (128,)),
            "switch200us": (Variant(switch_s=0.0002), (1, 8, 32, 128)),
            "burst4": (Variant(burst=4), (1, 8)),
            "orpheus_again": (Variant(ORPHEUS), (216,)),
            "orpheus_busy_growth_1_2": (Variant(replace(ORPHEUS, busy_growth=1.2)), (216,)),
            "orpheus_busy_growth_1_15": (Variant(replace(ORPHEUS, busy_growth=1.15)), (216,))}
"""Other configurations on the same engine: a 2-code first window (2 tokens fewer before first audio, same
seams) at 1 stream; every stream on vLLM (the graph lane off) at 1 and 32 streams, and the default again after
it (lane_again: whether a difference is the lane's or the order of runs in one process); other busy first windows than
the default 16 + 32 at 128 streams (24 + 48 underran on every stream: docs/lab/run-log.md); the interpreter switching
threads every 0.2 ms instead of 5 (the lane's worker waits less for the GIL after each launch); bursts of 4 decode
steps per read-back instead of 2 while the lane runs up to 8 streams; for an Orpheus checkpoint, its crowd of 216 again
on its own schedule and on busy windows growing by 1.2 or 1.15 instead of 1.25 (its crowds' streams get their tokens
at about 1.2-1.25x real time, where a window growing by more than that runs dry after a few chunks)."""
DEFAULT_VARIANTS = ("first_new2", "no_lane", "busy8_24", "busy16_16")
"""What a plain run runs (not busy24_24, which underran on every stream: docs/lab/run-log.md)."""


def run(args: argparse.Namespace) -> int:
    from engine import bench

    levels = parse_levels(args.levels)
    variants = _variants(args)
    if args.lane_trace:
        from lab.lane_trace import install

        install(args.lane_trace)  # a bad name fails before minutes of checkpoint writing and model loading
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, log) as (model, checkpoint):
        opts = bench.BenchOptions(model=model, tokens=args.tokens, sentences=args.sentences, levels=levels,
                                  rounds_1=args.rounds_1, backend=args.backend, decoder_dtype=args.decoder_dtype,
                                  decoder_autotune=args.decoder_autotune, schedule=_schedule(args, model),
                                  threads=args.threads, variants=variants)
        result = _bench(args, opts, checkpoint)
    finish(result, started, command_line(PROG))
    if args.json:
        write_json(Path(args.json), result)
    return 0


def _schedule(args: argparse.Namespace, model: Path) -> WindowSchedule | None:
    """--first-new and --first-right over the model family's schedule; None (the family's) without them."""
    if not (args.first_new or args.first_right):
        return None
    from dataclasses import replace

    from engine.families import family_of

    return replace(family_of(model).schedule, **({"first_new": args.first_new} if args.first_new else {}),
                   **({"first_right": args.first_right} if args.first_right else {}))


def _bench(args: argparse.Namespace, opts, checkpoint: str) -> dict:
    from engine import bench

    model = opts.model
    result = report_head(opts, checkpoint)
    cuda = _cuda()
    if cuda and not args.no_decoder_checks and (model / "BiCodec").is_dir():  # the BiCodec decoder's checks
        from engine.families import detect

        _decoder_checks(result, model / "BiCodec", opts.schedule or detect(model).schedule)
    if args.decoder_only:
        if not cuda:
            from engine.errors import InputError

            raise InputError("--decoder-only needs a CUDA GPU")
        return result
    result["pipeline"] = run_pipeline(opts, log)
    if args.export_sentences:
        from lab.export_check import export_speed

        if cuda:  # the streams' engine is closed, but torch's allocator still holds its memory: the export needs it
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
        log(f"export: a fresh `voicectl export` of {args.export_sentences} sentences")
        result["pipeline"]["export"] = _guard(lambda: export_speed(model, args.export_sentences, STARTUP_TIMEOUT_S,
                                                                   log))
    if not args.no_reference:
        log("reference pipeline (spark_tts_lib SparkTTS.inference)")
        result["reference"] = _guard(lambda: bench.reference_pipeline(
            model, args.reference_tokens or args.tokens, bench.BENCH_GLOBALS, runs=REFERENCE_RUNS,
            device="cuda" if cuda else "cpu"))
        log(f"  {result['reference']}")
    return result


def _decoder_checks(result: dict, decoder: Path, schedule: WindowSchedule) -> None:
    """The GPU decoder's precision and seams, speed, cuDNN algorithms and Snake kernel, into `result`."""
    from engine import bench
    from engine.batching import lengths_for

    log("decoder precision and seams (GPU fp32/bf16 vs CPU fp32)")
    schedules = {"default": WindowSchedule(), "first_new4": WindowSchedule(first_new=4),
                 "first_new2": WindowSchedule(first_new=2),
                 "first_right12": WindowSchedule(first_right=12),
                 "first_right8": WindowSchedule(first_right=8)}
    result["decoder_accuracy"] = _guard(lambda: bench.decoder_accuracy(decoder, schedules))
    log(f"  {result['decoder_accuracy']}")
    log("decoder speed (eager vs CUDA graph)")
    result["decoder_speed"] = _guard(lambda: bench.decoder_speed(decoder, lengths_for(schedule)))
    for row in result["decoder_speed"] if isinstance(result["decoder_speed"], list) else []:
        log(f"  {row}")
    log("decoder cuDNN algorithms (default: batch 1 autotuned, vs fixed everywhere; fp32 graphs)")
    result["decoder_algorithms"] = _guard(lambda: bench.decoder_algorithms(decoder, lengths_for(schedule)))
    for row in result["decoder_algorithms"] if isinstance(result["decoder_algorithms"], list) else []:
        log(f"  {row}")
    log("decoder Snake activation (eager ops vs fused Triton kernel, fp32 graphs, fixed algorithms)")
    result["decoder_snake"] = _guard(lambda: bench.decoder_snake(decoder, lengths_for(schedule)))
    for row in (result["decoder_snake"].get("rows") or []):
        log(f"  {row}")
    log(f"  fused vs eager: {result['decoder_snake'].get('db_fused_vs_eager')} dB")


def _variants(args: argparse.Namespace) -> dict:
    if args.no_variants:
        return {}
    if not args.variants:
        return {n: VARIANTS[n] for n in DEFAULT_VARIANTS}
    from engine.errors import InputError

    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise InputError(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    return {n: VARIANTS[n] for n in names}


def _guard(fn) -> dict:
    """Run one optional part; a failure is recorded (and printed), not fatal to the rest of the benchmark."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        log(f"  failed: {type(err).__name__}: {err}")
        log(traceback.format_exc())
        return {"error": f"{type(err).__name__}: {err}"}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    return lab_cli.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
