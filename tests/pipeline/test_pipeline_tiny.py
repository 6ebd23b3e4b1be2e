"""The real pipeline on the tiny synthetic checkpoint: torch generator + our BiCodec decoder, on CPU."""
import numpy as np
import pytest

from engine.backends.base import DecodeItem
from engine.config import SamplingOptions, SynthesisRequest
from engine.crossfade import fade_edges
from engine.events import FirstAudio, RequestFinished
from engine.factory import EngineConfig, build_synthesizer
from engine.pipeline import sentence_seed
from engine.prompt import build_globals_prompt
from engine.seams import seam_error_db
from engine.tokens import parse_all

SEAM_TOLERANCE_DB = -40.0
"""Streaming vs one-shot decode: worst seam error relative to the signal RMS (see docs/decoder-context.md), with the
decoder in fp32 (a bf16 decoder's own rounding is larger: tests/model/test_decoder_precision.py bounds it)."""


@pytest.fixture(scope="module")
def synth(tiny_model, tmp_path_factory):
    events = []
    s = build_synthesizer(EngineConfig(model=str(tiny_model), backend="torch", threads=2, decoder_dtype="fp32",
                                       cache_dir=str(tmp_path_factory.mktemp("cache"))), events=events.append)
    s.test_events = events
    return s


async def one_shot(synth, text, seed, index, voice, max_tokens):
    globals_ = await synth.voice_globals(voice)
    prompt = build_globals_prompt(text, globals_, synth.grammar.token_ids, synth.grammar.encode)
    opts = SamplingOptions(seed=sentence_seed(seed, index), max_tokens=max_tokens)
    ids = [t async for d in synth.generator.stream(prompt, opts, "oneshot") for t in d]
    codes, _ = parse_all(ids, synth.grammar.token_ids)
    (pcm,) = synth.decoder.decode([DecodeItem(tuple(codes), globals_)])
    fade = int(synth.join.fade_s * synth.sample_rate)
    return fade_edges(pcm, fade, fade), len(codes)


async def test_stream_equals_one_shot_decode_of_the_same_tokens(synth):
    opts = SamplingOptions(seed=11, max_tokens=150)
    req = SynthesisRequest("Streaming must match the offline decode.", voice="leo", options=opts)
    chunks = [c async for c in synth.synthesize(req)]
    assert len(chunks) >= 3, "expected several windows"
    got = np.concatenate([c.samples for c in chunks])
    want, n_codes = await one_shot(synth, req.text, 11, 0, "leo", 150)
    assert n_codes > 100 and len(got) == len(want) == n_codes * 320
    assert np.isfinite(got).all() and 0.001 < float(np.sqrt(np.mean(want ** 2))) < 0.9
    assert seam_error_db(got, want) <= SEAM_TOLERANCE_DB


async def test_real_pipeline_reports_first_audio_and_rtf(synth):
    synth.test_events.clear()
    audio = await synth.render(SynthesisRequest("One. Two.", options=SamplingOptions(seed=1, max_tokens=40)))
    first = [e for e in synth.test_events if isinstance(e, FirstAudio)]
    done = [e for e in synth.test_events if isinstance(e, RequestFinished)]
    assert len(first) == 1 and 0 < first[0].ttfa_s < 30
    assert done[-1].audio_s == pytest.approx(len(audio) / 16000) and done[-1].rtf > 0


async def test_same_seed_bit_identical_and_voices_differ(synth):
    opts = SamplingOptions(seed=4, max_tokens=40)
    a = await synth.render(SynthesisRequest("Same again.", voice="ava", options=opts))
    b = await synth.render(SynthesisRequest("Same again.", voice="ava", options=opts))
    c = await synth.render(SynthesisRequest("Same again.", voice="max", options=opts))
    assert a.tobytes() == b.tobytes()
    assert len(c) and not np.array_equal(a[: len(c)], c[: len(a)])
