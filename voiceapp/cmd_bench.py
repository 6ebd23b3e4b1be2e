"""Provides `voicectl bench`: our pipeline at 1..128 concurrent streams, export throughput, decoder precision and
speed, and the upstream reference pipeline, in one run on one checkpoint; a table on stdout, JSON with --json.

`voicectl bench --startup` measures instead what users wait for before a warm engine exists: fresh processes
launched as a user runs them, each phase timed (voiceapp.startup_bench, voiceapp.startup_cases)."""
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
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from engine.bench import Variant
from engine.config import DECODER_AUTOTUNE
from engine.windowing import WindowSchedule


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure TTFA, RTF, concurrency, export speed and the reference pipeline")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--synthetic", choices=["tiny", "full"],
                     help="build a random-weight checkpoint of this size in a temporary folder and bench it")
    src.add_argument("--model", metavar="DIR",
                     help="checkpoint directory (default: $VOICEAPP_MODEL, then the HF cache)")
    p.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    p.add_argument("--tokens", type=int, default=250, help="semantic tokens per sentence, fixed (default 250 = 5 s)")
    p.add_argument("--sentences", type=int, default=2, help="sentences per stream (default 2)")
    p.add_argument("--levels", default="1,8,32,64,128", help="concurrent stream counts (default 1,8,32,64,128)")
    p.add_argument("--rounds-1", type=int, default=8, help="sequential runs at 1 stream (default 8)")
    p.add_argument("--export-sentences", type=int,
                   help=f"sentences in the export run, a fresh `voicectl export` process (default "
                        f"{EXPORT_SENTENCES}, {STARTUP_EXPORT_SENTENCES} with --startup; 0: skip)")
    p.add_argument("--no-reference", action="store_true", help="skip the spark_tts_lib reference pipeline")
    p.add_argument("--reference-tokens", type=int, help="tokens for the reference run (default: --tokens)")
    p.add_argument("--no-decoder-checks", action="store_true", help="skip decoder precision/speed (GPU only)")
    p.add_argument("--decoder-only", action="store_true",
                   help="only the decoder precision/seam/speed checks (GPU only; no LLM, no reference)")
    p.add_argument("--backend", choices=["auto", "torch", "vllm", "fake"], default="auto",
                   help="fake: the CPU fake engine (engine.fakes; --load only, no checkpoint)")
    p.add_argument("--decoder-dtype", choices=["auto", "fp32", "bf16"], default="auto")
    p.add_argument("--decoder-autotune", choices=DECODER_AUTOTUNE, default="all",
                   help="GPU decoder graphs captured with cuDNN's timed algorithms (default all, as `voicectl "
                        "serve` does; in-process front ends use none)")
    p.add_argument("--first-new", type=int, help="WindowSchedule.first_new (default: the schedule's, 4)")
    p.add_argument("--first-right", type=int, help="WindowSchedule.first_right (default: right = 16)")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.add_argument("--no-variants", action="store_true",
                   help="skip the TTFA runs with other first-window schedules")
    p.add_argument("--variants", metavar="NAMES", help=f"only these variants (comma-separated: {', '.join(VARIANTS)})")
    add_startup_args(p)
    add_read_args(p)
    add_load_args(p)
    p.add_argument("--export-check", action="store_true",
                   help="instead: fresh `voicectl export` processes of one generated book (clean; other --jobs, "
                        "killed and resumed; another order) compared byte for byte, with their speed end to end "
                        f"(--export-sentences, default {EXPORT_CHECK_SENTENCES}: a text read in about an hour)")
    p.set_defaults(run=run)


def add_startup_args(p: argparse.ArgumentParser) -> None:
    from voiceapp.startup_bench import CASES

    g = p.add_argument_group("start-up (--startup)")
    g.add_argument("--startup", action="store_true",
                   help="measure start-up instead: fresh voicectl processes (say in-process and through a "
                        "background server, serve, the TUI, export), each from launch to first audio; none of "
                        "the warm benchmark runs")
    g.add_argument("--repeats", type=int, help=f"runs per case (default {STARTUP_REPEATS}; the median counts)")
    g.add_argument("--cases", metavar="LIST", help=f"only these cases (comma-separated: {', '.join(CASES)})")
    g.add_argument("--warm-json", metavar="PATH",
                   help="a `voicectl bench --json` file whose warm figures (TTFA, streams) the report carries")
    g.add_argument("--timeout", type=float, metavar="SECONDS",
                   help=f"longest any one process may take (default {STARTUP_TIMEOUT_S:g})")


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


