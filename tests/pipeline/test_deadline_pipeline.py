"""The Synthesizer keeps every live request's deadline (engine.deadlines) on the fake engine: opened when it starts,
fed as its chunks go out, closed when it ends; a request waiting for its streamed text, or for its consumer to read,
is not late; its decoder batcher and a generator that schedules by deadline share the one board; and with a decoder
queue longer than a batch, newcomers get their first audio sooner than in arrival order."""
from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

import pytest

from engine.bench.load import SENTENCES, Arrival, summarize_rate
from engine.config import SamplingOptions, SynthesisRequest
from engine.deadlines import DeadlineBoard
from engine.factory import EngineConfig, build_synthesizer
from engine.fakes import ScriptedGenerator, ToneDecoder
from voiceapp.load_bench import drive, engine_target


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


class QueuedDecoder(ToneDecoder):
    """A decoder whose call takes 10 ms plus 2 ms a window (time spent off the event loop, as a GPU's)."""

    batch_limit = 6

    def decode(self, items):
        time.sleep(0.010 + 0.002 * len(items))
        return super().decode(items)


async def crowd_first_audio(by_deadline: bool) -> tuple[float, float]:
    """16 long streams well ahead of their listeners, then 30 one-sentence requests arriving: the decoder's queue
    is longer than its batch (6). (First audio p50 of the newcomers in ms, the long streams' silence in s.)"""
    synth = build_synthesizer(EngineConfig(backend="fake"))
    synth.decoder = synth.batcher.decoder = QueuedDecoder()
    synth.batcher.max_batch = QueuedDecoder.batch_limit
    if not by_deadline:
        synth.batcher.deadlines = None
    target = engine_target(synth, synth.voices.default)
    arrivals = [Arrival(0.01 * k, " ".join(SENTENCES)) for k in range(16)]
    arrivals += [Arrival(1.0 + 0.04 * k, SENTENCES[k % len(SENTENCES)]) for k in range(30)]
    try:
        logs = await drive(target, arrivals)
    finally:
        await synth.close()
    long, short = (summarize_rate(1, 1, part, synth.sample_rate) for part in (logs[:16], logs[16:]))
    assert long.failed == short.failed == 0
    return short.first_ms_p50, long.underrun_s


@pytest.mark.slow
async def test_newcomers_first_windows_go_before_far_ahead_streams_windows():
    """Arrival order makes a newcomer's first window wait behind every long stream's next one; by deadline it goes
    first, and the long streams, seconds ahead of their listeners, still hear no gap."""
    fifo_first, _ = await crowd_first_audio(by_deadline=False)
    first, long_silence = await crowd_first_audio(by_deadline=True)
    assert long_silence == 0
    assert first < 0.85 * fifo_first, (first, fifo_first)
