"""Provides `bounded`: a PortAudio call that may block, run on a daemon thread and waited for only a bounded while.

PortAudio's abort, close and restart of a stream talk to the audio server. With the server killed a moment ago, or
frozen (SIGSTOP), they can block for good. Python runs signal handlers only on the main thread, between bytecodes, so
such a call on the main thread also blocks Ctrl-C. The rule for the players (engine.backends.sounddevice_sink's
Player, voiceapp.audio.lean_player's LeanPlayer): no PortAudio call that can block runs where a signal must be handled.
They hand such calls to `bounded`; the main thread waits on a lock, which a signal interrupts, and gives up after
WAIT_S, leaving the thread behind.

Once a call has been left behind, PortAudio is wedged: sounddevice's exit handler (Pa_Terminate, which closes every
stream still open) would block the interpreter's exit in the same way, so `bounded` drops it. Where nothing was left
behind, `guard_exit` still runs that handler the same bounded way, and a Ctrl-C that lands while it runs ends the
process without a traceback ("Exception ignored in atexit callback"). Standard library only: the lean client
imports this before its first audio, without numpy.

Starting PortAudio and opening a stream talk to the audio server too: with the server already frozen when `say`
starts, `import sounddevice` (Pa_Initialize) blocks for good. `load_sounddevice` imports it on one daemon thread a
process (the one `start_loading` may have started early) and waits for it at most LOAD_WAIT_S from that start;
`answer` runs a call whose result or error the caller needs (a device check, a stream's open and start) the same
bounded way. Where either gives up it raises `NoAnswer`, which the players word as FROZEN.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

WAIT_S = 1.5
"""How long a player waits for a stream's abort, close or restart (far longer than a live audio server takes)
before it treats the stream as lost and goes on without it."""


LOAD_WAIT_S = 6.0
"""How long PortAudio's start (`import sounddevice`: Pa_Initialize, which lists the devices) may take, from the
moment it began. Against a healthy PulseAudio it is a small fraction of this; a desktop with many cards takes
longer, so the margin is wide."""

OPEN_WAIT_S = 4.0
"""How long a device check, or a stream's open and start, may take (far less against a healthy PulseAudio)."""

FROZEN = "the audio output does not answer (is the sound server frozen?)"
"""What a player says where PortAudio does not come back in time (the front end adds how to go on without it)."""


class NoAnswer(Exception):
    """A PortAudio call (its start, a check, an open) did not come back within its bound; it is left behind."""


