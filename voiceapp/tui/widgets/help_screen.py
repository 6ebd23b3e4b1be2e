"""Provides HelpScreen: the key bindings, as a modal; any of escape, q or ? closes it."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("enter", "speak the text (queued if something is playing)"),
    ("escape, ctrl+s", "stop: silence now, drop the queue"),
    ("ctrl+n", "skip to the next queued text"),
    ("r", "replay the selected history entry"),
    ("tab / shift+tab", "move between text, voice and history"),
    ("? / f1", "this help (? in an empty text field)"),
    ("ctrl+q", "quit"),
)


class HelpScreen(ModalScreen[None]):
    """Key bindings; the app stays live behind it."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, what in KEYS:
            table.add_row(key, what)
        with Vertical(id="help"):
            yield Static(table)
            yield Static("mouse: click a row to select it, click the footer keys", classes="hint")
            yield Static("escape, q or ? closes this help", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "keys"

    def on_click(self) -> None:
        self.dismiss()
