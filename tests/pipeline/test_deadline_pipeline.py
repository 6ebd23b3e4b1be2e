"""The Synthesizer keeps every live request's deadline (engine.deadlines) on the fake engine: opened when it starts,
fed as its chunks go out, closed when it ends; a request waiting for its streamed text, or for its consumer to read,
is not late; its decoder batcher and a generator that schedules by deadline share the one board."""
from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from engine.config import SamplingOptions, SynthesisRequest
from engine.deadlines import DeadlineBoard
from engine.factory import EngineConfig, build_synthesizer
from engine.fakes import ScriptedGenerator


def req(text: str, request_id: str = "r1") -> SynthesisRequest:
    return SynthesisRequest(text, options=SamplingOptions(seed=3), request_id=request_id)


async def test_a_requests_clock_follows_its_chunks_and_ends_with_it():
    synth = build_synthesizer(EngineConfig(backend="fake"))
    board = synth.deadlines
    heard = 0.0
    async with aclosing(synth.synthesize(req("Hello there. A second sentence."))) as chunks:
        async for chunk in chunks:
            assert board.live == 1
            heard += len(chunk.samples) / chunk.sample_rate
            clock = board._clocks["r1"]
            assert clock.audio_s == pytest.approx(heard)
            assert board.due_at("r1") == pytest.approx(clock.first_audio_at + heard - board.policy.margin_s)
            assert clock.held  # the chunk waits for this consumer while the loop body runs
    assert board.live == 0 and board.due_at("r1") is None
    await synth.close()


async def test_waiting_for_streamed_text_or_a_slow_consumer_is_not_at_risk():
    synth = build_synthesizer(EngineConfig(backend="fake"))
    more = asyncio.Event()

    async def text():
        yield "Hi there. And"  # the first sentence is whole; the next waits for its words
        await more.wait()
        yield " more words."

    got = []

    async def consume():
        async with aclosing(synth.synthesize(req("", "streamed"), text())) as chunks:
            async for chunk in chunks:
                got.append(chunk)

    task = asyncio.create_task(consume())
    for _ in range(500):
        if any(c.sentence_end for c in got):
            break
        await asyncio.sleep(0.01)
    assert any(c.sentence_end for c in got)
    await asyncio.sleep(1.0)  # the first sentence's audio has played out: the request waits for its text
    assert synth.deadlines.at_risk() == 0 and synth.admit().admit
    more.set()
    await task

    # a consumer that stops reading: its next chunk is ready and waits for it
    async with aclosing(synth.synthesize(req("One short sentence. And another one.", "stalled"))) as chunks:
        await chunks.__anext__()
        await asyncio.sleep(1.0)
        assert synth.deadlines.live == 1 and synth.deadlines.at_risk() == 0 and synth.admit().admit
    await synth.close()


class Following(ScriptedGenerator):
    """A generator that schedules by deadline (engine.backends.base DeadlineScheduled)."""

    board: DeadlineBoard | None = None

    def follow(self, board: DeadlineBoard) -> None:
        self.board = board


def test_the_batcher_and_a_deadline_scheduled_generator_share_the_engines_board():
    synth = build_synthesizer(EngineConfig(backend="fake"))
    assert synth.batcher.deadlines is synth.deadlines
    gen = Following(synth.grammar.token_ids)
    synth.swap_generator(gen)
    assert gen.board is synth.deadlines
