"""Fault injection: the audio server dies (or freezes) while `say` plays. The command must end by itself with one
line and a non-zero status, and a Ctrl-C meanwhile must end it within seconds, whatever state PortAudio is in: just
after the server was killed, or while it is stopped, in-process and on the lean road through a warm server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.audio.test_lean_say import warm_server  # noqa: F401  (the lean road's warm server)

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


# Issue 41 #14: a Ctrl-C that lands while PortAudio is stuck on a dead or frozen audio server. The player's abort and
# close (and the barge-in clear a cancelled request runs) used to run on the main thread, where they blocked for good,
# and with them the signal; they now run on a daemon thread that `say` waits for only a bounded while.

ENDS_WITHIN_S = 15.0
"""How long `say` may take from the Ctrl-C to its exit: the player's bounded waits are 1.5 s each, the rest is a
loaded two-core machine's slack. A hang is forever, so the bound only has to be finite."""


def _assert_ctrl_c_ends_say(server, proc: subprocess.Popen) -> None:
    """SIGINT `proc` (already sent whatever hit its audio server): it must end within ENDS_WITHIN_S with 130 or one
    line and a non-zero status, never a traceback."""
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"say ignored Ctrl-C for {ENDS_WITHIN_S:g} s: {err.decode()}") from None
    text = err.decode().strip()
    assert proc.returncode != 0 and "Traceback" not in text, text
    assert text.splitlines()[-1].startswith("voicectl: "), text
    assert proc.returncode == 130 or "audio" in text.splitlines()[-1], (proc.returncode, text)
    assert time.monotonic() - t0 < ENDS_WITHIN_S


def _start_say(server, tiny_model, lean_env: dict[str, str] | None) -> subprocess.Popen:
    """`say` playing into the private server's sink: in-process, or through the warm server in `lean_env`."""
    env = {**os.environ, **server.env, "PULSE_SINK": "doomed", **(lean_env or {})}
    road = [] if lean_env else ["--no-server", "--backend", "torch"]
    args = [sys.executable, "-m", "voiceapp.cli", "say", TEXT, "--model", str(tiny_model), "--seed", "2",
            "--max-tokens", "400", *road]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.fixture(params=["in-process", "lean"])
def road(request, tiny_model):
    """None for `--no-server`, else the environment of a warm server (the lean road)."""
    if request.param == "in-process":
        return None
    env, _ = request.getfixturevalue("warm_server")
    return env


