"""Provides TooSmall: the message shown instead of the layout when the terminal is below the minimum size."""
from __future__ import annotations

from textual.widgets import Static

MIN_WIDTH, MIN_HEIGHT = 60, 16
"""Smallest terminal the layout fits (app.tcss shows this widget below it, via the app's breakpoints)."""


class TooSmall(Static):
    """Centered hint; hidden by CSS unless the screen has the -narrow or -short breakpoint class."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(f"Terminal too small.\nEnlarge it to at least {MIN_WIDTH}x{MIN_HEIGHT}.\n\n"
                         "ctrl+q quits", id=id)
