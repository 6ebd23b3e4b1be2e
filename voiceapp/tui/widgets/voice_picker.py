"""Provides VoicePicker: a Select over the voice bank's presets."""
from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Select


class VoicePicker(Select[str]):
    """Choose the voice for the next text; changes post Select.Changed."""

    OWN_KEYS = frozenset(key.strip() for binding in Binding.make_bindings(Select.BINDINGS)
                         for key in binding.key.split(","))
    """The keys the closed picker acts on (it opens its list); the app forwards other typed keys to the text."""

    def __init__(self, voices: list[str], value: str, *, id: str | None = None) -> None:
        super().__init__([(name, name) for name in voices], value=value, allow_blank=False, prompt="voice", id=id)
