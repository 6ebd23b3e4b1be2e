"""A server answers before its tuning is done: the tuned part is swapped in between sentences, a request in flight
carries on, and `status` shows the progress (engine.tuning on an EngineServer)."""
from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from engine.config import SamplingOptions, SynthesisRequest
from engine.factory import EngineConfig
from engine.fakes import ScriptedGenerator
from engine.tuning import Tuning, TuningStep
from tests.cli_helpers import voicectl
from tests.server.conftest import ThreadServer, start_serve
from voiceapp.server.client import RemoteSynthesizer

TEXT = " ".join(f"Sentence number {i} is here." for i in range(6))


def test_a_tuned_generator_takes_the_next_sentences_and_the_request_in_flight_finishes(sock_path) -> None:
    server = ThreadServer(Path(sock_path), EngineConfig(backend="fake"))
    try:
        synth = server.synth
        old, new = synth.generator, ScriptedGenerator(synth.generator.token_ids, delay_s=0.002)
        release = threading.Event()

        async def swap(generator):
            synth.swap_generator(generator)

        server.server.tuning = Tuning([TuningStep("lane", lambda: release.wait(10) and new, swap)])

        async def request_across_the_swap():
            remote = await RemoteSynthesizer.connect(Path(sock_path))
            chunks, swapped = 0, False
            async for _ in remote.synthesize(SynthesisRequest(TEXT, options=SamplingOptions(seed=3))):
                chunks += 1
                if chunks == 3 and not swapped:
                    assert server.status()["tuning"]["steps"][0]["state"] == "running"
                    release.set()
                    swapped = True
            await remote.close()
            return chunks

        tuning = asyncio.run_coroutine_threadsafe(server.server.tuning.run(), server.loop)
        chunks = asyncio.run(request_across_the_swap())
        tuning.result(10)
        assert chunks > 6 and server.status()["tuning"]["done"]
        assert old.started and new.started  # the first sentences on the old generator, later ones on the new
        assert not set(new.started) & set(old.started)
    finally:
        server.stop()


def test_status_shows_tuning_and_an_engine_without_a_gpu_has_none_to_do(sock_path, tiny_model) -> None:
    env = {"VOICEAPP_SOCKET": sock_path}
    proc = start_serve("--model", str(tiny_model), "--threads", "2", env=env)
    try:
        status = json.loads(voicectl("status", "--json", env=env).stdout)
        assert status["tuning"] == {"done": True, "seconds": status["tuning"]["seconds"], "steps": [],
                                    "yielded_s": 0.0, "pieces": {"count": 0, "seconds": 0.0, "longest_ms": []}}
        text = voicectl("status", env=env).stdout.decode()
        assert "tuning: done" in text
    finally:
        proc.kill()
        proc.wait()


def test_a_server_on_an_explicit_backend_runs_its_short_window_step_and_no_tune_none(sock_path, tiny_model) -> None:
    """`--backend torch` builds nothing for crowds, yet runs the short windows' step (engine.tuning
    short_window_tuning: empty here, on a CPU decoder that takes any shape); `--no-tune` runs no step at all."""
    env = {"VOICEAPP_SOCKET": sock_path}
    for flags, tunes in ((), True), (("--no-tune",), False):
        proc = start_serve("--model", str(tiny_model), "--threads", "2", "--backend", "torch", *flags, env=env)
        try:
            status = json.loads(voicectl("status", "--json", env=env).stdout)
            assert ("tuning" in status) == tunes, flags
            if tunes:
                assert status["tuning"]["done"] and status["tuning"]["steps"] == []
        finally:
            proc.kill()
            proc.wait()
