"""Using the engine from Python, as engine/__init__.py and the README's "Use it from Python" show it: build an
engine, render a sentence, stream one, listen to its events, and meet its errors. The fake backend needs no model;
the last test runs the tiny synthetic Orpheus checkpoint the family tests write."""
import asyncio

import numpy as np
import pytest

import engine
from engine import (EngineConfig, FirstAudio, RequestFinished, SamplingOptions, SynthesisRequest, VoiceError,
                    build_synthesizer)


def test_render_a_sentence_to_an_array():
    synth = build_synthesizer(EngineConfig(backend="fake"))
    audio = asyncio.run(synth.render(SynthesisRequest("Hello there.", options=SamplingOptions(seed=1))))
    assert audio.dtype == np.float32 and len(audio) > synth.sample_rate // 10


def test_stream_chunks_and_events():
    seen = []
    synth = build_synthesizer(EngineConfig(backend="fake"), events=seen.append)

    async def stream() -> list:
        return [chunk async for chunk in synth.synthesize(SynthesisRequest("One. Two."))]

    chunks = asyncio.run(stream())
    assert {c.sentence_index for c in chunks} == {0, 1} and all(c.sample_rate == synth.sample_rate for c in chunks)
    assert any(isinstance(e, FirstAudio) for e in seen) and isinstance(seen[-1], RequestFinished)


def test_errors_are_voice_errors_with_one_line():
    synth = build_synthesizer(EngineConfig(backend="fake"))
    with pytest.raises(VoiceError) as err:
        asyncio.run(synth.render(SynthesisRequest("Hi.", voice="nobody")))
    assert "\n" not in str(err.value) and "nobody" in str(err.value)


def test_the_public_names_are_there_and_nothing_else():
    assert set(engine.__all__) <= set(dir(engine)) | set(engine.__all__)
    for name in engine.__all__:
        assert getattr(engine, name) is not None
    with pytest.raises(AttributeError):
        engine.not_a_name  # noqa: B018


def test_an_orpheus_checkpoint_is_just_another_model(orpheus_tiny):
    assert engine.detect_family(orpheus_tiny).name == "orpheus"
    synth = build_synthesizer(EngineConfig(model=str(orpheus_tiny), backend="torch", threads=1))
    audio = asyncio.run(synth.render(SynthesisRequest("Hi <laugh> there.", voice="zoe",
                                                      options=SamplingOptions(seed=1, max_tokens=70))))
    assert synth.sample_rate == 24000 and len(audio) >= 2048