def add_read_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reading (--read)")
    g.add_argument("--read", action="store_true",
                   help="instead: a minute's reading spoken by a fresh `voicectl say` process for each --weights, "
                        "through the speakers with a ring it cannot fill, so RTF is the engine's own while it plays")
    g.add_argument("--text", metavar="FILE", help="read this UTF-8 text instead of the built-in five sentences")
    g.add_argument("--weights", metavar="LIST", default="auto",
                   help="comma-separated --quantize values, one run each, in order (default auto; e.g. int8,int4,none: "
                        "each RTF is also given against the first's)")
    g.add_argument("--no-sound", action="store_true", help="write each reading to a WAV file instead of playing it")


EXPORT_SENTENCES = 512
STARTUP_EXPORT_SENTENCES = 40
"""--export-sentences' default: the warm benchmark's, and the start-up benchmark's (long enough that the first
sentence and the whole book are apart)."""
EXPORT_CHECK_SENTENCES = 800
"""--export-check's default book: ~9,000 words, an hour read aloud."""
STARTUP_REPEATS = 3
"""--repeats' default."""
STARTUP_TIMEOUT_S = 900.0
"""--timeout's default: a first run on a fresh machine compiles its kernels."""


def run(args: argparse.Namespace) -> int:
    from engine import bench
    from engine.errors import InputError

    if sum((args.startup, args.export_check, args.read, bool(args.load))) > 1:
        raise InputError("--startup, --export-check, --read and --load exclude each other")
    given = [f"--{n.replace('_', '-')}" for n in ("load_seconds", "load_seed", "http", "fake_streams")
             if getattr(args, n) is not None]
    if given and not args.load:
        raise InputError(f"{', '.join(given)}: only with --load")
    if args.backend == "fake" and not args.load:
        raise InputError("--backend fake: only with --load")
    if args.load:
        return run_load(args)
    given = [f"--{n.replace('_', '-')}" for n in ("text", "no_sound") if getattr(args, n)]
    if given and not args.read:
        raise InputError(f"{', '.join(given)}: only with --read")
    if args.read:
        return run_read(args)
    if args.startup:
        return run_startup(args)
    if args.export_check:
        return run_export_check(args)
    given = [f"--{n.replace('_', '-')}" for n in ("repeats", "cases", "warm_json", "timeout") if getattr(args, n)]
    if given:
        raise InputError(f"{', '.join(given)}: only with --startup")
    if args.export_sentences is None:
        args.export_sentences = EXPORT_SENTENCES
    try:
        levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    except ValueError:
        raise InputError(f"--levels: expected comma-separated integers, got {args.levels!r}") from None
    if not levels or min(levels) < 1:
        raise InputError("--levels: need at least one stream count >= 1")
    variants = _variants(args)  # a bad name fails before minutes of checkpoint writing and model loading
    schedule = None  # the model family's
    if args.first_new or args.first_right:
        from dataclasses import replace

        from engine.families import family_of

        schedule = replace(family_of(args.model).schedule, **({"first_new": args.first_new} if args.first_new else {}),
                           **({"first_right": args.first_right} if args.first_right else {}))
    log = _log
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, log) as (model, checkpoint):
        result = _bench(args, model, checkpoint, levels, schedule, variants, log)
    result["date"] = started.date().isoformat()
    result["command"] = command_line()
    if "pipeline" in result:
        result["headline"] = bench.headline(result)
        # the headline's keys also at the top level: what readers of latest.json look up (issue 4's list)
        result.update({key: value for key, value in result["headline"].items() if key not in result})
        print()
        print(bench.format_table(result))
        print()
        for key, value in result["headline"].items():
            print(f"{key}: {value}")
    if args.json:
        write_json(Path(args.json), result)
    return 0


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


def command_line() -> str:
    """This run's command line, as `voicectl bench ...`."""
    argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "bench" else sys.argv[1:]
    return " ".join(["voicectl", "bench", *(shlex.quote(a) for a in argv)])


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}")


# ---- --startup ---------------------------------------------------------------------------------------------

