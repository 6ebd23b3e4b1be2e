"""A Ctrl-C that lands as `voicectl say` exits (issue 37): after the command's outcome, while its line is printed,
while the interpreter joins threads or runs its atexit hooks (PortAudio's Pa_Terminate) ends the process quietly
with 130 and loses nothing (voiceapp.cli.quiet_exit). It printed a KeyboardInterrupt traceback ("Exception ignored in
atexit callback") and kept the command's own status.

Deterministic: a real `say` process on the lean road, playing into PulseAudio's null sink, sends itself SIGINT at a
chosen call of its exit path (a profile hook counts every Python and C call from the moment `say`'s run returned).
The product runs as it does for a user; only the moment of the signal is chosen.

Also a `say` that stops before it plays, while PortAudio still starts on its thread: its line kept, no crash.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.audio.test_audio_server_dies import _wait_until_playing
from tests.server.conftest import start_serve

INJECT = """
import os, signal, sys
from voiceapp.cli import main
at, events = os.environ["SIGINT_AT"], os.open(os.environ["EVENTS_OUT"], os.O_WRONLY | os.O_APPEND)
state = {"after": False, "fired": at == "done"}

def exit_path(frame, event, arg):
    if not state["after"]:
        code = frame.f_code
        state["after"] = event == "return" and code.co_name == "run" and code.co_filename.endswith("cli/say.py")
        return
    if event not in ("call", "c_call"):
        return
    name = ("C " + getattr(arg, "__qualname__", "?") if event == "c_call" else
            os.path.basename(frame.f_code.co_filename).removesuffix(".py") + ":" + frame.f_code.co_name)
    hit = not state["fired"] and at == name
    os.write(events, f"{'!' if hit else ' '}{name}\\n".encode())
    if hit:
        state["fired"] = True
        os.kill(os.getpid(), signal.SIGINT)

sys.setprofile(exit_path)
sys.exit(main())  # voicectl's own process: main() reads sys.argv, as the console script runs it
"""
"""`python -c INJECT say ...` with SIGINT_AT (the first call of the exit path to a function named
`file:function`, or `C qualname` for a C function; `done` for none) and EVENTS_OUT (a file: one line per call of
the exit path, the one the signal came at marked `!`)."""

FAKE = ["--backend", "fake", "--voice", "leo", "--seed", "1"]
LEAN_OK = ["say", "Hi.", *FAKE, "--max-tokens", "5", "--json"]
"""A tenth of a second of audio: each run is short."""


@pytest.fixture(scope="module")
def fake_server():
    """A warm server on the fake engine; the environment a client needs to use it (the lean road)."""
    d = tempfile.mkdtemp(prefix="vx-")
    env = {"VOICEAPP_NO_SERVER": "0", "VOICEAPP_SOCKET": os.path.join(d, "engine.sock")}
    server = start_serve("--backend", "fake", "--socket", env["VOICEAPP_SOCKET"], env=env)
    try:
        yield env
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def run_injected(args: list[str], at: str, env: dict[str, str], tmp: Path,
                 started=None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `voicectl ARGS` under INJECT with SIGINT_AT=`at`: the finished process and the exit path's calls.
    `started(proc)`, if given, runs while the process does (what kills its audio server)."""
    events = tmp / f"events-{at.replace(' ', '_').replace(':', '_')}.txt"
    events.write_text("")
    proc = subprocess.Popen([sys.executable, "-c", INJECT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env, "SIGINT_AT": at, "EVENTS_OUT": str(events)})
    try:
        if started is not None:
            started(proc)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())
    return done, events.read_text().splitlines()


def assert_quiet(done: subprocess.CompletedProcess, at: str, allowed: set[str]) -> None:
    """Exit 130, no traceback, voicectl's own lines on stderr only those in `allowed` (ALSA and PortAudio print
    their own about an underrun or a server gone, whatever the exit does)."""
    where = f"SIGINT at {at}: rc {done.returncode}, stderr {done.stderr!r}"
    assert done.returncode == 130, where
    assert not {"Traceback", "Exception ignored", "KeyboardInterrupt"} & set(done.stderr.split()), where
    assert {line for line in done.stderr.splitlines() if line.startswith("voicectl")} <= allowed, where


