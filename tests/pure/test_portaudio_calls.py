"""engine.backends.portaudio_calls.bounded: a call that returns is waited for; one that blocks is left behind within
the bound, and PortAudio's exit handler is dropped so that the interpreter's exit does not wait on it either."""
from __future__ import annotations

import ast
import subprocess
import sys

CHILD = """
import atexit, sys, threading, time
from types import SimpleNamespace
from engine.backends.portaudio_calls import bounded
sd = SimpleNamespace(_exit_handler=lambda: print("exit handler ran", flush=True))
atexit.register(sd._exit_handler)
t0 = time.monotonic()
returned = bounded({call}, sd, name="pa-test", wait_s={wait})
print(returned, round(time.monotonic() - t0, 1), [t.daemon for t in threading.enumerate() if t.name == "pa-test"],
      flush=True)
"""
"""A process that runs one call through `bounded` and exits: what it returned, how long it waited, the daemon flag
of a thread left behind, and whether the exit handler ran."""


def _child(call: str, wait_s: float) -> tuple[bool, float, list[bool], bool]:
    """What the child printed: returned, seconds waited, daemon flags of threads left behind, exit handler ran."""
    proc = subprocess.run([sys.executable, "-c", CHILD.replace("{call}", call).replace("{wait}", str(wait_s))], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    returned, waited, left = lines[0].split(" ", 2)
    return returned == "True", float(waited), ast.literal_eval(left), lines[1:] == ["exit handler ran"]


def test_a_call_that_returns_is_waited_for_and_the_exit_handler_kept() -> None:
    for call in ("lambda: None", "lambda: 1 / 0"):  # a dead stream's error ends the call too
        returned, waited, left, handler_ran = _child(call, 20.0)
        assert returned and waited < 20 and left == [] and handler_ran, call


def test_a_call_that_blocks_is_left_behind_and_the_process_still_exits() -> None:
    """The stuck call's daemon thread stays behind; the exit handler (PortAudio's Pa_Terminate) is dropped, and the
    interpreter exits all the same (within the subprocess timeout)."""
    returned, waited, left, handler_ran = _child("threading.Event().wait", 0.3)
    assert not returned and 0.3 <= waited < 5 and left == [True] and not handler_ran


GUARDED = """
import os, signal, sys, threading, time
from types import SimpleNamespace
from engine.backends.portaudio_calls import guard_exit

def exit_handler():
    print("exit handler ran on", threading.current_thread().name, flush=True)
    if sys.argv[1] == "ctrl-c":
        os.kill(os.getpid(), signal.SIGINT)  # as if Ctrl-C came while Pa_Terminate runs
        time.sleep(20)

import atexit
sd = SimpleNamespace(_exit_handler=exit_handler)
atexit.register(sd._exit_handler)
guard_exit(sd)
guard_exit(sd)  # once a process
"""
"""A process whose stand-in for sounddevice's exit handler runs through `guard_exit`: plainly, or with a Ctrl-C
landing while it runs."""


def test_the_exit_handler_runs_off_the_main_thread_and_a_ctrl_c_meanwhile_ends_quietly() -> None:
    plain = subprocess.run([sys.executable, "-c", GUARDED, "plain"], capture_output=True, text=True, timeout=30,
                           check=False)
    assert plain.returncode == 0 and plain.stdout.splitlines() == ["exit handler ran on portaudio-exit"], plain
    interrupted = subprocess.run([sys.executable, "-c", GUARDED, "ctrl-c"], capture_output=True, text=True,
                                 timeout=15, check=False)  # the handler's 20 s sleep is not waited for
    assert interrupted.stdout.splitlines() == ["exit handler ran on portaudio-exit"], interrupted
    assert "Traceback" not in interrupted.stderr and "Exception ignored" not in interrupted.stderr, interrupted.stderr


ANSWERED = """
import asyncio, os, signal, sys, threading, time
from types import SimpleNamespace
from engine.backends.portaudio_calls import NoAnswer, answer
sd = SimpleNamespace()
print(answer(lambda: 42, sd, name="pa-test"), flush=True)
try:
    answer(lambda: 1 / 0, sd, name="pa-test")
except ZeroDivisionError:
    print("raised again", flush=True)
t0 = time.monotonic()
try:
    answer(threading.Event().wait, sd, name="pa-test", wait_s=0.3)
except NoAnswer:
    print("no answer", round(time.monotonic() - t0, 1), flush=True)

async def main():
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        answer(threading.Event().wait, sd, name="pa-test", wait_s=20)
    except KeyboardInterrupt:
        print("interrupted", round(time.monotonic() - t0, 1), signal.getsignal(signal.SIGINT).func.__name__,
              flush=True)

asyncio.run(main())
"""
"""A process that asks `answer` for a result, an error, a call that never returns, and (under asyncio.run, whose own
SIGINT handler only cancels the task) one that never returns cut short by a Ctrl-C after 0.5 s."""


def test_answer_hands_back_results_and_errors_and_gives_up_within_its_bound_or_at_a_ctrl_c() -> None:
    proc = subprocess.run([sys.executable, "-c", ANSWERED], capture_output=True, text=True, timeout=15, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["42", "raised again", "no answer 0.3", "interrupted 0.5 _on_sigint"], proc
