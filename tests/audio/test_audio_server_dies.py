"""Fault injection: the audio server dies while `say` plays. The command must end by itself with one line and a
non-zero status, and a Ctrl-C meanwhile must end it within a second, whatever state PortAudio is in."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

TEXT = "A long sentence that keeps talking for a while. " * 4


def test_say_ends_with_one_line_when_the_audio_server_dies_mid_playback(private_pulse, tiny_model) -> None:
    server = private_pulse({"doomed": 16000})
    env = {**os.environ, **server.env, "PULSE_SINK": "doomed"}
    args = [sys.executable, "-m", "voiceapp.cli", "say", TEXT, "--model", str(tiny_model), "--backend", "torch",
            "--seed", "2", "--max-tokens", "400", "--no-server", "--stats"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        _wait_until_playing(server, proc)
        server.proc.kill()  # the daemon dies mid-playback
        server.proc.wait(5)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            try:
                _, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                raise AssertionError("say hangs after the audio server died, and ignores Ctrl-C") from None
            raise AssertionError(f"say hung after the audio server died; Ctrl-C ended it in "
                                 f"{time.monotonic() - t0:.1f} s: {err.decode()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode().strip()
    assert proc.returncode != 0, text
    assert "Traceback" not in text and text.count("voicectl: ") >= 1, text
    assert "audio" in text.splitlines()[-1], text


def _wait_until_playing(server, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the sink has a client stream (say is playing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["pactl", "list", "short", "sink-inputs"], env={**os.environ, **server.env},
                             capture_output=True, text=True)
        if out.stdout.strip():
            time.sleep(1.0)  # a second of playback
            return
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    raise AssertionError("say never started playing")