@pytest.mark.serial  # with the other core busy, say's own verdict can beat the Ctrl-C and it exits as SIGINT lands
@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_ctrl_c_just_after_the_audio_server_is_killed_ends_say(private_pulse, tiny_model, road, delay_s) -> None:
    server = private_pulse({"doomed": 16000})
    proc = _start_say(server, tiny_model, road)
    try:
        _wait_until_playing(server, proc)
        server.proc.kill()
        time.sleep(delay_s)
        _assert_ctrl_c_ends_say(server, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_while_the_audio_server_is_frozen_ends_say(private_pulse, tiny_model, road) -> None:
    server = private_pulse({"doomed": 16000})
    proc = _start_say(server, tiny_model, road)
    try:
        _wait_until_playing(server, proc)
        server.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # the stream's host buffer runs out; PortAudio's thread now waits on the frozen server
        _assert_ctrl_c_ends_say(server, proc)
    finally:
        server.proc.send_signal(signal.SIGCONT)  # or the fixture's SIGTERM would never be acted on
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_say_ends_by_itself_with_one_line_when_the_audio_server_freezes(private_pulse, tiny_model, road) -> None:
    """No Ctrl-C: the player notices no callback came for its stall timeout (5 s), and its close must not block on
    the frozen server either."""
    server = private_pulse({"doomed": 16000})
    proc = _start_say(server, tiny_model, road)
    try:
        _wait_until_playing(server, proc)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            _, err = proc.communicate(timeout=5 + ENDS_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("say hangs while the audio server is frozen") from None
    finally:
        server.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode().strip()
    assert proc.returncode not in (0, 130) and "Traceback" not in text, (proc.returncode, text)
    assert text.splitlines()[-1].startswith("voicectl: ") and "audio" in text.splitlines()[-1], text


# Issue 41, the start-up part: the audio server frozen before `say` starts. PortAudio's start (Pa_Initialize, in
# `import sounddevice`), the device check and the stream's open all wait on the server; they ran on the main thread
# without a bound, and `say` hung for good, deaf to Ctrl-C.

FROZEN_LINE = "voicectl: the audio output does not answer (is the sound server frozen?); "


@pytest.mark.serial  # the Ctrl-C one second in must come before say's verdict, which a busy second core brings on
@pytest.mark.parametrize("ctrl_c", [False, True], ids=["by-itself", "ctrl-c"])
def test_say_started_against_a_frozen_audio_server_ends_promptly(private_pulse, tiny_model, road, ctrl_c) -> None:
    """By itself: one line saying the audio output does not answer, suggesting --out, and a non-zero exit within
    ENDS_WITHIN_S. With a Ctrl-C one second in: exit 130 within ENDS_WITHIN_S, no traceback."""
    server = private_pulse({"doomed": 16000})
    server.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        proc = _start_say(server, tiny_model, road)
        try:
            if ctrl_c:
                time.sleep(1.0)
                proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=ENDS_WITHIN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(f"say hung for {ENDS_WITHIN_S:g} s against a frozen audio server "
                                     f"(Ctrl-C: {ctrl_c}): {err.decode()}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        took = time.monotonic() - t0
    finally:
        server.proc.send_signal(signal.SIGCONT)  # or the fixture's SIGTERM would never be acted on
    text = err.decode().strip()
    assert "Traceback" not in text and took < ENDS_WITHIN_S, (took, text)
    if ctrl_c:
        assert proc.returncode == 130 and text.splitlines()[-1] == "voicectl: interrupted", (proc.returncode, text)
    else:
        assert proc.returncode not in (0, 130), (proc.returncode, text)
        assert len(text.splitlines()) == 1 and text.startswith(FROZEN_LINE) and "--out FILE.wav" in text, text


OPEN_AFTER_FREEZE = """
import sys, time
from engine.backends.sounddevice_sink import Player, import_sounddevice
from engine.errors import AudioDeviceError
from voiceapp.audio.lean_player import LeanPlayer
import_sounddevice()  # PortAudio started while the server answered
print("ready", flush=True)
sys.stdin.readline()  # the server is frozen now
t0 = time.monotonic()
try:
    (Player if sys.argv[1] == "Player" else LeanPlayer)(16000)
except AudioDeviceError as err:
    print(round(time.monotonic() - t0, 1), err, flush=True)
"""
"""A process that starts PortAudio, waits until told the audio server is frozen, then opens a player."""


@pytest.mark.parametrize("player", ["Player", "LeanPlayer"])
def test_a_player_opened_once_the_audio_server_froze_says_so_within_its_bound(private_pulse, player) -> None:
    """PortAudio started before the freeze: the device check and the stream's open are what wait on the server
    (portaudio_calls.OPEN_WAIT_S each at most), and the player says the output does not answer."""
    server = private_pulse({"doomed": 16000})
    env = {**os.environ, **server.env, "PULSE_SINK": "doomed"}
    proc = subprocess.Popen([sys.executable, "-c", OPEN_AFTER_FREEZE, player], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"ready\n", proc.stderr.read()
        server.proc.send_signal(signal.SIGSTOP)
        try:
            out, err = proc.communicate(b"go\n", timeout=ENDS_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{player}() hangs on a frozen audio server") from None
    finally:
        server.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    took, message = out.decode().strip().split(" ", 1)
    assert message.startswith(FROZEN_LINE.removeprefix("voicectl: ")) and float(took) < 2 * 4.0 + 1, out
