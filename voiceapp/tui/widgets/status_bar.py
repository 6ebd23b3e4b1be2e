"""Provides StatusBar: one line with what the app is doing, and a spinner while the model loads."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, LoadingIndicator


class StatusBar(Horizontal):
    """A LoadingIndicator (shown while loading) and a status text."""

    def compose(self) -> ComposeResult:
        yield LoadingIndicator(id="spinner")
        yield Label("starting…", id="state")

    def show(self, text: str, loading: bool = False) -> None:
        self.query_one("#spinner").display = loading
        self.query_one("#state", Label).update(text)

    @property
    def text(self) -> str:
        return str(self.query_one("#state", Label).content)
