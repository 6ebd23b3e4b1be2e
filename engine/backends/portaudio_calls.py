"""Provides `bounded`: a PortAudio call that may block, run on a daemon thread and waited for only a bounded while.

PortAudio's abort, close and restart of a stream talk to the audio server. With the server killed a moment ago, or
frozen (SIGSTOP), they can block for good. Python runs signal handlers only on the main thread, between bytecodes, so
such a call on the main thread also blocks Ctrl-C. The rule for the players (engine.backends.sounddevice_sink's
Player, voiceapp.lean_player's LeanPlayer): no PortAudio call that can block runs where a signal must be handled.
They hand such calls to `bounded`; the main thread waits on a lock, which a signal interrupts, and gives up after
WAIT_S, leaving the thread behind.

Once a call has been left behind, PortAudio is wedged: sounddevice's exit handler (Pa_Terminate, which closes every
stream still open) would block the interpreter's exit in the same way, so `bounded` drops it. Where nothing was left
behind, `guard_exit` still runs that handler the same bounded way, and a Ctrl-C that lands while it runs ends the
process without a traceback ("Exception ignored in atexit callback"). Standard library only: the lean client
imports this before its first audio, without numpy.
"""
from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable
from typing import Any

WAIT_S = 1.5
"""How long a player waits for a stream's abort, close or restart (a few milliseconds when the audio server is
alive: docs/lab/run-log.md) before it treats the stream as lost and goes on without it."""


def bounded(call: Callable[[], None], sd: Any, *, name: str, wait_s: float = WAIT_S) -> bool:
    """Run `call` on a daemon thread named `name`; True once it returned (or raised), False after `wait_s` without
    an end. A signal's exception (KeyboardInterrupt) that cuts the wait short propagates. Wherever the wait ends
    before the call, the thread may still be inside PortAudio, so sounddevice `sd`'s exit handler is dropped."""
    done = threading.Event()

    def run() -> None:
        try:
            with contextlib.suppress(Exception):  # a dead stream's error: the caller only needs to know it ended
                call()
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    finished = False
    try:
        finished = done.wait(wait_s)
    finally:
        if not finished:
            forsake(sd)
    return finished


_exit = {"guarded": False, "forsaken": False}
"""This process's PortAudio exit: `guard_exit` replaced sounddevice's handler; a call was left behind (no exit
handler then)."""


def forsake(sd: Any) -> None:
    """Leave PortAudio as it is at exit: no Pa_Terminate, which would wait on the call still stuck in it."""
    _exit["forsaken"] = True
    handler = getattr(sd, "_exit_handler", None)  # sounddevice registers it with atexit as it is imported
    if handler is not None:
        atexit.unregister(handler)


def guard_exit(sd: Any) -> None:
    """Run sounddevice `sd`'s exit handler (Pa_Terminate) through `bounded` at exit, and let a Ctrl-C meanwhile end
    the process quietly. Once a process; the players call it as they import sounddevice."""
    handler = getattr(sd, "_exit_handler", None)
    if _exit["guarded"] or handler is None:
        return
    _exit["guarded"] = True
    atexit.unregister(handler)

    def terminate() -> None:
        if _exit["forsaken"]:
            return
        with contextlib.suppress(KeyboardInterrupt):  # the process is ending already: no traceback for it
            bounded(handler, sd, name="portaudio-exit")

    atexit.register(terminate)
