"""Provides `voicectl`: argparse subcommands, each in its own module of this package (`voiceapp.cli.<name>`);
errors rendered here. `python -m voiceapp.cli` runs it too (the server autostart and the speechd module script
written by `voicectl speechd install` start it so)."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

COMMANDS = ("model", "say", "export", "export_many", "serve", "status", "stop", "voices", "voice", "devices", "bench", "doctor", "tui",
            "speechd")
"""The subcommands, in `voicectl --help`'s order; each module defines add_parser(subparsers) and run(args) -> int."""

ELSEWHERE = {"bench": "voiceapp.cmd_bench"}
"""Subcommand modules outside this package (the rest are `voiceapp.cli.<name>`)."""


def command_module(name: str) -> str:
    """The module that implements subcommand `name`."""
    return ELSEWHERE.get(name, f"{__name__}.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand, or `only` that one: each command module imports what its options need, and a `say`
    through a warm server should not pay for the benchmark's or the exporter's imports."""
    parser = argparse.ArgumentParser(prog="voicectl", description="Real-time voice player for LLM-based TTS models "
                                                                  "(Spark-TTS, Orpheus).")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only.replace("-", "_"),):
        try:
            module = importlib.import_module(command_module(name))
        except ModuleNotFoundError as err:
            if err.name != command_module(name):
                raise
            continue
        module.add_parser(sub)
    from voiceapp import limits

    limits.apply(parser)  # every numeric option checked by the one table (range, finiteness)
    return parser


class VersionAction(argparse.Action):
    """`--version`: the version looked up only when asked. argparse's own action takes the string up front, and
    the installed metadata's lookup (importlib.metadata scans sys.path) would then be paid by every launch."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default,
                         help=help or "show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"voicectl {_version()}")
        parser.exit()


def _version() -> str:
    """The installed project's version (a checkout that was never installed says so)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("voiceapp")
    except PackageNotFoundError:
        return "(not installed)"


BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}
"""numpy's OpenBLAS starts a thread per core as numpy is imported, which a client pays at every start-up, and
voicectl multiplies no matrices with numpy. Only on x86-64, whose torch wheels bring MKL: elsewhere torch's own
matrix products may run on OpenBLAS. A user's own setting wins (docs/startup.md)."""


NO_TELEMETRY = {"ORT_DISABLE_TELEMETRY": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
"""Usage reports the libraries we load would send by default: ONNX Runtime's official Linux builds (to their
vendor; engine.backends.qwen2_ort also calls the runtime's own switch), vLLM's usage statistics and the Hub client's
download telemetry. Off in voicectl and everything it starts; a user's own setting wins."""


def plays_through_server(argv: list[str], env: Mapping[str, str]) -> bool:
    """Whether this command line is a `say` that may play through a warm server: the one command whose launch is
    waited on by ear, and which wants PortAudio started before anything else (voiceapp.cli.lean_say)."""
    return argv[0] == "say" and not {"--out", "--no-server"} & set(argv) and env.get("VOICEAPP_NO_SERVER", "") in (
        "", "0")


def main(argv: list[str] | None = None) -> int:
    """Run `argv`'s command; its exit status. `argv` None: this process is voicectl (its console script, `python -m
    voiceapp.cli`), and a Ctrl-C at its exit ends it quietly with 130 (voiceapp.cli.quiet_exit); a list: a caller's
    own process, whose signals are left alone."""
    import os

    from voiceapp.cli import quiet_exit  # the standard library alone

    whole = argv is None
    if whole:
        quiet_exit.arm()  # before any other atexit hook (PortAudio's, as start_loading imports it)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["tui", *argv]  # bare `voicectl [--flags]` opens the TUI
    if plays_through_server(argv, os.environ):
        from engine.backends.portaudio_calls import start_loading  # the standard library alone

        start_loading(own_stderr=whole)  # first: PortAudio starts (mostly without the GIL) while the rest is imported
    machine = os.uname().machine if hasattr(os, "uname") else __import__("platform").machine()
    if machine.lower() in ("x86_64", "amd64"):
        for name, value in BLAS_THREADS.items():
            os.environ.setdefault(name, value)
    for name, value in NO_TELEMETRY.items():  # inherited by every process voicectl starts
        os.environ.setdefault(name, value)
    parser = build_parser(argv[0] if argv[0].replace("-", "_") in COMMANDS else None)
    outcome: list[int | BaseException] = []
    try:
        run_command(parser, argv, outcome)
        if whole:
            quiet_exit.HOLD()
    except KeyboardInterrupt as err:  # it landed as the outcome was kept, or before HOLD
        if whole:
            quiet_exit.HOLD()  # first: a second Ctrl-C is noted, not raised in here
        outcome.append(err)
    code = render(outcome)
    return quiet_exit.INTERRUPTED if quiet_exit.interrupted() else code


def stdout_gone() -> bool:
    """Whether stdout's reader has gone (a pipe or socket whose far end closed: poll reports an error on it), so a
    BrokenPipeError is the reader leaving, not a failure to report; True where it cannot tell (no poll, no fd)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def raised_at(err: BaseException) -> str:
    """Where `err` was raised: the innermost frame's file (its last two path parts) and line."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "an unknown place"
    where = frames[-1]
    return f"{'/'.join(where.filename.replace(chr(92), '/').split('/')[-2:])}:{where.lineno}"


def run_command(parser: argparse.ArgumentParser, argv: list[str], outcome: list[int | BaseException]) -> None:
    """Parse `argv` and run its command: its exit code, or the error to report, appended to `outcome` (kept there as
    soon as it is known: a Ctrl-C landing as this returns cannot lose it)."""
    from engine.errors import VoiceError

    try:
        args = parser.parse_args(argv)  # a number out of range: an InputError from voiceapp.limits
        if args.command is None:
            parser.print_help()
            outcome.append(2)
            return
        outcome.append(int(args.run(args) or 0))
    except (VoiceError, KeyboardInterrupt, BrokenPipeError, SystemExit) as err:  # SystemExit: argparse's
        outcome.append(err)


def render(outcome: list[int | BaseException]) -> int:
    """The exit code of `outcome` (the command's, then any Ctrl-C that came after it), its error's line printed."""
    from engine.errors import VoiceError
    from voiceapp.cli import quiet_exit

    first = outcome[0]
    code = first if isinstance(first, int) else 1
    if isinstance(first, KeyboardInterrupt):
        print("voicectl: interrupted", file=sys.stderr)
        code = quiet_exit.INTERRUPTED
    elif isinstance(first, VoiceError):
        print(f"voicectl: {first}", file=sys.stderr)
        code = first.exit_code
    elif isinstance(first, BrokenPipeError) and not stdout_gone():  # gone: `voicectl ... | head`, nothing to say
        print(f"voicectl: a pipe to another process broke ({raised_at(first)}): {first}", file=sys.stderr)
    elif isinstance(first, SystemExit):  # as the interpreter would end on it: a message goes to stderr, status 1
        if first.code is not None and not isinstance(first.code, int):
            print(first.code, file=sys.stderr)
        elif first.code not in (None, 0, 2):  # argparse's own exits are 0 (help) and 2 (after its line)
            print(f"voicectl: stopped with status {first.code} by {raised_at(first)}", file=sys.stderr)
        code = first.code if isinstance(first.code, int) else int(first.code is not None)
    return quiet_exit.INTERRUPTED if len(outcome) > 1 else code