def answer(call: Callable[[], Any], sd: Any, *, name: str, wait_s: float = OPEN_WAIT_S) -> Any:
    """`call()` run on a daemon thread named `name`: its result, or its exception raised again here; NoAnswer after
    `wait_s` without an end (the call left behind, sounddevice `sd`'s exit handler dropped, as in `bounded`). A
    signal's exception (KeyboardInterrupt) that cuts the wait short propagates."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as err:  # noqa: BLE001  (handed to the caller, raised there)
            box.append((False, err))

    with ctrl_c_raises():
        if not bounded(run, sd, name=name, wait_s=wait_s):
            raise NoAnswer(name)
    ok, value = box[0]
    if not ok:
        try:
            raise value
        finally:
            del value
    return value


_load: dict[str, Any] = {"done": threading.Event(), "started": None, "module": None, "error": None, "fd": None,
                         "abandoned": False}
"""This process's import of sounddevice: set once it ended, when it began (time.monotonic), the module or the
import's error, a copy of stderr's descriptor kept while it runs, and whether a wait for it gave up."""
_load_lock = threading.Lock()


def start_loading(own_stderr: bool = False) -> None:
    """Import sounddevice (which starts PortAudio) on a daemon thread, once a process; returns at once.

    sounddevice points descriptor 2 at /dev/null while Pa_Initialize runs (ALSA's chatter). A copy of it is kept
    until the import ends, so that a process that gives up on a Pa_Initialize that never returns can point it back
    (`load_sounddevice`) and still say why it stops. `own_stderr` (a process's own entry point: it replaces
    sys.stderr): sys.stderr writes to a copy of descriptor 2 from now on, so that a line Python prints meanwhile
    (an option's error, an empty text's) is not lost."""
    with _load_lock:
        if _load["started"] is not None:
            return
        _load["started"] = time.monotonic()
        with contextlib.suppress(OSError):
            _load["fd"] = os.dup(2)
        if own_stderr:
            _stderr_on_a_copy()

    def load() -> None:
        try:
            import sounddevice

            _load["module"] = sounddevice
        except BaseException as err:  # noqa: BLE001  (ImportError, OSError: raised again where it is wanted)
            _load["error"] = err
        finally:
            with _load_lock:
                fd, _load["fd"] = _load["fd"], None
                _load["done"].set()
            if fd is not None:
                os.close(fd)

    threading.Thread(target=load, name="portaudio-load", daemon=True).start()
    atexit.register(_settle_loading)


def _stderr_on_a_copy() -> None:
    """Point sys.stderr at a copy of descriptor 2 (same file, same line buffering): Pa_Initialize's redirect of
    descriptor 2 then leaves it alone."""
    old = sys.stderr
    try:
        old.flush()
        copy = os.dup(old.fileno())
    except (AttributeError, OSError, ValueError):  # no stderr, or one without a descriptor: nothing to keep
        return
    sys.stderr = open(copy, "w", buffering=1, encoding=old.encoding, errors=old.errors)


def _settle_loading() -> None:
    """At exit: wait for an import still in flight, WAIT_S at most (a live audio server's Pa_Initialize takes a
    fraction of it; one already given up on is not waited for again). A process that ends while Pa_Initialize runs
    on its thread may crash in it (the C libraries it calls are torn down under it): a `say` that stops before it
    plays (a bad option, an empty text) did."""
    if not _load["abandoned"] and not _load["done"].wait(WAIT_S):
        _gave_up_loading()


def load_sounddevice(wait_s: float = LOAD_WAIT_S) -> Any:
    """The sounddevice module, imported by `start_loading`'s thread (started here if it was not yet); its import
    error raised again here; NoAnswer where it has not ended `wait_s` after it began. On the healthy road a loaded
    module costs nothing more, and one still loading costs a wait on an Event."""
    module = sys.modules.get("sounddevice")
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        return module  # imported already, by whoever
    start_loading()
    done = _load["done"]
    finished = gave_up = False
    try:
        with ctrl_c_raises():
            finished = done.wait(max(0.0, _load["started"] + wait_s - time.monotonic()))
    finally:  # (a Ctrl-C cuts the wait short: stderr must come back for its line all the same)
        gave_up = not finished and _gave_up_loading()
        partial = sys.modules.get("sounddevice")
        if gave_up and partial is not None:
            forsake(partial)  # its exit handler is registered before Pa_Initialize runs
    if gave_up:
        raise NoAnswer("portaudio-load")
    if _load["error"] is not None:
        raise _load["error"]
    return _load["module"]


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """Meanwhile, on the main thread, SIGINT raises KeyboardInterrupt at once (Python's own handler). asyncio.run's
    handler only asks the running task to stop, which a synchronous wait in it would not notice until its bound: a
    Ctrl-C at start-up would then end in the timeout's line rather than exit 130. Elsewhere (another thread, or a
    handler of the program's own), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    current = signal.getsignal(signal.SIGINT)
    asyncio = sys.modules.get("asyncio")  # not imported here: the lean road runs without it
    runner = getattr(getattr(current, "func", None), "__self__", None)  # asyncio.run's partial(Runner._on_sigint)
    swap = asyncio is not None and isinstance(runner, asyncio.Runner)
    if swap:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if swap:
            signal.signal(signal.SIGINT, current)


def _gave_up_loading() -> bool:
    """False where the import ended after all; else stderr is pointed back from /dev/null (where Pa_Initialize's
    caller left it) and True."""
    with _load_lock:
        if _load["done"].is_set():
            return False
        if _load["fd"] is not None:
            with contextlib.suppress(OSError):
                os.dup2(_load["fd"], 2)
        _load["abandoned"] = True
        return True


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
