"""Provides VoicePicker: a Select over the voice bank's presets."""
from __future__ import annotations

from textual.widgets import Select


class VoicePicker(Select[str]):
    """Choose the voice for the next text; changes post Select.Changed."""

    def __init__(self, voices: list[str], value: str, *, id: str | None = None) -> None:
        super().__init__([(name, name) for name in voices], value=value, allow_blank=False, prompt="voice", id=id)
