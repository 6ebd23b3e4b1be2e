"""The lab benchmarks' command line (`python -m lab.bench`, `lab.startup`, `lab.export_check`, `lab.read_bench`):
argparse with voicectl's numeric checks (voiceapp.limits), and a bad input or failed run as one `PROG: ...` line
with its error's exit status, as `voicectl` renders them."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence


def main(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
         argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's) with `parser` and `run` it; errors rendered in one line."""
    from engine.errors import VoiceError
    from voiceapp import limits
    from voiceapp.cli import NO_TELEMETRY

    import os

    for name, value in NO_TELEMETRY.items():  # as voicectl: inherited by every process the benchmark starts
        os.environ.setdefault(name, value)
    limits.apply(parser)
    try:
        return int(run(parser.parse_args(sys.argv[1:] if argv is None else list(argv))) or 0)
    except VoiceError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A lab benchmark's parser with the checkpoint options (--synthetic or --model) and --json."""
    from voiceapp.cmd_bench import add_checkpoint_args

    p = argparse.ArgumentParser(prog=prog, description=description)
    add_checkpoint_args(p)
    p.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    return p
