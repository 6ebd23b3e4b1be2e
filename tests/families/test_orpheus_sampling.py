"""Orpheus's sampling reaches the generator: the tiny checkpoint in process (torch generator, CPU) speaks with
upstream's temperature, top-p and repetition penalty where the request kept the defaults, with the request's own
penalty where it set one, and the same seed gives the same audio with the penalty on."""
from __future__ import annotations

import numpy as np

from engine.config import SamplingOptions, SynthesisRequest
from engine.factory import EngineConfig, build_synthesizer


async def test_the_tiny_model_speaks_with_upstreams_penalty(orpheus_tiny, tmp_path) -> None:
    synth = build_synthesizer(EngineConfig(model=str(orpheus_tiny), backend="torch", device="cpu", quantize="none",
                                           threads=1, cache_dir=str(tmp_path), warm_up=False, freeze_heap=False))
    asked: list[SamplingOptions] = []
    stream = synth.generator.stream

    def recorded(prompt, opts, request_id):
        asked.append(opts)
        return stream(prompt, opts, request_id)

    synth.generator.stream = recorded

    async def speak(**options) -> np.ndarray:
        req = SynthesisRequest("Hello there.", voice="tara", options=SamplingOptions(seed=5, max_tokens=80, **options))
        return np.concatenate([c.samples async for c in synth.synthesize(req)])

    try:
        first, again = await speak(), await speak()
        assert synth.sample_rate == 24000 and len(first) > 0 and np.array_equal(first, again)
        assert {(o.temperature, o.top_p, o.repetition_penalty) for o in asked} == {(0.6, 0.8, 1.3)}
        asked.clear()
        await speak(repetition_penalty=1.1)
        assert {o.repetition_penalty for o in asked} == {1.1}
    finally:
        await synth.close()
