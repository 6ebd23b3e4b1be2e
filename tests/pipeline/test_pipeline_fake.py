"""Synthesizer logic on deterministic fakes: events, streaming == one-shot, cancellation, determinism, inputs."""
import asyncio

import numpy as np
import pytest

from engine.backends.base import CodecDecoder, DecodeItem
from engine.config import SamplingOptions, SynthesisRequest
from engine.crossfade import fade_edges
from engine.errors import InputError, VoiceNotFound
from engine.events import (ChunkDecoded, FirstAudio, FirstToken, RequestFinished, RequestStarted,
                           SentenceFinished)
from engine.fakes import ScriptedGenerator, ToneDecoder
from engine.families.spark import SparkGrammar
from engine.pipeline import JoinConfig, Synthesizer, sentence_seed
from engine.prompt import build_globals_prompt
from engine.tokens import TokenIds, parse_all
from engine.voices import GlobalsCache, VoiceBank

IDS = TokenIds()


def encode(text):
    return [ord(c) % 1000 for c in text]


def make(tokens=60, delay=0.0, events=None, cache_root=None, **kw):
    gen = ScriptedGenerator(IDS, tokens_per_sentence=tokens, delay_s=delay)
    cache = GlobalsCache("testhash", root=cache_root) if cache_root else None
    synth = Synthesizer(gen, ToneDecoder(), SparkGrammar(IDS, encode), VoiceBank(), cache,
                        events=(events.append if events is not None else (lambda e: None)), **kw)
    return synth, gen


async def expected_sentence_audio(synth, text, seed, index, voice="ava"):
    """What one sentence must sound like: the one-shot decode of the tokens its prompt generates."""
    globals_ = await synth.voice_globals(voice)
    prompt = build_globals_prompt(text, globals_, IDS, encode)
    opts = SamplingOptions(seed=sentence_seed(seed, index))
    ids = [t async for delta in ScriptedGenerator(IDS, synth.generator.tokens_per_sentence).stream(
        prompt, opts, "x") for t in delta]
    codes, _ = parse_all(ids, IDS)
    (pcm,) = synth.decoder.decode([DecodeItem(tuple(codes), globals_)])
    fade = int(synth.join.fade_s * synth.sample_rate)
    return fade_edges(pcm, fade, fade)


async def test_streamed_chunks_equal_one_shot_decode_with_pauses_between_sentences():
    synth, _ = make(tokens=137)
    req = SynthesisRequest("First sentence here. And a second one follows!", options=SamplingOptions(seed=5))
    chunks = [c async for c in synth.synthesize(req)]
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    pauses = [c for c in chunks if c.pause]
    assert len(pauses) == 1 and not pauses[0].samples.any()
    assert len(pauses[0].samples) == int(JoinConfig().pause_s * 16000)
    for index, text in enumerate(["First sentence here.", "And a second one follows!"]):
        got = np.concatenate([c.samples for c in chunks if c.sentence_index == index and not c.pause])
        want = await expected_sentence_audio(synth, text, 5, index)
        assert len(got) == 137 * 320
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert sum(c.sentence_end for c in chunks) == 2


async def test_events_arrive_in_order_with_sane_values():
    events = []
    synth, _ = make(tokens=50, delay=0.001, events=events)
    await synth.render(SynthesisRequest("Hello world. Bye now.", options=SamplingOptions(seed=1)))
    kinds = [type(e) for e in events]
    assert kinds[0] is RequestStarted and kinds[-1] is RequestFinished
    assert kinds.index(FirstToken) < kinds.index(FirstAudio) < kinds.index(SentenceFinished)
    assert kinds.count(SentenceFinished) == 2
    first_token, first_audio = events[kinds.index(FirstToken)], events[kinds.index(FirstAudio)]
    assert 0 < first_token.ttft_s <= first_audio.ttfa_s < 5
    decoded = [e for e in events if isinstance(e, ChunkDecoded)]
    assert sum(e.codes for e in decoded) == 100 and all(e.decode_s >= 0 for e in decoded)
    done = events[-1]
    assert not done.cancelled and done.tokens == 100
    assert done.audio_s == pytest.approx(2 * 50 * 0.02 + JoinConfig().pause_s, abs=1e-6)
    assert done.rtf == pytest.approx(done.wall_s / done.audio_s)
    assert [e.t for e in events] == sorted(e.t for e in events)