def run_startup(args: argparse.Namespace) -> int:
    """Run the start-up cases on fresh processes; the table on stdout, the report to --json. Exits non-zero
    (one line naming them) when a case failed; the others' figures are still reported."""
    from voiceapp import startup_bench
    from voiceapp.startup_cases import Bench, CaseFailed, describe_device, git_commit, run_cases

    cases, repeats, timeout_s, sentences = startup_options(args)
    warm = read_warm_json(args.warm_json) if args.warm_json else None
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, _log) as (model, checkpoint), \
            tempfile.TemporaryDirectory(prefix="voiceapp-startup-") as work:
        device, gpu = describe_device(timeout_s)
        outcomes = run_cases(Bench(model, Path(work), repeats, timeout_s, sentences, _log), cases)
    meta = startup_bench.ReportMeta(device=device, date=started.date().isoformat(), git=git_commit(),
                                    command=command_line(), model=checkpoint, repeats=repeats, gpu=gpu)
    result = startup_bench.report(meta, outcomes, warm)
    print(startup_bench.format_table(result))
    if args.json:
        write_json(Path(args.json), result)
    if result["errors"]:
        raise CaseFailed(f"{len(result['errors'])} of {len(cases)} start-up cases failed: "
                         f"{', '.join(result['errors'])} (their errors are listed above)")
    return 0


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
    result = {"device": device, "target": where, "date": started.date().isoformat(), "command": command_line(),
              "options": {"seconds": seconds, "seed": seed, "preroll_s": load.PREROLL_S, "backend": args.backend,
                          "fake_streams": args.fake_streams},
              "rates": [load.rate_json(r) for r in results]}
    print(load.format_table(results))
    if args.json:
        write_json(Path(args.json), result)
    return 0


async def _load_run(target, sample_rate: int, plans) -> list:
    """One untimed request (first-use costs stay out), then the rates."""
    from engine.bench.load import SENTENCES, Arrival, StreamLog
    from voiceapp.load_bench import run_rates

    warm = StreamLog(time.perf_counter())
    await target(Arrival(0.0, SENTENCES[0]), warm)
    if warm.error:
        from engine.errors import GenerationError

        raise GenerationError(f"the first request failed: {warm.error}")
    return await run_rates(target, sample_rate, plans, log=_log)


def _load_in_process(args: argparse.Namespace, plans) -> tuple[str, str, list]:
    """(device, target, results) of the rates on an engine built in this process."""
    from engine.factory import EngineConfig, build_synthesizer
    from voiceapp.load_bench import engine_target

    async def go(synth, voice: str) -> list:
        try:
            return await _load_run(engine_target(synth, voice), synth.sample_rate, plans)
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

    with checkpoint_for(args, _log) as (model, _), tempfile.TemporaryDirectory(prefix="voiceapp-load-") as tmp:
        family = family_of(model)
        if family.cached_voices:
            voice, voices = bench.write_voice(Path(tmp) / "voices"), VoiceBank([Path(tmp) / "voices"])
        else:
            voices = family.voices()
            voice = voices.default
        synth = build_synthesizer(EngineConfig(model=str(model), backend=args.backend, voices=voices,
                                               cache_dir=tmp, threads=args.threads,
                                               decoder_dtype=args.decoder_dtype,
                                               decoder_autotune=args.decoder_autotune, lane_rows=None))
        return bench.device_name(), "in-process", asyncio.run(go(synth, voice))


def run_read(args: argparse.Namespace) -> int:
    """Read the text once for each --weights; the table on stdout, the report to --json. Exits non-zero (one line)
    when a run failed; the others' figures are still reported."""
    from engine.errors import GenerationError
    from voiceapp import read_bench
    from voiceapp.startup_cases import describe_device

    weights, text = read_options(args)
    if not args.no_sound:
        check_speakers()
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, _log) as (model, checkpoint):
        device, _ = describe_device(STARTUP_TIMEOUT_S)
        runs = read_bench.read_runs(model, weights, text, sound=not args.no_sound, backend=args.backend,
                                    threads=args.threads, log=_log)
    meta = {"device": device, "date": started.date().isoformat(), "command": command_line(), "model": checkpoint,
            "text_chars": len(text), "ring_s": read_bench.ring_s(text), "sound": not args.no_sound}
    result = read_bench.report(runs, meta)
    print(read_bench.format_table(result))
    if args.json:
        write_json(Path(args.json), result)
    if result["errors"]:
        raise GenerationError(f"{len(result['errors'])} of {len(runs)} readings failed: {'; '.join(result['errors'])}")
    return 0


def check_speakers() -> None:
    """Fail before any model loads when there is no output device to read through (suggesting --no-sound)."""
    from engine.backends.sounddevice_sink import FILE_HINT, import_sounddevice, pick_device_rate
    from engine.errors import AudioDeviceError

    try:
        pick_device_rate(import_sounddevice(), None, 16000)
    except AudioDeviceError as err:
        reason = str(err).removesuffix(f"; {FILE_HINT}")
        raise AudioDeviceError(f"{reason}; --no-sound reads into WAV files instead") from None


