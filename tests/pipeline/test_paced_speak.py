"""speak() on an engine slower than real time, into a sink that plays in real time: with pacing, no underrun and
the listener told once, the sentence starting before it is complete, also when its first chunk comes late; without
pacing, the same engine underruns."""
import time

import numpy as np

from engine.config import SamplingOptions, SynthesisRequest
from engine.events import ChunkDecoded, Notice, SentenceFinished
from engine.factory import windows_s
from engine.families.spark import SparkGrammar
from engine.fakes import ScriptedGenerator, ToneDecoder
from engine.pacing import Pacer, RequestPace
from engine.pipeline import Synthesizer
from engine.tokens import TokenIds
from engine.voices import MemoryGlobalsCache, VoiceBank
from engine.windowing import WindowSchedule
from tests.tui.memory_sink import MemorySink

SPEED = 0.8
"""The fake engine's speed: 40 codes a second where playing needs 50 (close to real time: a speed judged too fast
streams the sentence, which then underruns)."""
TEXT = "Slow words are spoken here, one after another, at last."
"""One sentence: its cap (418 codes) is above what the fake makes (TOKENS), as a real sentence's is."""
TOKENS = 280
"""Codes the fake makes for TEXT. The pre-roll (engine.pacing) assumes audio comes smoothly, while a sentence's
later windows come in large lumps: with this length and cap, speeds judged around SPEED all release the sentence
at the same window, well clear of what its last lump needs, so the test checks the speed judgement, not that
margin."""
LATE_S = 0.25
"""How late the first chunk comes in the late case: the decoder's first call is slow while the LLM goes on, so
the second chunk follows the first in a burst."""


class Unpaced(Pacer):
    """Never holds anything back."""

    def request(self) -> RequestPace:
        pace = RequestPace(self)
        pace.arrived = lambda seconds, sentence_end, now, planned_s=None, made_at=None: False
        return pace


class LateFirstDecoder(ToneDecoder):
    """A ToneDecoder whose first call takes LATE_S (it runs on the decode executor, beside the generator)."""

    def __init__(self) -> None:
        self.calls = 0

    def decode(self, items):
        self.calls += 1
        if self.calls == 1:
            time.sleep(LATE_S)
        return super().decode(items)


def slow_synth(pacer: Pacer, events: list, decoder: ToneDecoder) -> Synthesizer:
    ids = TokenIds()
    generator = ScriptedGenerator(ids, tokens_per_sentence=TOKENS, delay_s=0.02 / SPEED)
    return Synthesizer(generator, decoder, SparkGrammar(ids, lambda text: [ord(c) % 151643 for c in text]), VoiceBank(),
                       MemoryGlobalsCache(), events=events.append, pacer=pacer)


async def speak(pacer: Pacer, decoder: ToneDecoder | None = None) -> tuple[MemorySink, list]:
    events: list = []
    synth = slow_synth(pacer, events, decoder or ToneDecoder())
    sink = MemorySink()
    try:
        sink.mark_utterance_start()
        await synth.speak(SynthesisRequest(TEXT, options=SamplingOptions(seed=1)), sink)
    finally:
        sink.close()
        await synth.close()
    return sink, events


def assert_paced(sink: MemorySink, events: list) -> None:
    assert sink.underruns == 0
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "real time here" in notices[0], notices
    first_done = next(e.t for e in events if isinstance(e, SentenceFinished) and e.sentence_index == 0)
    assert sink.last_onset_perf is not None and sink.last_onset_perf < first_done
    assert len(sink.played_samples) >= TOKENS * 320  # the whole sentence played


async def test_paced_speech_has_no_gap_and_starts_before_the_sentence_is_complete():
    assert_paced(*await speak(Pacer(probe_first=True)))


async def test_a_late_first_chunk_does_not_make_the_engine_look_fast():
    decoder = LateFirstDecoder()
    assert_paced(*await speak(Pacer(probe_first=True), decoder))
    assert decoder.calls > 2


async def test_the_same_engine_unpaced_underruns():
    sink, events = await speak(Unpaced())
    assert sink.underruns > 0
    assert not [e for e in events if isinstance(e, Notice)]


SHORT_TEXT = "Slow words come here, one by one."
"""A sentence whose cap (266 codes, 5.3 s) the fake reaches: its start falls between two windows."""


class WriteLog:
    """A sink that records when each piece of audio was written (perf_counter) and plays nothing."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.writes: list[tuple[float, int]] = []

    async def write(self, samples: np.ndarray) -> None:
        self.writes.append((time.perf_counter(), len(samples)))

    async def drain(self) -> None:
        pass

    def allow_pause(self) -> None:
        pass

    def clear(self) -> None:
        pass


async def test_a_held_sentence_starts_on_the_clock_between_its_windows():
    """Windows that come whole (the default schedule's): the sentence goes to the player at the moment from which it
    plays through, between two chunks rather than at the next one, and each later chunk comes before it is due."""
    events: list = []
    decoder = ToneDecoder()
    synth = slow_synth(Pacer(probe_first=True, windows_s=windows_s(WindowSchedule(), decoder)), events, decoder)
    sink = WriteLog()
    try:
        await synth.speak(SynthesisRequest(SHORT_TEXT, options=SamplingOptions(seed=1)), sink)
    finally:
        await synth.close()
    decoded = [e for e in events if isinstance(e, ChunkDecoded)]
    chunks = [e.t for e in decoded]
    start = sink.writes[0][0]
    assert min(abs(start - t) for t in chunks) > 0.05 and start < chunks[-1]
    played = 0
    for at, samples in sink.writes:
        assert at <= start + played / sink.sample_rate
        played += samples
    assert played == sum(e.samples for e in decoded) > 4 * sink.sample_rate


async def test_stopping_while_a_sentence_waits_for_its_moment_ends_the_stream_and_frees_the_engine():
    """Cancelling `speak` while a held sentence waits for its start (a read pending beside the clock) stops at once,
    plays nothing more, closes the request's stream, and the engine serves the next request."""
    import asyncio

    from engine.events import RequestFinished

    events: list = []
    decoder = ToneDecoder()
    synth = slow_synth(Pacer(probe_first=True, windows_s=windows_s(WindowSchedule(), decoder)), events, decoder)
    sink = WriteLog()
    try:
        task = asyncio.create_task(synth.speak(SynthesisRequest(SHORT_TEXT, options=SamplingOptions(seed=1)), sink))
        while sum(isinstance(e, ChunkDecoded) for e in events) < 4:  # measured and held: its moment is pending
            await asyncio.sleep(0.01)
        assert not sink.writes
        task.cancel()
        t = time.perf_counter()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert time.perf_counter() - t < 0.5 and not sink.writes
        await asyncio.sleep(0.2)
        finished = [e for e in events if isinstance(e, RequestFinished)]
        assert len(finished) == 1 and finished[0].cancelled
        audio = await synth.render(SynthesisRequest("Again.", options=SamplingOptions(seed=2, max_tokens=20)))
        assert len(audio) > 0
    finally:
        await synth.close()
