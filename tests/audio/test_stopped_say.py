"""`say` stopped with Ctrl-Z (SIGSTOP here) for longer than the player's 5 s stall watchdog, then resumed with `fg`
(SIGCONT), plays on to the end (issue 41): the watchdog counted the time the process itself was stopped and
ended `say` with "the audio output device stopped playing" at once."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tests.server.conftest import start_serve

TEXT = " ".join(f"Sentence number {i} keeps the speakers busy." for i in range(5))
FAKE = ["--backend", "fake", "--voice", "leo", "--seed", "1", "--buffer", "1"]
"""A one-second ring: the player waits on the speakers (its watchdog running) for most of the text."""


@pytest.mark.parametrize("road", ["in-process", "lean"])
def test_say_stopped_for_longer_than_the_watchdog_plays_on_when_resumed(pulse_server, record_monitor, road,
                                                                         tmp_path):
    env = dict(os.environ)
    server = None
    if road == "lean":
        env["VOICEAPP_NO_SERVER"] = "0"  # tests/conftest.py turns servers off unless a test opts back in
        env["VOICEAPP_SOCKET"] = os.path.join(tempfile.mkdtemp(prefix="vs-"), "engine.sock")  # short: 107 bytes
        server = start_serve("--backend", "fake", "--socket", env["VOICEAPP_SOCKET"], env=env)
    args = [sys.executable, "-m", "voiceapp.cli", "say", TEXT, *FAKE, "--json",
            *(["--no-server"] if road == "in-process" else [])]
    try:
        with record_monitor("tts16") as cap:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and np.count_nonzero(np.fromfile(cap.path, np.float32)) < 8000:
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.05)  # half a second of sound has played
            proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(5.5)
            finally:
                proc.send_signal(signal.SIGCONT)
            at_resume = cap.frames_so_far()
            out, err = proc.communicate(timeout=60)
        # ALSA's own line about the underrun the stop caused, and a notice that speech came slowly, may appear
        assert proc.returncode == 0, err.decode()
        assert "stopped playing" not in err.decode() and "Traceback" not in err.decode(), err.decode()
        metrics = json.loads(out)
        assert (metrics["server_pid"] is None) == (road == "in-process"), err.decode()
        assert np.count_nonzero(cap()[at_resume:]) > 16000  # it played on after `fg`
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None:
            server.terminate()
            server.wait(10)
            shutil.rmtree(os.path.dirname(env["VOICEAPP_SOCKET"]), ignore_errors=True)
