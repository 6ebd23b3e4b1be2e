"""`voicectl say` through a warm server on the lean road (voiceapp.cli.lean_say): real PortAudio playback into the
PulseAudio null sink, captured back.

The speakers must get exactly what `--out` writes for the same text, voice and seed; until the first audio is
queued the process must not have imported numpy, asyncio or any of the engine's heavy parts (checked from inside a
real `voicectl say` process); Ctrl-C must silence it at once, as on the full road.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests import cli_helpers
from tests.audio.test_say_e2e import assert_played_equals_file
from tests.server.conftest import start_serve

TEXT = "The lean road plays this. A second sentence checks the join!"
VOICE = ["--voice", "leo", "--seed", "5", "--max-tokens", "60"]
HEAVY = ("numpy", "asyncio", "torch", "soundfile", "soxr", "engine.pipeline", "engine.factory", "engine.types",
         "engine.ringbuffer", "voiceapp.server.client", "voiceapp.server.autostart", "engine.backends.sounddevice_sink")
"""What must not be imported before the first audio is queued."""

PROBE = """
import json, os, sys
from voiceapp.audio import lean_player
seen = {}
def noting(write):
    def first_write(self, data):
        seen.setdefault("modules", sorted(sys.modules))
        return write(self, data)
    return first_write
lean_player.LeanPlayer.write = noting(lean_player.LeanPlayer.write)
lean_player.FloatWav.write = noting(lean_player.FloatWav.write)
from voiceapp.cli import main
code = main(sys.argv[1:])
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump(seen, f)
sys.exit(code)
"""
"""`python -c PROBE say ...`: voicectl's own main, with the player's (or --out file's) first write noting
sys.modules."""


@pytest.fixture(scope="module")
def warm_server(tiny_model):
    """`voicectl serve` on a private socket; the environment a client needs to use it."""
    d = Path(tempfile.mkdtemp(prefix="vl-"))
    sock = d / "engine.sock"
    env = {"VOICEAPP_NO_SERVER": "0", "VOICEAPP_SOCKET": str(sock)}
    proc = start_serve("--model", str(tiny_model), "--backend", "torch", "--socket", str(sock), env=env)
    try:
        yield env, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        cli_helpers.kill_servers(sock)


@pytest.mark.audio
def test_lean_say_plays_what_out_writes_and_imports_nothing_heavy_first(pulse_server, record_monitor, tiny_model,
                                                                       warm_server, tmp_path):
    env, server_pid = warm_server
    out = tmp_path / "ref.wav"
    made = cli_helpers.voicectl("say", TEXT, *VOICE, "--model", str(tiny_model), "--out", str(out), env=env)
    assert made.returncode == 0, made.stderr.decode()
    wav, _ = sf.read(out, dtype="float32")
    probe_out = tmp_path / "probe.json"
    with record_monitor("tts16") as cap:
        proc = subprocess.run([sys.executable, "-c", PROBE, "say", TEXT, *VOICE, "--model", str(tiny_model),
                               "--json"], capture_output=True, timeout=120,
                              env={**os.environ, **env, "PROBE_OUT": str(probe_out)})
    assert proc.returncode == 0, proc.stderr.decode()
    stats = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert stats["server_pid"] == server_pid and stats["underruns"] == 0 and stats["sentences"] == 2
    assert 0 < stats["phases"]["queued"] < 1000 * 30 and stats["onset_ms"] >= stats["ttfa_ms"] > 0
    modules = json.loads(probe_out.read_text())["modules"]
    assert "voiceapp.cli.lean_say" in modules and "sounddevice" in modules
    assert not [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY], "imported before the first audio"
    assert_played_equals_file(cap(), wav)


def test_lean_out_writes_the_in_process_samples_and_imports_nothing_heavy_first(tiny_model, warm_server, tmp_path):
    """`say --out` through the warm server (what the start-up bench's say_server_s times) writes the samples an
    in-process engine writes, a complete float WAV, without numpy before its first audio."""
    env, server_pid = warm_server
    ref, out, probe_out = tmp_path / "ref.wav", tmp_path / "out.wav", tmp_path / "probe.json"
    made = cli_helpers.voicectl("say", TEXT, *VOICE, "--model", str(tiny_model), "--out", str(ref), "--no-server")
    assert made.returncode == 0, made.stderr.decode()
    proc = subprocess.run([sys.executable, "-c", PROBE, "say", TEXT, *VOICE, "--model", str(tiny_model), "--out",
                           str(out), "--json"], capture_output=True, timeout=120,
                          env={**os.environ, **env, "PROBE_OUT": str(probe_out)})
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout.decode().strip().splitlines()[-1])["server_pid"] == server_pid
    modules = json.loads(probe_out.read_text())["modules"]
    assert not [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY], "imported before the first audio"
    (want, want_rate), (got, got_rate) = sf.read(ref, dtype="float32"), sf.read(out, dtype="float32")
    assert sf.info(str(out)).subtype == "FLOAT" and got_rate == want_rate and np.array_equal(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav", "probe.json", "ref.wav"]  # no partial file


@pytest.mark.audio
@pytest.mark.serial
def test_ctrl_c_on_the_lean_road_silences_at_once_and_exits_130(pulse_server, record_monitor, tiny_model,
                                                                warm_server):
    env, _ = warm_server
    args = [sys.executable, "-m", "voiceapp.cli", "say", "A long sentence that keeps talking. " * 4, "--model",
            str(tiny_model), "--seed", "2", "--max-tokens", "400"]
    with record_monitor("tts16") as cap:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and np.count_nonzero(np.fromfile(cap.path, np.float32)) < 16000:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        at_signal = cap.frames_so_far()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        time.sleep(0.3)
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode() and "voicectl: interrupted" in err.decode()
    nonzero = np.flatnonzero(cap()[at_signal:])
    tail_ms = (nonzero[-1] + 1) / 16 if len(nonzero) else 0.0
    assert tail_ms <= 110, f"sound went on for {tail_ms:.0f} ms after Ctrl-C"
