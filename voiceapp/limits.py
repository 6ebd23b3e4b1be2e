"""Provides the one table of numeric limits: every number a user can give voicectl (a command-line option, or a
field of a `say` request on the server's socket) is checked here, for its type, finiteness and range, before
anything runs. Outside its range a number becomes one `voicectl: ...` line (an InputError) instead of a
traceback deep in generation, a hang, or a crash in a native library.

`voiceapp.cli.build_parser` gives every numeric option of every subcommand its row's check as its argparse type
(by the option's name); tests/cli/test_cli_numbers.py fails for a numeric option without a row. Standard library
only: `voicectl --help` and the server both import it.
"""
from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import InputError


def max_threads() -> int:
    """The most CPU threads anything may ask for: 4 per core, at most 256 (torch crashes on far larger counts)."""
    return min(256, 4 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class Limit:
    """What one number may be: an integer or a float, from `low` to `high` (inclusive; `low_open` excludes low)."""

    kind: type
    """int or float; a float must also be finite."""
    low: float
    """The bottom of the range."""
    high: float | Callable[[], float]
    """The top, or what says it on this machine (--threads)."""
    low_open: bool = False
    """The value must be above `low`, not equal to it."""
    unit: str = ""
    """Said after the range ("seconds")."""

    @property
    def top(self) -> float:
        """The top of the range on this machine."""
        return self.high() if callable(self.high) else self.high

    def span(self) -> str:
        """The range, as the error says it."""
        span = f"above {self.low:g} and at most {self.top:g}" if self.low_open else \
            f"from {self.low:g} to {self.top:g}"
        return span + (f" {self.unit}" if self.unit else "")

    def check(self, value: object, name: str, shown: str | None = None) -> int | float:
        """`value` if it is a number of this kind within range; else an InputError naming `name`, the value (as
        `shown`, where given) and the range."""
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if self.kind is int and not isinstance(number, int):
            number = None
        if number is None or not (math.isfinite(number) and self._above_low(number) and number <= self.top):
            what = "an integer" if self.kind is int else "a number"
            raise InputError(f"{name} {repr(value) if shown is None else shown}: must be {what} {self.span()}")
        return number

    def _above_low(self, number: int | float) -> bool:
        return number > self.low if self.low_open else number >= self.low

    def parse(self, text: str, option: str) -> int | float:
        """An option's text as a checked number (the argparse type); InputError, in one line, if it is not."""
        try:
            value = int(text, 10) if self.kind is int else float(text)
        except ValueError:
            what = "an integer" if self.kind is int else "a number"
            raise InputError(f"{option} {text}: must be {what} {self.span()}") from None
        if self.kind is float and not math.isfinite(value):
            raise InputError(f"{option} {text}: must be a number {self.span()}")
        return self.check(value, option, text)


THREADS = Limit(int, 1, max_threads)
SEED = Limit(int, 0, 2 ** 63 - 1)
MAX_TOKENS = Limit(int, 1, 100_000)

OPTIONS: dict[str, Limit] = {
    "threads": THREADS,
    "seed": SEED,
    "max_tokens": MAX_TOKENS,
    "latency": Limit(float, 0, 2.0, low_open=True, unit="seconds"),  # PortAudio's output latency
    "buffer": Limit(float, 0.5, 600.0, unit="seconds"),  # voiceapp.common.BUFFER_S
    "jobs": Limit(int, 1, 256),
    "normalize_loudness": Limit(float, -50.0, -6.0, unit="dBFS"),  # an RMS level (engine.book loudness)
    "max_mb": Limit(int, 1, 4096, unit="MB"),
    "idle_timeout": Limit(float, 0, 365 * 86400.0, unit="seconds"),  # 0: never
    "http_max_chars": Limit(int, 1, 10_000_000),
    "http_max_streams": Limit(int, 1, 100_000),
    "http_max_connections": Limit(int, 1, 100_000),  # lowered further to fit the descriptor limit at start-up
    "http_timeout": Limit(float, 0, 3600.0, low_open=True, unit="seconds"),
    "tokens": MAX_TOKENS,
    "sentences": Limit(int, 1, 10_000),
    "rounds_1": Limit(int, 1, 10_000),
    "export_sentences": Limit(int, 0, 100_000),  # python -m lab.bench: 0 skips the export run
    "reference_tokens": MAX_TOKENS,
    "first_new": Limit(int, 1, 750),  # engine.windowing.WHOLE_CODES: a whole sentence
    "first_right": Limit(int, 3, 750),  # above the crossfade's 2 codes (WindowSchedule)
    "repeats": Limit(int, 1, 10_000),
    "timeout": Limit(float, 0, 86400.0, low_open=True, unit="seconds"),
    "load_seconds": Limit(float, 0, 86400.0, low_open=True, unit="seconds"),  # bench --load, per rate
    "load_seed": SEED,
    "fake_streams": Limit(int, 1, 10_000),  # bench --load --backend fake
    "replicas": Limit(int, 1, 10_000),  # serve --ray: engine replicas
    "min_replicas": Limit(int, 0, 10_000),  # 0: scale to zero
    "max_replicas": Limit(int, 1, 10_000),
    "replica_streams": Limit(int, 1, 100_000),
    "replica_cpus": Limit(float, 0, 1024.0, low_open=True),  # Ray's num_cpus of a CPU replica
    "scale_down_after": Limit(float, 0, 86400.0, unit="seconds"),
    "ray_workers": Limit(int, 1, 10_000),  # export --ray
}
"""Every numeric command-line option, by its argparse dest (the same limits wherever the option appears)."""

REQUEST: dict[str, Limit] = {
    "seed": SEED,
    "max_tokens": MAX_TOKENS,
    "temperature": Limit(float, 0, 100.0),  # 0: greedy
    "top_k": Limit(int, 0, 1_000_000),  # 0: off
    "top_p": Limit(float, 0, 1.0, low_open=True),
}
"""The numbers of a `say` request on the server's socket (engine.config.SamplingOptions and its seed)."""


class OptionType:
    """An option's argparse `type`: its row's parse (the row is `limit`)."""

    def __init__(self, limit: Limit, dest: str, option: str) -> None:
        self.limit, self.option = limit, option
        self.__name__ = f"{limit.kind.__name__}_{dest}"  # argparse names the type in some of its messages

    def __call__(self, text: str) -> int | float:
        return self.limit.parse(text, self.option)


def option_type(dest: str, option: str) -> OptionType:
    """The argparse type for the option `option` (dest `dest`): its row's parse."""
    return OptionType(OPTIONS[dest], dest, option)


def apply(parser: argparse.ArgumentParser) -> None:
    """Give every int or float option of `parser` and its subcommands its row's check, by dest. An option without
    a row keeps its plain type (the test over all options fails for it)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply(sub)
        elif action.type in (int, float) and action.dest in OPTIONS and action.option_strings:
            action.type = option_type(action.dest, action.option_strings[-1])
