"""The Engine seam (engine.engine_api): the in-process Synthesizer is one, a server serves any (here one that is
not a Synthesizer) through it alone, and status reports each device an engine computes on."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import numpy as np

from engine.config import SynthesisRequest
from engine.deadlines import Verdict
from engine.engine_api import Engine, device_status
from engine.factory import EngineConfig, build_synthesizer
from engine.types import AudioChunk
from engine.voices import VoiceBank


class Echo:
    """An engine that is not a Synthesizer: one chunk of as many samples as the text has characters."""

    sample_rate = 8000
    voices = VoiceBank()

    def __init__(self) -> None:
        self.closed = False

    async def synthesize(self, req: SynthesisRequest, text_stream=None) -> AsyncIterator[AudioChunk]:
        yield AudioChunk(req.request_id, np.ones(len(req.text), np.float32), self.sample_rate, 0, 0, True)

    def describe(self) -> dict[str, Any]:
        return {"backend": "echo", "model": None, "paced_start": False, "paced_windows_s": [],
                "paced_ahead_windows_s": []}

    def admit(self) -> Verdict:
        return Verdict(True)

    def capacity(self) -> float | None:
        return None

    def status(self) -> dict[str, Any]:
        return {"devices": [{"device": "cpu"}], "replicas": [{"replica": "r1", "live": 0, "capacity": 4,
                                                              "devices": [{"device": "cuda:0"}]}]}

    async def close(self) -> None:
        self.closed = True


def test_the_synthesizer_is_an_engine_and_reports_its_devices() -> None:
    synth = build_synthesizer(EngineConfig(backend="fake"))
    assert isinstance(synth, Engine)
    assert synth.status()["devices"] == [{"device": "cpu"}]
    assert synth.describe()["backend"] == "fake" and synth.describe()["model"] is None
    assert device_status("cpu") == {"device": "cpu"} and device_status("cuda:1") == {"device": "cuda:1"}  # no CUDA


def test_a_server_serves_any_engine_through_the_seam(tmp_path) -> None:
    from voiceapp.cli.status import describe
    from voiceapp.server.engine_server import EngineServer, LiveRequests

    engine = Echo()
    assert isinstance(engine, Engine)

    async def main() -> tuple[dict, list]:
        server = EngineServer(engine, tmp_path / "s.sock", LiveRequests(lambda line: None))
        counts = {"served": 0, "cancelled": 0, "failed": 0}
        chunks = [c async for c in server.stream(SynthesisRequest("hello"), "test", counts)]
        status = server.status()
        await server.close()
        return status, chunks

    status, chunks = asyncio.run(main())
    assert [len(c.samples) for c in chunks] == [5] and engine.closed
    assert status["backend"] == "echo" and status["sample_rate"] == 8000 and status["served"] == 1
    lines = describe({**status, "uptime_s": 1, "socket": "s"})
    assert "device: cpu" in lines and "replicas: 1 on Ray" in lines and "  replica r1: 0 live of 4, on cuda:0" in lines
