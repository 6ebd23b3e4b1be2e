"""The pipeline's sentence source: the same sentences as splitting and normalizing the whole text up front, but
produced as they are asked for, so a long text's first sentence costs one piece of work, not the whole text."""
from __future__ import annotations

import asyncio

import engine.pipeline as pipeline
from engine.pipeline import FEED_CHARS, _SentenceSource
from engine.text import SentenceSplitter, is_speakable, normalize
from tests.pure.test_text import generated_text

MAX_CHARS = 280


def up_front(text: str) -> list[str]:
    splitter = SentenceSplitter(max_chars=MAX_CHARS)
    raw = splitter.feed(text) + splitter.flush()
    return [t for t in (normalize(s) for s in raw) if is_speakable(t)]


async def drain(source: _SentenceSource) -> list[str]:
    out = []
    while (text := await source.next()) is not None:
        out.append(text)
    return out


async def pieces(parts):
    for part in parts:
        await asyncio.sleep(0)
        yield part


def test_the_same_sentences_as_the_whole_text_split_up_front() -> None:
    text = generated_text(3 * FEED_CHARS, seed=5) + "\n\n... \n" + generated_text(500, seed=6)
    assert asyncio.run(drain(_SentenceSource(text, None, MAX_CHARS))) == up_front(text)
    cut = [text[i:i + 777] for i in range(0, len(text), 777)]
    streamed = asyncio.run(drain(_SentenceSource(cut[0], pieces(cut[1:]), MAX_CHARS)))
    assert streamed == up_front(text)


def test_a_long_texts_first_sentence_costs_one_piece(monkeypatch) -> None:
    calls, fed = [], []
    monkeypatch.setattr(pipeline, "normalize", lambda s: calls.append(s) or normalize(s))
    real = SentenceSplitter.feed
    monkeypatch.setattr(SentenceSplitter, "feed", lambda self, text: fed.append(len(text)) or real(self, text))
    text = generated_text(20000, seed=2) * 50  # ~1 MB
    source = _SentenceSource(text, None, MAX_CHARS)
    first = asyncio.run(source.next())
    assert fed == [FEED_CHARS] and len(calls) <= 3  # one piece split, the first sentence(s) normalized
    assert first == up_front(text[:FEED_CHARS])[0]


def test_a_large_streamed_piece_is_split_a_piece_at_a_time(monkeypatch) -> None:
    fed = []
    real = SentenceSplitter.feed
    monkeypatch.setattr(SentenceSplitter, "feed", lambda self, text: fed.append(len(text)) or real(self, text))
    text = generated_text(20000, seed=3) * 3  # one 60 kB piece, as stdin's reader hands over
    source = _SentenceSource("", pieces([text]), MAX_CHARS)
    assert asyncio.run(source.next()) == up_front(text[:FEED_CHARS])[0] and max(fed) <= FEED_CHARS


def test_nothing_speakable_ends_at_once() -> None:
    assert asyncio.run(drain(_SentenceSource("... \n \u200b !!", None, MAX_CHARS))) == []
    assert asyncio.run(drain(_SentenceSource("", pieces(["", "  "]), MAX_CHARS))) == []
