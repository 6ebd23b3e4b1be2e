"""Provides the exit of a `voicectl` process: a Ctrl-C that lands once the command has its outcome ends the process
quietly with 130, after everything its exit does has run, and loses nothing.

The exit is more than the command: main still prints the outcome's line, then the interpreter joins threads
(threading._shutdown) and runs the atexit hooks (PortAudio's Pa_Terminate, engine.backends.portaudio_calls'
guard_exit). Python's SIGINT handler raises KeyboardInterrupt wherever it lands, so one landing there printed a
traceback ("Exception ignored in atexit callback") and left the status the command had. Once main has its
outcome, `HOLD` swaps in `_note`, which only counts the Ctrl-C: the line is still printed, Pa_Terminate still
runs, and `_last` (the first atexit hook registered, so the last to run) ends the process with 130 where one came.
A second Ctrl-C ends it at once (stdout and stderr flushed first): an exit that waits on a thread still hears it.

Only for voicectl's own process (`arm`, as main starts): a caller that runs main in its own process keeps its
signals. Standard library only: the lean `say` imports this before its first audio.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
from typing import Any

import _signal  # type: ignore[import-not-found]  # signal.signal's C function (signal.signal wraps it in Python)

INTERRUPTED = 130
"""The exit status of an interrupted voicectl (the shell's 128 + SIGINT), whether the Ctrl-C came during the
command or at its exit."""

_state = {"armed": False, "noted": 0, "past": False}
"""This process's exit: `arm` ran; the Ctrl-Cs `_note` counted; `_last` ran without one (only the interpreter's
own teardown is left)."""


def arm() -> None:
    """Register `_last` with atexit; first thing in a voicectl process, before any hook of another module, so that it
    runs after all of them (atexit runs its hooks in reverse order). Once a process."""
    if not _state["armed"]:
        _state["armed"] = True
        atexit.register(_last)


def _note(signum: int, frame: Any) -> None:
    """SIGINT once the outcome is known: counted, nothing raised; a second one, or one after `_last`, ends now."""
    _state["noted"] += 1
    if _state["noted"] > 1 or _state["past"]:
        _end_now()


HOLD = functools.partial(_signal.signal, signal.SIGINT, _note)
"""Swap `_note` in. A C call all through (signal.signal is Python, which may raise a pending KeyboardInterrupt as
it starts): CPython 3.11 runs a pending signal's handler as a Python function starts and after a call returns, so
one already pending as HOLD() runs is handled by `_note`, never by the handler it replaces."""


def interrupted() -> bool:
    """Whether a Ctrl-C came since `HOLD`."""
    return _state["noted"] > 0


def _last() -> None:
    """The last atexit hook: every other one has run. With a Ctrl-C noted, the status becomes 130 (the interpreter's
    teardown, which writes nothing of ours, is skipped)."""
    if _state["noted"]:
        _end_now()
    _state["past"] = True


def _end_now() -> None:
    """Exit with INTERRUPTED, what was printed still written out (a pipe's stdout is buffered)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or a reader gone: nothing more to save
            stream.flush()
    os._exit(INTERRUPTED)
