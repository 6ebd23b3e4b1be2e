"""Orpheus through every front end on the CPU, with the tiny synthetic checkpoint: `say` writes 24 kHz, export is
deterministic and resumes to the same bytes, the voices are the family's, the HTTP API streams its native rate,
HTTP and Wyoming clients get its voices (an OpenAI voice name or none at all included), and a voice of the other
family is refused naming the ones there are."""
import asyncio
import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize

from tests.cli_helpers import kill_servers, one_line_error, voicectl
from tests.export.test_cli_export_book import start_export
from tests.server.conftest import start_serve

TEXT = "Hello there <laugh> my friend. A second sentence follows."


@pytest.fixture(scope="module")
def env(tmp_path_factory, orpheus_tiny):
    root = tmp_path_factory.mktemp("orpheus-e2e")
    return {"VOICEAPP_MODEL": str(orpheus_tiny), "XDG_CACHE_HOME": str(root / "cache"),
            "XDG_DATA_HOME": str(root / "data"), "VOICEAPP_NO_SERVER": "1", "VOICEAPP_SOCKET": str(root / "s.sock")}


def test_say_writes_the_engines_24_khz(env, tmp_path):
    out = tmp_path / "o.wav"
    proc = voicectl("say", TEXT, "--voice", "leo", "--seed", "3", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    audio, rate = soundfile.read(out)
    assert rate == 24000 and len(audio) > 24000 and np.abs(audio).max() > 0.01
    again = tmp_path / "again.wav"
    assert voicectl("say", TEXT, "--voice", "leo", "--seed", "3", "--out", str(again), env=env).returncode == 0
    assert np.array_equal(soundfile.read(again)[0], audio)  # the same seed, the same audio


def test_a_spark_voice_is_refused_naming_orpheus_voices(env, tmp_path):
    err = one_line_error(voicectl("say", "Hi.", "--voice", "ava", "--out", str(tmp_path / "x.wav"), env=env, text=True))
    assert "'ava'" in err and "tara" in err and "zoe" in err


def test_cloning_a_voice_is_refused_naming_the_models_own(env, tmp_path):
    """`voice add` makes Spark speaker tokens; an Orpheus model gets one line naming its voices, and no file."""
    ref = tmp_path / "ref.wav"
    soundfile.write(str(ref), (0.2 * np.sin(np.arange(32000) / 5.0)).astype(np.float32), 16000)
    err = one_line_error(voicectl("voice", "add", "me", "--from", str(ref), env=env, text=True))
    assert "Spark-TTS" in err and "tara" in err
    assert not (Path(env["XDG_DATA_HOME"]) / "voiceapp" / "voices" / "me.toml").exists()


def test_voices_lists_the_familys_voices(env):
    proc = voicectl("voices", env=env, text=True)
    names = {line.lstrip("* ").split()[0] for line in proc.stdout.splitlines()}
    assert proc.returncode == 0 and names == {"tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"}
    assert any(line.startswith("* tara") for line in proc.stdout.splitlines())  # the family's default


def test_a_killed_export_resumes_to_the_same_bytes_at_24_khz(env, orpheus_tiny, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(" ".join(f"Sentence number {i} is right here <sigh>." for i in range(10)))
    engine = ["--max-tokens", "140"]
    clean = tmp_path / "clean.wav"
    assert voicectl("export", str(src), "-o", str(clean), *engine, env=env).returncode == 0
    out, parts = tmp_path / "out.wav", tmp_path / "out.wav.parts"
    proc = start_export(["export", str(src), "-o", str(out), *engine, "--jobs", "3"], parts, at_least=3,
                        start_new_session=True, env={**os.environ, **env})
    os.killpg(proc.pid, signal.SIGKILL)
    proc.stderr.close()
    assert proc.wait(30) == -9 and not out.exists()
    proc = voicectl("export", str(src), "-o", str(out), *engine, "--resume", "--jobs", "1", env=env)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == clean.read_bytes()
    assert soundfile.info(str(clean)).samplerate == 24000


def test_http_and_wyoming_speak_the_familys_voices_at_the_native_24_khz(env, tmp_path):
    served_env = {k: v for k, v in env.items() if k != "VOICEAPP_NO_SERVER"}
    proc = start_serve("--http", "127.0.0.1:0", "--wyoming", "tcp://127.0.0.1:0", env=served_env)
    try:
        url = re.search(r"http://\S+/v1", proc.startup_log).group(0)
        port = int(re.search(r"Wyoming tcp://127\.0\.0\.1:(\d+)", proc.startup_log).group(1))
        for voice in ("tara", "alloy", None):  # ours, an OpenAI name, none: every client's usual request
            request = {"model": "tts-1", "input": "Hello there.", "response_format": "pcm", "seed": 1}
            body = json.dumps(request if voice is None else {**request, "voice": voice}).encode()
            req = urllib.request.Request(f"{url}/audio/speech", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                pcm = np.frombuffer(resp.read(), dtype="<i2")
            assert len(pcm) > 2048 and np.abs(pcm).max() > 0, voice
        with urllib.request.urlopen(f"{url}/audio/voices", timeout=30) as resp:
            voices = json.loads(resp.read())
        assert "tara" in json.dumps(voices) and "ava" not in json.dumps(voices)
        info, (events, audio) = asyncio.run(wyoming_describe_and_speak(port))
        tts = info.tts[0]
        assert {v.name for v in tts.voices} == {"tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"}
        assert all(v.languages == ["en"] for v in tts.voices) and "Orpheus" in tts.attribution.name
        start = AudioStart.from_event(next(e for e in events if AudioStart.is_type(e.type)))
        assert start.rate == 24000 and len(audio) > 2 * 2048, [e.type for e in events]
    finally:
        proc.kill()
        proc.wait()
        kill_servers(served_env["VOICEAPP_SOCKET"])


async def wyoming_describe_and_speak(port: int):
    """Wyoming's describe, then a synthesize naming no voice (Home Assistant's default): the info, the events to
    audio-stop and the audio."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await asyncio.wait_for(client.read_event(), 30))
        await client.write_event(Synthesize(text="Hello there.").event())
        events, audio = [], b""
        while not events or events[-1].type not in ("audio-stop", "error"):
            events.append(await asyncio.wait_for(client.read_event(), 120))
            if AudioChunk.is_type(events[-1].type):
                audio += AudioChunk.from_event(events[-1]).audio
        return info, (events, audio)
