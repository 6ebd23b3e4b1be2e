"""Every number a user gives voicectl is checked in one place (voiceapp.limits): each numeric option of every
subcommand, fed NaN, infinities, negatives, zero, huge values and non-numbers, either parses to a value in its
range or is one `voicectl: ...` line naming the option; never a traceback, a hang or a native crash. The same
table checks the numbers of a `say` request on the server's socket."""
from __future__ import annotations

import argparse
import math

import pytest

from engine.errors import InputError
from tests.cli_helpers import one_line_error, voicectl
from voiceapp.cli import build_parser

HOSTILE = ["nan", "inf", "-inf", "-1", "0", "1e308", "1e9", "100000000000000000000000", "2.5", "abc", "0x10"]


def numeric_options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(subcommand path, its parser, the action) for every option whose value is a number."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from numeric_options(sub, (*path, name))
        elif action.option_strings and (action.type in (int, float) or hasattr(action.type, "limit")):
            yield path, parser, action


def required_args(parser: argparse.ArgumentParser) -> list[str]:
    """Placeholders for a parser's required positionals and options, so that one option can be parsed alone."""
    args = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings and action.nargs not in ("?", "*"):
            args.append("x")
        elif action.option_strings and action.required:
            args += [action.option_strings[0], "x"]
    return args


OPTIONS = list(numeric_options(build_parser()))


def test_the_walk_finds_the_options_it_should():
    names = {(" ".join(path), action.option_strings[-1]) for path, _, action in OPTIONS}
    assert {("say", "--latency"), ("say", "--threads"), ("bench", "--threads"), ("bench", "--load-seconds"),
            ("export", "--normalize-loudness"), ("serve", "--idle-timeout"), ("serve", "--http-timeout")} <= names


@pytest.mark.parametrize("path,parser,action", OPTIONS,
                         ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, _, a in OPTIONS])
def test_every_numeric_option_is_checked_by_the_table(path, parser, action):
    limit = getattr(action.type, "limit", None)
    assert limit is not None, f"{' '.join(path)} {action.option_strings[-1]} has no row in voiceapp.limits.OPTIONS"
    option = action.option_strings[-1]
    for text in HOSTILE:
        argv = [*path, *required_args(parser), f"{option}={text}"]
        try:
            args = build_parser(path[0]).parse_args(argv)
        except InputError as err:
            line = f"voicectl: {err}"
            assert "\n" not in line and option in line, line
            continue
        except SystemExit as err:  # argparse's own usage error: several lines
            raise AssertionError(f"{' '.join(argv)}: argparse exited ({err.code}), not one voicectl line")
        value = getattr(args, action.dest)
        assert isinstance(value, limit.kind) and math.isfinite(value), (argv, value)
        assert (value > limit.low if limit.low_open else value >= limit.low) and value <= limit.top, (argv, value)


@pytest.mark.parametrize("args", [
    ["say", "Hi.", "--no-server", "--backend", "fake", "--latency", "-1"],
    ["say", "Hi.", "--no-server", "--backend", "fake", "--latency", "nan"],
    ["say", "Hi.", "--no-server", "--backend", "fake", "--latency", "100"],
    ["say", "Hi.", "--no-server", "--backend", "fake", "--latency", "inf"],
    ["say", "Hi.", "--no-server", "--backend", "fake", "--latency", "1e9"],
    ["say", "Hi.", "--no-server", "--backend", "fake", "--threads", "16384"],
    ["bench", "--threads", "0"],
    ["bench", "--tokens", "0"],
    ["export", "in.txt", "-o", "o.wav", "--backend", "fake", "--normalize-loudness=1e308"],
    ["serve", "--backend", "fake", "--threads", "-1"],
])
def test_the_reported_numbers_are_one_line_at_once(args, tmp_path):
    """The cases the adversarial pass found: minutes of playback, tracebacks and a segfault, each now one line
    before anything starts."""
    (tmp_path / "in.txt").write_text("Hello there.")
    proc = voicectl(*args, cwd=tmp_path, text=True, timeout=60)
    line = one_line_error(proc)
    option = args[-1].split("=")[0] if args[-1].startswith("--") else args[-2]
    assert proc.returncode == 2 and option in line, line
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("field,value", [("top_k", 3.5), ("top_k", -1), ("temperature", float("nan")),
                                         ("temperature", float("inf")), ("top_p", 0), ("top_p", 1.5),
                                         ("max_tokens", 10 ** 12), ("max_tokens", "40"), ("max_tokens", True)])
def test_a_socket_request_with_a_bad_number_is_refused_up_front(field, value):
    from voiceapp.server.engine_server import parse_say

    with pytest.raises(InputError, match=field):
        parse_say({"type": "say", "text": "Hi.", "options": {field: value}})
    with pytest.raises(InputError, match="seed"):
        parse_say({"type": "say", "text": "Hi.", "seed": -1})
    req = parse_say({"type": "say", "text": "Hi.", "seed": 3, "options": {"top_k": 40, "temperature": 0.5}})
    assert req.options.top_k == 40 and req.options.seed == 3
