"""Provides the number formats the TUI shows (pure: no Textual)."""
from __future__ import annotations

DASH = "–"


def ms(seconds: float | None) -> str:
    return DASH if seconds is None else f"{seconds * 1000:.0f} ms"


def ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


def rate(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}"


def secs(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f} s"


def filled_cells(fraction: float, width: int) -> int:
    """How many of a bar's `width` cells a fill `fraction` (clamped to 0..1) covers."""
    return round(min(max(fraction, 0.0), 1.0) * width)