def read_options(args: argparse.Namespace) -> tuple[tuple[str, ...], str]:
    """(weights, text) from --weights and --text; a bad one is a one-line InputError."""
    from engine.config import QUANTIZE
    from engine.errors import InputError
    from voiceapp import read_bench
    from voiceapp.common import decode_text, read_input_bytes, require_speakable

    weights = tuple(w.strip() for w in args.weights.split(",") if w.strip())
    unknown = [w for w in weights if w not in ("auto", *QUANTIZE)]
    if not weights or unknown or len(set(weights)) < len(weights):
        raise InputError(f"--weights: expected distinct values of auto, {', '.join(QUANTIZE)}; got {args.weights!r}")
    if args.backend == "vllm" and weights != ("auto",):
        raise InputError("--weights: the CPU engine's choice; vLLM runs its own weights")
    text = read_bench.READ_TEXT
    if args.text:
        too_long = InputError(f"--text {args.text}: more than {read_bench.MAX_TEXT_CHARS} characters")
        data = read_input_bytes(args.text, 4 * read_bench.MAX_TEXT_CHARS)  # UTF-8: at most 4 bytes a character
        if data is None:
            raise too_long
        text = decode_text(data, f"--text {args.text}")
        if len(text) > read_bench.MAX_TEXT_CHARS:
            raise too_long
    require_speakable(text, f"--text {args.text}" if args.text else "the text")
    return weights, text.strip()


def run_export_check(args: argparse.Namespace) -> int:
    """voiceapp.export_check on fresh processes; the summary on stdout, the report to --json. Exits non-zero when
    the exports differ."""
    from engine.errors import InputError
    from voiceapp.export_check import export_check
    from voiceapp.startup_cases import Bench, CaseFailed, describe_device, git_commit

    sentences = EXPORT_CHECK_SENTENCES if args.export_sentences is None else args.export_sentences
    timeout_s = STARTUP_TIMEOUT_S if args.timeout is None else args.timeout
    if sentences < 4 or timeout_s <= 0:
        raise InputError("--export-sentences must be at least 4 and --timeout above 0 with --export-check")
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, _log) as (model, checkpoint), \
            tempfile.TemporaryDirectory(prefix="voiceapp-export-check-") as work:
        device, _ = describe_device(timeout_s)
        result = export_check(Bench(model, Path(work), 1, timeout_s, sentences, _log), Path(work) / "book.txt")
    result = {"device": device, "date": started.date().isoformat(), "git": git_commit(),
              "command": command_line(), "model": checkpoint, **result}
    print(f"{device}: {result['processes_compared']} processes, identical: {result['resume_identical']}; "
          f"{result['audio_s']:.0f} s of audio, {result['render_xrt']:.0f}x rendering, {result['e2e_xrt']:.0f}x "
          f"end to end ({result['e2e_s']:.1f} s from launch), first sentence after "
          f"{result['export_first_sentence_s']:.1f} s")
    if args.json:
        write_json(Path(args.json), result)
    if not result["resume_identical"]:
        raise CaseFailed("the exports differ: " + ", ".join(n for n, c in result["comparisons"].items()
                                                            if not c["identical"]))
    return 0


def startup_options(args: argparse.Namespace) -> tuple[tuple[str, ...], int, float, int]:
    """(cases, repeats, timeout, export sentences) from the flags; a bad one is a one-line InputError."""
    from engine.errors import InputError
    from voiceapp.startup_bench import parse_cases

    try:
        cases = parse_cases(args.cases)
    except ValueError as err:
        raise InputError(str(err)) from None
    repeats = STARTUP_REPEATS if args.repeats is None else args.repeats
    timeout_s = STARTUP_TIMEOUT_S if args.timeout is None else args.timeout
    sentences = STARTUP_EXPORT_SENTENCES if args.export_sentences is None else args.export_sentences
    if repeats < 1 or timeout_s <= 0 or sentences < 1:
        raise InputError("--repeats and --export-sentences must be at least 1 and --timeout above 0 with --startup "
                         "(leave a case out with --cases)")
    return cases, repeats, timeout_s, sentences


def read_warm_json(path: str) -> dict:
    """A warm bench report (`voicectl bench --json`), read before the long run so a bad path fails at once."""
    from engine.errors import InputError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"--warm-json {path}: {err.strerror or err}") from None
    except ValueError:
        raise InputError(f"--warm-json {path}: not JSON") from None
    if not isinstance(data, dict):
        raise InputError(f"--warm-json {path}: not a `voicectl bench --json` report")
    return data