async def leave_after_the_first_chunk(synth, gen, req: SynthesisRequest) -> int:
    """Take one chunk, close the stream; the generator's steps then, which must not move on afterwards."""
    stream = synth.synthesize(req)
    async for _ in stream:
        break
    await stream.aclose()
    steps = gen.steps
    await asyncio.sleep(0.05)
    assert gen.steps == steps, "generation kept running after the stream was closed"
    return steps


async def test_breaking_out_of_the_stream_cancels_generation_promptly():
    events = []
    synth, gen = make(tokens=3000, delay=0.002, events=events)
    req = SynthesisRequest("A very long sentence that will not finish.", options=SamplingOptions(seed=2))
    steps = await leave_after_the_first_chunk(synth, gen, req)
    assert steps < 200 and any(r.startswith(req.request_id) for r in gen.aborted)
    assert isinstance(events[-1], RequestFinished) and events[-1].cancelled


async def test_task_cancellation_stops_generation():
    synth, gen = make(tokens=3000, delay=0.002)
    task = asyncio.create_task(synth.render(SynthesisRequest("Long one.", options=SamplingOptions(seed=2))))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    steps = gen.steps
    await asyncio.sleep(0.05)
    assert gen.steps == steps


async def test_same_seed_same_audio_different_seed_different_audio():
    synth, _ = make(tokens=40)
    text = "Determinism matters. Every time."
    a = await synth.render(SynthesisRequest(text, options=SamplingOptions(seed=7)))
    b = await synth.render(SynthesisRequest(text, options=SamplingOptions(seed=7)))
    c = await synth.render(SynthesisRequest(text, options=SamplingOptions(seed=8)))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


async def test_text_arriving_in_pieces_sounds_the_same_as_whole_text():
    synth, _ = make(tokens=30)
    text = "Piped text arrives slowly. It is spoken as it comes.\nA log line without a period\n"

    async def trickle():
        for i in range(0, len(text), 3):
            yield text[i:i + 3]
            await asyncio.sleep(0)

    whole = await synth.render(SynthesisRequest(text, options=SamplingOptions(seed=3)))
    pieces = await synth.render(SynthesisRequest("", options=SamplingOptions(seed=3)), text_stream=trickle())
    assert len(whole) > 0 and np.array_equal(whole, pieces)


@pytest.mark.parametrize("text", ["", "   \n\t ", "?!... ---", "\U0001F600\U0001F680"])
async def test_nothing_speakable_is_an_input_error(text):
    synth, _ = make()
    with pytest.raises(InputError):
        await synth.render(SynthesisRequest(text))


async def test_unknown_voice_is_reported():
    synth, _ = make()
    with pytest.raises(VoiceNotFound, match="ava"):
        await synth.render(SynthesisRequest("Hi.", voice="nobody"))


async def test_voice_globals_are_computed_once_then_cached_on_disk(tmp_path):
    synth, gen = make(cache_root=tmp_path)
    first = await synth.voice_globals("leo")
    assert len(first) == 32 and all(0 <= g < 4096 for g in first)
    calls = len(gen.started)
    synth2, gen2 = make(cache_root=tmp_path)
    assert await synth2.voice_globals("leo") == first and gen2.started == []
    assert await synth.voice_globals("leo") == first and len(gen.started) == calls
    assert await synth.voice_globals("emma") != first


