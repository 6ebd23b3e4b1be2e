"""Provides TextEntry: the one-line text input; Enter speaks. Pastes are flattened to one line and capped."""
from __future__ import annotations

from textual import events
from textual.widgets import Input

MAX_TEXT_CHARS = 200_000
"""Longest text the entry accepts (about three hours of speech); a longer paste is cut, with a warning."""


class TextEntry(Input):
    """Input for the text to speak. Unlike a plain Input, a multi-line paste keeps all its lines (joined with
    spaces: the synthesizer splits sentences itself) instead of only the first, and `?` typed into the empty
    field opens the key help (anywhere else in the text it is just a question mark). Taking the focus does not
    select the text: the focus comes back here after a voice pick, and the next key must add to the text, not
    replace it."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder="Type text and press Enter to speak", max_length=MAX_TEXT_CHARS,
                         select_on_focus=False, id=id)

    async def _on_key(self, event: events.Key) -> None:
        if event.character == "?" and not self.value:
            event.stop()
            event.prevent_default()
            await self.run_action("app.help")

    def _on_paste(self, event: events.Paste) -> None:
        event.prevent_default()
        event.stop()
        text = " ".join(event.text.split())
        if not text:
            return
        start, end = sorted(self.selection)
        room = (self.max_length or MAX_TEXT_CHARS) - (len(self.value) - (end - start))
        if len(text) > room:
            text = text[:max(room, 0)]
            self.notify(f"pasted text cut to {MAX_TEXT_CHARS:,} characters", severity="warning")
        if start == end:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, start, end)
