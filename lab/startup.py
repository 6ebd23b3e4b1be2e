"""The start-up benchmark: what users wait for before a warm engine exists. Fresh `voicectl` processes launched as
a user runs them (say in-process and through a background server, serve, the TUI, export), each from launch to
first audio with its phases timed (lab.startup_bench: the pure half; lab.startup_cases: the processes). A table on
stdout, JSON with --json (docs/benchmarks/startup.json's keys); non-zero exit, one line naming them, when a case
failed (the others' figures are still reported). Run from the repository root:

    python -m lab.startup --synthetic tiny --repeats 3 --json $OUT/startup.json
    python -m lab.startup --model $MODEL --cases export --repeats 2 --warm-json docs/benchmarks/latest.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

from lab import lab_cli
from lab.startup_bench import CASES
from voiceapp.cmd_bench import checkpoint_for, command_line, log, write_json

PROG = "python -m lab.startup"
REPEATS = 3
"""--repeats' default."""
TIMEOUT_S = 900.0
"""--timeout's default: a first run on a fresh machine compiles its kernels."""
EXPORT_SENTENCES = 40
"""--export-sentences' default: long enough that the first sentence and the whole book are apart."""


def build_parser() -> argparse.ArgumentParser:
    p = lab_cli.parser(PROG, "start-up: fresh voicectl processes, each from launch to first audio")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help=f"runs per case (default {REPEATS}; the median counts)")
    p.add_argument("--cases", metavar="LIST", help=f"only these cases (comma-separated: {', '.join(CASES)})")
    p.add_argument("--warm-json", metavar="PATH",
                   help="a `voicectl bench --json` file whose warm figures (TTFA, streams) the report carries")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"longest any one process may take (default {TIMEOUT_S:g})")
    p.add_argument("--export-sentences", type=int, default=EXPORT_SENTENCES,
                   help=f"sentences in the export case's book (default {EXPORT_SENTENCES})")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the start-up cases on fresh processes; the table on stdout, the report to --json."""
    from lab import startup_bench
    from lab.startup_cases import Bench, CaseFailed, describe_device, git_commit, run_cases

    cases = parse_cases(args.cases)
    if args.export_sentences < 1:
        from engine.errors import InputError

        raise InputError("--export-sentences must be at least 1 (leave the export case out with --cases)")
    warm = read_warm_json(args.warm_json) if args.warm_json else None
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, log) as (model, checkpoint), \
            tempfile.TemporaryDirectory(prefix="voiceapp-startup-") as work:
        device, gpu = describe_device(args.timeout)
        outcomes = run_cases(Bench(model, Path(work), args.repeats, args.timeout, args.export_sentences, log), cases)
    meta = startup_bench.ReportMeta(device=device, date=started.date().isoformat(), git=git_commit(),
                                    command=command_line(PROG), model=checkpoint, repeats=args.repeats, gpu=gpu)
    result = startup_bench.report(meta, outcomes, warm)
    print(startup_bench.format_table(result))
    if args.json:
        write_json(Path(args.json), result)
    if result["errors"]:
        raise CaseFailed(f"{len(result['errors'])} of {len(cases)} start-up cases failed: "
                         f"{', '.join(result['errors'])} (their errors are listed above)")
    return 0


def parse_cases(text: str | None) -> tuple[str, ...]:
    """--cases as the cases to run; a bad list is a one-line InputError."""
    from engine.errors import InputError
    from lab.startup_bench import parse_cases as parse

    try:
        return parse(text)
    except ValueError as err:
        raise InputError(str(err)) from None


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


def main(argv: list[str] | None = None) -> int:
    return lab_cli.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