def _bench(args, model: Path, checkpoint: str, levels, schedule, variants: dict, log) -> dict:
    from engine import bench
    from engine.families import detect

    family = detect(model)
    schedule = schedule or family.schedule
    result: dict = {"device": bench.device_name(), "checkpoint": checkpoint, "family": family.name,
                    "options": {"tokens_per_sentence": args.tokens, "sentences_per_stream": args.sentences,
                                "levels": list(levels), "preroll_s": 0.2, "schedule": asdict(schedule),
                                "decoder_autotune": args.decoder_autotune}}
    cuda = _cuda()
    if cuda and not args.no_decoder_checks and (model / "BiCodec").is_dir():  # the BiCodec decoder's checks
        from engine.batching import lengths_for

        log("decoder precision and seams (GPU fp32/bf16 vs CPU fp32)")
        schedules = {"default": WindowSchedule(), "first_new4": WindowSchedule(first_new=4),
                     "first_new2": WindowSchedule(first_new=2),
                     "first_right12": WindowSchedule(first_right=12),
                     "first_right8": WindowSchedule(first_right=8)}
        result["decoder_accuracy"] = _guard(lambda: bench.decoder_accuracy(model / "BiCodec", schedules), log)
        log(f"  {result['decoder_accuracy']}")
        log("decoder speed (eager vs CUDA graph)")
        result["decoder_speed"] = _guard(lambda: bench.decoder_speed(model / "BiCodec", lengths_for(schedule)), log)
        for row in result["decoder_speed"] if isinstance(result["decoder_speed"], list) else []:
            log(f"  {row}")
        log("decoder cuDNN algorithms (default: batch 1 autotuned, vs fixed everywhere; fp32 graphs)")
        result["decoder_algorithms"] = _guard(
            lambda: bench.decoder_algorithms(model / "BiCodec", lengths_for(schedule)), log)
        for row in result["decoder_algorithms"] if isinstance(result["decoder_algorithms"], list) else []:
            log(f"  {row}")
        log("decoder Snake activation (eager ops vs fused Triton kernel, fp32 graphs, fixed algorithms)")
        result["decoder_snake"] = _guard(lambda: bench.decoder_snake(model / "BiCodec", lengths_for(schedule)), log)
        for row in (result["decoder_snake"].get("rows") or []):
            log(f"  {row}")
        log(f"  fused vs eager: {result['decoder_snake'].get('db_fused_vs_eager')} dB")
    if args.decoder_only:
        if not cuda:
            from engine.errors import InputError

            raise InputError("--decoder-only needs a CUDA GPU")
        return result
    opts = bench.BenchOptions(model=model, tokens=args.tokens, sentences=args.sentences, levels=levels,
                              rounds_1=args.rounds_1, backend=args.backend,
                              decoder_dtype=args.decoder_dtype, decoder_autotune=args.decoder_autotune,
                              schedule=schedule, threads=args.threads,
                              variants=variants)
    log(f"pipeline ({args.tokens} tokens x {args.sentences} sentences per stream)")
    result["pipeline"] = asyncio.run(bench.run_pipeline_bench(opts, log))
    if args.export_sentences:
        from voiceapp.export_check import export_speed

        log(f"export: a fresh `voicectl export` of {args.export_sentences} sentences")
        exp = _guard(lambda: export_speed(model, args.export_sentences, STARTUP_TIMEOUT_S, log), log)
        result["pipeline"]["export"] = exp
    if not args.no_reference:
        log("reference pipeline (spark_tts_lib SparkTTS.inference)")
        result["reference"] = _guard(lambda: bench.reference_pipeline(
            model, args.reference_tokens or args.tokens, bench.BENCH_GLOBALS, runs=REFERENCE_RUNS,
            device="cuda" if cuda else "cpu"), log)
        log(f"  {result['reference']}")
    return result


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
            "burst4": (Variant(burst=4), (1, 8))}
"""Other configurations on the same engine: a 2-code first window (2 tokens fewer before first audio, same
seams) at 1 stream; every stream on vLLM (the graph lane off) at 1 and 32 streams, and the default again after
it (lane_again: whether a difference is the lane's or the order of runs in one process); other busy first windows than
the default 16 + 32 at 128 streams (24 + 48 underran on every stream: docs/lab/run-log.md); the interpreter switching
threads every 0.2 ms instead of 5 (the lane's worker waits less for the GIL after each launch); bursts of 4 decode
steps per read-back instead of 2 while the lane runs up to 8 streams."""
DEFAULT_VARIANTS = ("first_new2", "no_lane", "busy8_24", "busy16_16")
"""What a plain `voicectl bench` runs (not busy24_24, which underran on every stream: docs/lab/run-log.md)."""


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


def _guard(fn, log) -> dict:
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


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m voiceapp.cmd_bench ...`: the same as `voicectl bench ...` (its option checks and one-line errors
    included), without loading the other commands."""
    from voiceapp.cli import main as voicectl

    return voicectl(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
