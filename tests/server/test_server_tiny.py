"""The server on the tiny synthetic checkpoint (torch on CPU): audio through the socket equals the in-process render."""
import asyncio
import json
import os
from pathlib import Path

import pytest
import soundfile

from engine.config import SamplingOptions, SynthesisRequest
from engine.factory import EngineConfig, build_synthesizer
from tests.cli_helpers import voicectl
from tests.server.conftest import ThreadServer, same_audio, start_serve
from voiceapp.server.client import RemoteSynthesizer
from voiceapp.audio.wavout import write_wav


def tiny_config(model, cache):
    return EngineConfig(model=str(model), backend="torch", threads=2, cache_dir=str(cache))


async def test_remote_equals_in_process_on_the_tiny_checkpoint(tiny_model, sock_path, tmp_path):
    server = ThreadServer(Path(sock_path), tiny_config(tiny_model, tmp_path / "cache"))
    try:
        opts = SamplingOptions(seed=9, max_tokens=60)
        remote = await RemoteSynthesizer.connect(server.path)
        assert remote.info["backend"] == "torch" and remote.info["model"]["path"] == str(tiny_model)
        got = await remote.render(SynthesisRequest("The first one. And a second.", voice="mia", options=opts))
        await remote.close()
    finally:
        server.stop()
    local = build_synthesizer(tiny_config(tiny_model, tmp_path / "cache"))
    want = await local.render(SynthesisRequest("The first one. And a second.", voice="mia", options=opts))
    await local.close()
    assert len(want) > 16000 * 2 and got.tobytes() == want.tobytes()


@pytest.mark.slow
def test_say_cli_through_serve_equals_in_process_on_the_tiny_checkpoint(tiny_model, sock_path, tmp_path):
    env = {"VOICEAPP_SOCKET": sock_path}
    model = ["--model", str(tiny_model), "--backend", "torch", "--threads", "2"]
    proc = start_serve(*model, env=env)
    try:
        via = voicectl("say", "Short.", "--seed", "2", "--voice", "ava", *model, "--out", str(tmp_path / "a.wav"),
                       "--json", env=env)
        assert via.returncode == 0, via.stderr.decode()
        assert json.loads(via.stdout)["server_pid"] == proc.pid
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert not os.path.exists(sock_path)
    local = build_synthesizer(EngineConfig(model=str(tiny_model), backend="torch", threads=2))
    try:
        request = SynthesisRequest("Short.", voice="ava", options=SamplingOptions(seed=2))
        subtype = soundfile.info(str(tmp_path / "a.wav")).subtype  # whatever `say --out` writes
        asyncio.run(write_wav(local.synthesize(request), tmp_path / "b.wav", local.sample_rate, subtype=subtype))
    finally:
        asyncio.run(local.close())
    assert same_audio(tmp_path / "a.wav", tmp_path / "b.wav")