@pytest.mark.audio
def test_a_ctrl_c_anywhere_in_say_s_exit_ends_it_quietly_with_130(pulse_server, fake_server, tmp_path) -> None:
    """The whole exit path of a `say` that played, one signal per run: at the first call of each function it calls,
    from the command's return to the last atexit hook. The JSON it printed is still there; at most the usual line."""
    done, calls = run_injected(LEAN_OK, "done", fake_server, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    want = json.loads(done.stdout)
    assert want["server_pid"] is not None and want["sentences"] == 1  # the lean road, through the warm server
    names = [line[1:] for line in calls]
    assert {"threading:_shutdown", "portaudio_calls:terminate"} <= set(names), names  # the exit path was watched
    distinct, missed = list(dict.fromkeys(names)), []
    for name in distinct:  # each once, in the order the exit reaches them
        for _ in range(3):  # a wait that found its thread done already takes a shorter path: once more
            done, calls = run_injected(LEAN_OK, name, fake_server, tmp_path)
            if any(line.startswith("!") for line in calls):
                break
        else:
            missed.append(name)
            continue
        assert_quiet(done, name, {"voicectl: interrupted"})
        assert json.loads(done.stdout).keys() == want.keys(), (name, done.stdout)  # nothing printed was lost
    assert not set(missed) & ALWAYS and len(missed) <= len(distinct) // 10, missed


ALWAYS = {"C exit", "threading:_shutdown", "portaudio_calls:terminate", "portaudio_calls:bounded", "quiet_exit:_last"}
"""Calls every exit of a `say` that played makes: each must have been hit."""


@pytest.mark.audio
@pytest.mark.parametrize("at", ["C print", "threading:_shutdown", "portaudio_calls:terminate"])
def test_a_ctrl_c_as_say_exits_after_the_audio_device_stopped_keeps_its_line(private_pulse, fake_server, tmp_path,
                                                                             at) -> None:
    """The issue's case: the audio server dies mid-playback, `say` says the device stopped and exits; a Ctrl-C as it
    prints that line, joins its threads or terminates PortAudio. The line is printed all the same, no traceback,
    exit 130."""
    server = private_pulse({"doomed": 16000})

    def kill_the_audio_server(proc: subprocess.Popen) -> None:
        _wait_until_playing(server, proc)
        server.proc.kill()
        server.proc.wait(5)

    args = ["say", "A long sentence that keeps talking for a while. " * 4, *FAKE]
    done, calls = run_injected(args, at, {**fake_server, **server.env, "PULSE_SINK": "doomed"}, tmp_path,
                               started=kill_the_audio_server)
    assert [line[1:] for line in calls if line.startswith("!")] == [at], calls
    lines = done.stderr.splitlines()
    assert any(line.startswith("voicectl: the audio output device stopped") for line in lines), done.stderr
    device_lines = {line for line in lines if line.startswith("voicectl: the audio output")}
    assert_quiet(done, at, device_lines | {"voicectl: interrupted"})


@pytest.mark.audio
@pytest.mark.parametrize("args, line", [(["say", "   "], "voicectl: the text is empty: nothing to say"),
                                        (["say", "Hi.", "--latency", "0"], "voicectl: --latency 0: must be"),
                                        (["say"], "usage: voicectl say")],
                         ids=["empty text", "bad option", "no text"])
def test_a_say_that_stops_before_it_plays_says_why_and_does_not_crash(pulse_server, args, line) -> None:
    """`say` starts PortAudio first thing, on a thread; one that stops at once (its line printed while Pa_Initialize
    has descriptor 2 pointed at /dev/null, its exit while Pa_Initialize runs) lost the line and crashed (SIGSEGV)
    about half the time."""
    env = {**os.environ, "VOICEAPP_NO_SERVER": "0"}  # the road that starts PortAudio early
    for _ in range(10):
        done = subprocess.run([sys.executable, "-m", "voiceapp.cli", *args], capture_output=True, text=True, env=env,
                              timeout=60)
        assert done.returncode == 2 and done.stderr.startswith(line), (done.returncode, done.stderr)
