"""Provides what the speech-dispatcher module makes of a message: SSML (or plain text) turned into the text to speak,
cut at its `<mark name="..."/>` index marks, so that each mark can be reported once the audio before it has played.
Pure (standard library only).

speech-dispatcher sends every message as SSML, and a client's own SSML may be anything: tags are dropped, entities
decoded, and input that is not well formed (unclosed tags, odd nesting, stray `<` or `&`) is read as far as it goes,
never refused: the text is spoken, whatever the markup around it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

SPACED = frozenset({"p", "s", "break", "speak", "voice", "sub", "paragraph", "sentence", "br"})
"""Elements whose edges separate words: a space goes in their place, so `<s>a</s><s>b</s>` is not `ab`."""
TAG = re.compile(r"<[^>]*>?")


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a message: the marks reached before it, then its text (empty for marks at the very end)."""

    marks: tuple[str, ...]
    """Index mark names, in order: reported once everything before them has played."""
    text: str
    """What to speak (tags gone, entities decoded); may hold nothing speakable."""


class _Reader(HTMLParser):
    """Collects text and marks in document order; unknown tags are skipped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[tuple[str, str]] = []
        """("text", str) and ("mark", name) in order."""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "mark":
            name = dict(attrs).get("name")
            if name:
                self.pieces.append(("mark", name))
        elif tag in SPACED:
            self.pieces.append(("text", " "))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag in SPACED:
            self.pieces.append(("text", " "))

    def handle_data(self, data: str) -> None:
        self.pieces.append(("text", data))


def read_ssml(data: str) -> list[tuple[str, str]]:
    """The text and marks of `data` in order. Without any markup it is plain text (a `<` in it included)."""
    if "<" not in data and "&" not in data:
        return [("text", data)]
    reader = _Reader()
    try:
        reader.feed(data)
        reader.close()
    except Exception:  # noqa: BLE001 - html.parser is lenient, but whatever it rejects is still spoken as text
        return [("text", TAG.sub(" ", data))]
    return reader.pieces


def segments(data: str) -> list[Segment]:
    """`data` cut at its marks: each Segment holds the marks just before its text; a message ending in marks ends
    with a Segment of empty text holding them. Whitespace is collapsed."""
    result: list[Segment] = []
    marks: list[str] = []
    text: list[str] = []

    def flush() -> None:
        joined = " ".join("".join(text).split())
        if joined or marks:
            result.append(Segment(tuple(marks), joined))
        marks.clear()
        text.clear()

    for kind, value in read_ssml(data):
        if kind == "mark":
            if "".join(text).strip():
                flush()
            marks.append(value)
        else:
            text.append(value)
    flush()
    return result
