"""Provides the number formats the TUI shows (pure: no Textual)."""
from __future__ import annotations

DASH = "–"


def ms(seconds: float | None) -> str:
    """A latency in at most 6 characters (the history's column): milliseconds below one second ("873 ms"), then
    seconds with three significant digits ("4.73 s", "47.3 s", "473 s")."""
    if seconds is None:
        return DASH
    if round(seconds * 1000) < 1000:
        return f"{seconds * 1000:.0f} ms"
    for digits in (2, 1):
        text = f"{seconds:.{digits}f}"
        if len(text) <= 4:
            return text + " s"
    return f"{seconds:.0f} s"


def ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


def rate(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}"


def secs(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f} s"


def filled_cells(fraction: float, width: int) -> int:
    """How many of a bar's `width` cells a fill `fraction` (clamped to 0..1) covers."""
    return round(min(max(fraction, 0.0), 1.0) * width)
