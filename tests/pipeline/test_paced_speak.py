"""speak() on an engine slower than real time, into a sink that plays in real time: with pacing, no underrun and
the listener told once, the sentence starting before it is complete; without pacing, the same engine underruns."""
from engine.config import SamplingOptions, SynthesisRequest
from engine.events import Notice, SentenceFinished
from engine.fakes import ScriptedGenerator, ToneDecoder
from engine.pacing import Pacer, RequestPace
from engine.pipeline import Synthesizer
from engine.tokens import TokenIds
from engine.voices import MemoryGlobalsCache, VoiceBank
from tests.tui.memory_sink import MemorySink

SPEED = 0.6
"""The fake engine's speed: 30 codes a second where playing needs 50 (clearly slow: the first sentence's speed is
judged from its second chunk alone, which a late first chunk makes look faster)."""
TEXT = "Slow words are spoken here at last."
"""One sentence: its cap (274 codes) is above what the fake makes (200), as a real sentence's is."""


class Unpaced(Pacer):
    """Never holds anything back."""

    def request(self) -> RequestPace:
        pace = RequestPace(self)
        pace.arrived = lambda seconds, sentence_end, now, planned_s=None: False
        return pace


def slow_synth(pacer: Pacer, events: list) -> Synthesizer:
    ids = TokenIds()
    generator = ScriptedGenerator(ids, tokens_per_sentence=200, delay_s=0.02 / SPEED)
    return Synthesizer(generator, ToneDecoder(), ids, lambda text: [ord(c) % 151643 for c in text], VoiceBank(),
                       MemoryGlobalsCache(), events=events.append, pacer=pacer)


async def speak(pacer: Pacer) -> tuple[MemorySink, list]:
    events: list = []
    synth = slow_synth(pacer, events)
    sink = MemorySink()
    try:
        sink.mark_utterance_start()
        await synth.speak(SynthesisRequest(TEXT, options=SamplingOptions(seed=1)), sink)
    finally:
        sink.close()
        await synth.close()
    return sink, events


async def test_paced_speech_has_no_gap_and_starts_before_the_sentence_is_complete():
    sink, events = await speak(Pacer(probe_first=True))
    assert sink.underruns == 0
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "real time here" in notices[0], notices
    first_done = next(e.t for e in events if isinstance(e, SentenceFinished) and e.sentence_index == 0)
    assert sink.last_onset_perf is not None and sink.last_onset_perf < first_done
    assert len(sink.played_samples) >= 200 * 320  # the whole sentence played


async def test_the_same_engine_unpaced_underruns():
    sink, events = await speak(Unpaced())
    assert sink.underruns > 0
    assert not [e for e in events if isinstance(e, Notice)]
