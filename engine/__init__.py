"""Provides the voiceapp engine: text in, streamed speech out, for the model families in `engine.families`
(Spark-TTS, Orpheus).

The names a Python user needs are importable from here, loaded on first use so that importing a pure module
(`engine.text`, `engine.config`, ...) stays light:

    import asyncio
    from engine import EngineConfig, SynthesisRequest, build_synthesizer

    synth = build_synthesizer(EngineConfig(model="models/tiny"))
    audio = asyncio.run(synth.render(SynthesisRequest("Hello there.")))   # float32 at synth.sample_rate

`Synthesizer.synthesize(request)` streams `AudioChunk`s as they are made; `events=` on `build_synthesizer` receives
what happens (`FirstAudio`, `RequestFinished`, ...); every failure a user can cause is a `VoiceError` with a one-line
message. Pure modules import no torch, vLLM, sounddevice or Textual; device shells live in `engine.backends` and
are chosen only by `engine.factory`. `tests/test_api.py` is this page, runnable.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EngineConfig": "engine.config", "SynthesisRequest": "engine.config", "SamplingOptions": "engine.config",
    "JoinConfig": "engine.config", "build_synthesizer": "engine.factory", "Synthesizer": "engine.pipeline",
    "AudioChunk": "engine.types", "VoiceError": "engine.errors", "InputError": "engine.errors",
    "ModelNotFound": "engine.errors", "FirstAudio": "engine.events", "FirstToken": "engine.events",
    "RequestFinished": "engine.events", "RequestFailed": "engine.events", "SentenceStarted": "engine.events",
    "Notice": "engine.events", "detect_family": "engine.families", "Engine": "engine.engine_api",
}
"""Public name -> the module that defines it (`detect_family` is engine.families.detect)."""
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    return getattr(module, "detect" if name == "detect_family" else name)