class RecordingGenerator(ScriptedGenerator):
    """Notes how many tokens had been generated when each sentence's stream started."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.started_at_step: dict[str, int] = {}

    async def stream(self, prompt, opts, request_id):
        self.started_at_step[request_id] = self.steps
        async for delta in super().stream(prompt, opts, request_id):
            yield delta


@pytest.mark.parametrize("eager, solo", [(False, 1), (True, 0), (True, 1)])
async def test_next_sentence_starts_at_once_at_first_audio_or_when_generation_ends(eager, solo):
    """Batching backends (eager) start a lone request's next sentence with it (solo_streams), others' at the
    current one's first audio; other backends when the current one's generation ends."""
    from engine.windowing import WindowSchedule

    gen = RecordingGenerator(IDS, tokens_per_sentence=120, delay_s=0.001)
    synth = Synthesizer(gen, ToneDecoder(), SparkGrammar(IDS, encode), VoiceBank(), eager_lookahead=eager,
                        schedule=WindowSchedule(solo_streams=solo))
    req = SynthesisRequest("One sentence here. Another one there. And a third one.", options=SamplingOptions(seed=1))
    await synth.render(req)
    started = [gen.started_at_step[f"{req.request_id}-{i}"] for i in range(3)]
    steps_before_second = started[1] - started[0]
    if eager and solo:  # at once: before the first sentence has a token; the third waits for the first's end
        assert steps_before_second == 0 and started[2] - started[0] >= 121
    elif eager:  # first audio needs first_new + right codes: well before the first sentence's 121 tokens
        assert synth.schedule.first_new + synth.schedule.right <= steps_before_second < 60
    else:
        assert steps_before_second == 121  # 120 codes + the stop token


async def test_an_engine_that_may_lag_generates_a_requests_first_sentence_alone():
    """A batching engine that may lag (the CPU's int8 rows; its pacer probes): the first sentence generates alone, as
    its own speed decides when it plays; the next starts once it is generated, and the third with the second (rendered
    ahead of their turns, their chunks stamped with when they were made)."""
    from engine.pacing import Pacer
    from engine.windowing import WindowSchedule

    gen = RecordingGenerator(IDS, tokens_per_sentence=120, delay_s=0.001)
    synth = Synthesizer(gen, ToneDecoder(), SparkGrammar(IDS, encode), VoiceBank(), eager_lookahead=True,
                        schedule=WindowSchedule(solo_streams=1), pacer=Pacer(probe_first=True))
    req = SynthesisRequest("One sentence here. Another one there. And a third one.", options=SamplingOptions(seed=1))
    chunks = [c async for c in synth.synthesize(req)]
    started = [gen.started_at_step[f"{req.request_id}-{i}"] for i in range(3)]
    assert started[1] - started[0] == 121  # 120 codes + the stop token
    assert started[2] - started[1] < 121  # the third did not wait for the second's end
    spoken = [c for c in chunks if not c.pause]
    assert all(c.made_at is None for c in spoken if c.sentence_index == 0)
    assert all(c.made_at is not None for c in spoken if c.sentence_index > 0)


async def test_busy_engine_starts_the_next_sentence_only_when_generation_ends():
    from engine.windowing import WindowSchedule

    gen = RecordingGenerator(IDS, tokens_per_sentence=120, delay_s=0.001)
    synth = Synthesizer(gen, ToneDecoder(), SparkGrammar(IDS, encode), VoiceBank(), eager_lookahead=True,
                        schedule=WindowSchedule(busy_streams=1))
    reqs = [SynthesisRequest(f"Stream {i} speaks. Then again.", options=SamplingOptions(seed=i)) for i in range(2)]
    await asyncio.gather(*(synth.render(r) for r in reqs))
    for req in reqs:  # both requests ran at once: busy (2 > 1), so no lookahead at first audio
        started = gen.started_at_step
        assert started[f"{req.request_id}-1"] - started[f"{req.request_id}-0"] >= 121


async def test_many_concurrent_requests_use_the_busy_schedule():
    from engine.windowing import WindowSchedule

    events = []
    synth, _ = make(tokens=60, delay=0.001, events=events, schedule=WindowSchedule(busy_streams=2))
    reqs = [SynthesisRequest(f"Stream number {i}.", options=SamplingOptions(seed=i)) for i in range(4)]
    await asyncio.gather(*(synth.render(r) for r in reqs))
    firsts = {}
    for e in events:
        if isinstance(e, ChunkDecoded) and e.request_id not in firsts:
            firsts[e.request_id] = e.codes
    sizes = sorted(firsts.values())
    busy = WindowSchedule().busy_first_new
    assert set(sizes) == {4, busy} and sizes.count(busy) >= 2 and synth.active_requests == 0
    events.clear()
    await synth.render(SynthesisRequest("Alone again.", options=SamplingOptions(seed=9)))
    assert next(e.codes for e in events if isinstance(e, ChunkDecoded)) == 4


async def test_a_crowd_that_comes_before_a_sentences_first_window_puts_it_on_the_busy_windows():
    """Requests that arrive together start one by one: the first sees no crowd yet, but it has planned no window when
    the rest are there, and the crowd's windows are what keep up with the crowd's slower steps."""
    from engine.windowing import WindowSchedule

    events = []
    synth, _ = make(tokens=60, delay=0.002, events=events, schedule=WindowSchedule(busy_streams=2))
    first = asyncio.ensure_future(synth.render(SynthesisRequest("The first one.", options=SamplingOptions(seed=1))))
    while not any(isinstance(e, FirstToken) for e in events):
        await asyncio.sleep(0.001)
    crowd = [synth.render(SynthesisRequest(f"Then number {i}.", options=SamplingOptions(seed=i))) for i in range(3)]
    await asyncio.gather(first, *crowd)
    opening = next(e for e in events if isinstance(e, ChunkDecoded))
    assert opening.request_id == next(e.request_id for e in events if isinstance(e, FirstToken))
    assert opening.codes == WindowSchedule().busy_first_new


async def test_a_sentence_that_never_stops_is_cut_at_its_length_cap():
    from engine.text import sentence_token_cap

    events = []
    synth, _ = make(tokens=100_000, events=events)  # the model never samples its stop token
    audio = await synth.render(SynthesisRequest("Short one.", options=SamplingOptions(seed=1, max_tokens=3000)))
    cap = sentence_token_cap("Short one.")
    assert cap < 3000
    (finished,) = [e for e in events if isinstance(e, SentenceFinished)]
    assert finished.tokens == cap and finished.hit_limit
    assert len(audio) == cap * 320
    capped = []
    synth2, _ = make(tokens=100_000, events=capped)
    await synth2.render(SynthesisRequest("Short one.", options=SamplingOptions(seed=1, max_tokens=40)))
    assert [e.tokens for e in capped if isinstance(e, SentenceFinished)] == [40]  # --max-tokens still wins


def lone(tokens=120, delay=0.001, events=None, generator=None):
    """A lone request on a batching backend: its next sentence generates and decodes alongside (solo_streams)."""
    from engine.windowing import WindowSchedule

    gen = generator or ScriptedGenerator(IDS, tokens_per_sentence=tokens, delay_s=delay)
    synth = Synthesizer(gen, ToneDecoder(), SparkGrammar(IDS, encode), VoiceBank(), eager_lookahead=True,
                        schedule=WindowSchedule(solo_streams=1),
                        events=(events.append if events is not None else (lambda e: None)))
    return synth, gen


async def test_a_lone_requests_next_sentence_is_decoded_before_its_turn_and_sounds_the_same():
    events = []
    synth, _ = lone(events=events)
    text = "One sentence here. Another one there. And a third one."
    req = SynthesisRequest(text, options=SamplingOptions(seed=4))
    chunks = [c async for c in synth.synthesize(req)]
    order = [(type(e).__name__, e.sentence_index) for e in events if isinstance(e, (ChunkDecoded, SentenceFinished))]
    # the second sentence's windows were decoded while the first was still being delivered
    assert order.index(("ChunkDecoded", 1)) < order.index(("SentenceFinished", 0))
    finished = [e for e in events if isinstance(e, SentenceFinished)]
    assert [e.sentence_index for e in finished] == [0, 1, 2] and [e.tokens for e in finished] == [120] * 3
    # ... with larger first windows than first sound needs (WindowSchedule.ahead), so not decoded with its first
    first = {i: next(e for e in events if isinstance(e, ChunkDecoded) and e.sentence_index == i) for i in (0, 1)}
    assert first[1].codes > first[0].codes and events.index(first[0]) < events.index(first[1])
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert [c.sentence_index for c in chunks] == sorted(c.sentence_index for c in chunks)
    for index, sentence in enumerate(["One sentence here.", "Another one there.", "And a third one."]):
        got = np.concatenate([c.samples for c in chunks if c.sentence_index == index and not c.pause])
        np.testing.assert_allclose(got, await expected_sentence_audio(synth, sentence, 4, index), atol=1e-6)


class FailsOnSecond(ScriptedGenerator):
    async def stream(self, prompt, opts, request_id):
        async for delta in super().stream(prompt, opts, request_id):
            if request_id.endswith("-1") and self.steps > 30:
                raise RuntimeError("device lost")
            yield delta


async def test_a_failure_in_the_sentence_rendered_ahead_comes_after_the_audio_before_it():
    synth, _ = lone(generator=FailsOnSecond(IDS, tokens_per_sentence=120, delay_s=0.001))
    req = SynthesisRequest("First one is fine. Second one breaks.", options=SamplingOptions(seed=4))
    got = []
    with pytest.raises(Exception, match="device lost"):
        async for chunk in synth.synthesize(req):
            got.append(chunk)
    first = [c for c in got if c.sentence_index == 0]
    assert sum(len(c.samples) for c in first) == 120 * 320 and first[-1].sentence_end
    assert all(c.sentence_index == 0 or c.pause for c in got)


async def test_leaving_a_lone_request_early_stops_both_sentences():
    synth, gen = lone(tokens=3000, delay=0.002)
    req = SynthesisRequest("A long first sentence. A long second one.", options=SamplingOptions(seed=2))
    await leave_after_the_first_chunk(synth, gen, req)
    assert {f"{req.request_id}-0", f"{req.request_id}-1"} <= gen.aborted
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_warm_up_runs_two_short_sentences_unheard_then_events_flow_again():
    """Synthesizer.warm_up: one request of two sentences, each cut to a first and a last window's tokens, whose
    events reach no one; the sink is back for the next request."""
    from engine.pipeline import WARM_UP_TEXT

    events, asked = [], {}
    synth, gen = make(tokens=500, events=events)
    stream = gen.stream

    def recorded(prompt, opts, request_id):
        asked[request_id] = opts.max_tokens
        return stream(prompt, opts, request_id)

    gen.stream = recorded
    seconds = await synth.warm_up()
    assert seconds > 0 and events == [] and WARM_UP_TEXT.count(".") == 2
    schedule = synth.schedule
    tokens = schedule.first_new + schedule.right_context(0) + schedule.new
    assert {k: v for k, v in asked.items() if k.startswith("warm-up")} == {"warm-up-0": tokens, "warm-up-1": tokens}
    assert synth.active_requests == 0
    await synth.render(SynthesisRequest("Now it counts.", options=SamplingOptions(seed=1, max_tokens=40)))
    assert any(isinstance(e, RequestStarted) for e in events) and any(isinstance(e, FirstAudio) for e in events)


async def test_the_factory_warms_up_inside_a_running_loop_and_reports_a_failed_warm_up_as_a_notice(tmp_path):
    """build_synthesizer(warm_up=True) runs the warm-up on a loop of its own (`say` builds inside its loop): one
    notice and its timed phase, no request events. A bank without the default voice (the bench's) warms up with its
    first voice by name. A warm-up that fails (here no voice at all) is a notice, not an error: the engine is still
    handed over."""
    from engine.events import Notice, StartupPhase
    from engine.factory import EngineConfig, build_synthesizer

    events = []

    def notices():
        assert [e.name for e in events if isinstance(e, StartupPhase)] == ["warm_up"]
        return [e for e in events if not isinstance(e, StartupPhase)]

    synth = build_synthesizer(EngineConfig(backend="fake", warm_up=True), events=events.append)
    said = notices()
    assert [type(e) for e in said] == [Notice] and said[0].message.startswith("warmed up with one request in")
    assert [r for r in synth.generator.started if r.startswith("warm-up")] == ["warm-up-0", "warm-up-1"]
    await synth.render(SynthesisRequest("After the warm-up.", options=SamplingOptions(seed=2, max_tokens=30)))
    events.clear()
    from engine.bench import write_voice

    for name in ("zed", "bench"):
        write_voice(tmp_path / "own", name)
    build_synthesizer(EngineConfig(backend="fake", warm_up=True, voices=VoiceBank([tmp_path / "own"])),
                      events=events.append)
    said = notices()
    assert [type(e) for e in said] == [Notice] and said[0].message.startswith("warmed up"), said[0].message
    events.clear()
    build_synthesizer(EngineConfig(backend="fake", warm_up=True, voices=VoiceBank([tmp_path])), events=events.append)
    said = notices()
    assert [type(e) for e in said] == [Notice]
    assert said[0].message.startswith("warm-up request failed: VoiceNotFound"), said[0].message
    events.clear()
    build_synthesizer(EngineConfig(backend="fake"), events=events.append)  # None: not on a CPU-only engine
    assert events == []


def test_the_fake_decoder_states_its_capabilities():
    decoder = ToneDecoder()
    assert isinstance(decoder, CodecDecoder) and decoder.batch_limit > 1 and not decoder.fixed_shapes
    synth = Synthesizer(ScriptedGenerator(IDS), decoder, SparkGrammar(IDS, encode), VoiceBank())
    assert synth.batcher.max_batch == decoder.batch_limit and not synth.batcher.one_length


def test_a_schedule_swapped_in_for_a_block_widens_to_its_lengths_and_comes_back():
    from engine.batching import lengths_for
    from engine.windowing import WindowSchedule

    class GraphDecoder(ToneDecoder):
        fixed_shapes = True

    other = WindowSchedule(first_new=8)
    synth = Synthesizer(ScriptedGenerator(IDS), GraphDecoder(), SparkGrammar(IDS, encode), VoiceBank())
    with synth.scheduled(other) as lengths:
        assert synth.schedule == other and lengths == lengths_for(other) != lengths_for(WindowSchedule())
    assert synth.schedule == WindowSchedule() and synth.use_schedule(WindowSchedule()) == lengths_for(WindowSchedule())
    plain = Synthesizer(ScriptedGenerator(IDS), ToneDecoder(), SparkGrammar(IDS, encode), VoiceBank())
    assert plain.use_schedule(other) == () and plain.schedule == other
