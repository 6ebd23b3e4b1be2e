"""Provides `voicectl`: argparse subcommands, each in its own `voiceapp.cmd_*` module; errors rendered here."""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("model", "say", "export", "serve", "status", "stop", "voices", "voice", "devices", "bench", "doctor", "tui")
"""Subcommand modules `voiceapp.cmd_<name>`; each defines add_parser(subparsers) and run(args) -> int."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicectl", description="Real-time Spark-TTS voice player.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"voiceapp.cmd_{name}")
        except ModuleNotFoundError as err:
            if err.name != f"voiceapp.cmd_{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.errors import VoiceError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if "tui" in commands and (not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help"))):
        argv = ["tui", *argv]  # bare `voicectl [--flags]` opens the TUI
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except VoiceError as err:
        print(f"voicectl: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("voicectl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
