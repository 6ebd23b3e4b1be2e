"""voiceapp.cli.quiet_exit in a process of its own: a Ctrl-C once the outcome is known is noted, every exit hook
still runs and what was printed is still written, and the status becomes 130; a second one ends it at once."""
from __future__ import annotations

import subprocess
import sys
import time

CHILD = """
import atexit, os, signal, sys, time
from voiceapp.cli import quiet_exit
quiet_exit.arm()

def hook():
    print("hook started", flush=True)
    if sys.argv[1] != "none":
        os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C lands while an exit hook (Pa_Terminate) runs
    time.sleep(0.2)
    print("hook ended")  # stdout is a pipe: buffered, written only if the exit flushes it
    if sys.argv[1] == "twice":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(20)
        print("never")

atexit.register(hook)
print("outcome")
quiet_exit.HOLD()
sys.exit(0)
"""
"""A process that prints its outcome, holds Ctrl-C as main does, and exits through a slow atexit hook that sends it
no SIGINT, one, or two."""


def _run(ctrl_c: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CHILD, ctrl_c], capture_output=True, text=True, timeout=15,
                          check=False)
    return proc, time.monotonic() - t0


def test_no_ctrl_c_keeps_the_status() -> None:
    proc, _ = _run("none")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "outcome\nhook started\nhook ended\n", ""), proc


def test_a_ctrl_c_at_exit_lets_the_hook_finish_then_exits_130_quietly() -> None:
    proc, _ = _run("once")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "outcome\nhook started\nhook ended\n", ""), proc


def test_a_second_ctrl_c_ends_the_exit_at_once_with_what_was_printed() -> None:
    proc, took = _run("twice")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "outcome\nhook started\nhook ended\n", ""), proc
    assert took < 10  # not the hook's 20 s
