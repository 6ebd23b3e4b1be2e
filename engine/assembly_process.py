"""Provides AssemblyProcess: export's FollowingAssembly (engine.export_plan) run in a child process, so that encoding
M4B, MP3 or Opus beside the rendering takes neither the renderer's CPU time nor its GIL.

Why a process: the encoder releases the GIL inside FFmpeg but takes it back for every codec frame (some 16 a second
of audio), and a thread that wants the GIL back from a busy thread waits for that thread's switch interval; beside
the renderer's busy event loop both slowed down (on the shared 2-core development machine an M4B export took longer
with an encoding thread than rendering and encoding one after the other did).

The protocol, over the child's stdin and stdout: the parent writes the pickled FollowingAssembly arguments, then
one 4-byte index per finished part, then END once rendering is over; the child answers one pickle, ("ok",
Assembled) or ("error", exception), as soon as its last file is complete or it failed (then it exits). Rendering
never waits on the encoder: `finished` puts the index on a queue that a thread of the parent writes into the pipe,
and the child's main thread drains the pipe into a set as the indices come. The queue is bounded by the book: it
holds at most one index for each sentence. If the parent dies, the child reads the end of the pipe
and leaves, removing what it was writing; the parts stay, and --resume encodes again from them. The child runs
in a session of its own, so a terminal's Ctrl-C reaches only the parent (a child still importing its modules
printed a traceback), which closes the pipe.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any, BinaryIO

from engine.child_env import engine_env
from engine.errors import OutputError
from engine.export_plan import Assembled, FollowingAssembly

INDEX = struct.Struct("<i")
END = -1
"""The index that says rendering is over."""
STOP_WAIT_S = 10.0
"""How long stop() waits for the child to leave before killing it."""


class AssemblyProcess:
    """FollowingAssembly's interface (start, finished, check, join, stop) with the assembly in a child process.
    `arguments` are FollowingAssembly's keyword arguments, pickled: its writer must be picklable."""

    def __init__(self, **arguments: Any) -> None:
        self._arguments = arguments
        self._proc: subprocess.Popen | None = None
        self._outcome: tuple[str, Any] | None = None
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._feeder: threading.Thread | None = None
        self.last_part_at = time.perf_counter()

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "engine.assembly_process"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=engine_env(), close_fds=True, start_new_session=True)
        self._queue.put(pickle.dumps(self._arguments, protocol=pickle.HIGHEST_PROTOCOL))
        self._feeder = threading.Thread(target=self._feed, name="export-encoder-feed", daemon=True)
        self._feeder.start()
        self.last_part_at = time.perf_counter()

    def finished(self, index: int) -> None:
        """Part `index` is on disk."""
        self.last_part_at = time.perf_counter()
        self._queue.put(INDEX.pack(index))

    def check(self) -> None:
        """Raise the child's failure, if it failed (it exits when it does)."""
        if self._proc is not None and self._proc.poll() is not None:
            self._raise_failure()

    def join(self) -> Assembled:
        """Say rendering is over and wait for the last file; what was written, or the child's failure raised.
        `after_last_part_s` is measured here, from the parent's last `finished`."""
        self._queue.put(INDEX.pack(END))
        outcome = self._read()
        self._child().wait()
        if outcome[0] != "ok":
            self._raise_failure()
        after = max(0.0, time.perf_counter() - self.last_part_at)
        return dataclasses.replace(outcome[1], after_last_part_s=after)

    def stop(self) -> None:
        """Make the child leave (closing its pipe) and wait for it: it removes the file it was writing."""
        proc = self._proc
        if proc is None:
            return
        self._queue.put(None)
        if self._feeder is not None:
            self._feeder.join()
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _feed(self) -> None:
        """The pipe's one writer: the arguments, then the indices as they come, until None closes it. The
        arguments (the whole book) outgrow the pipe and the child reads them only once it has imported its
        modules, and the pipe holds 16,384 indices: writing here, the renderer never waits for the child."""
        pipe = _pipe(self._child().stdin)
        while (data := self._queue.get()) is not None:
            try:
                pipe.write(data)
                pipe.flush()
            except (BrokenPipeError, ValueError):
                pass  # the child is gone: check() and join() find out why
        try:
            pipe.close()
        except OSError:
            pass

    def _child(self) -> subprocess.Popen:
        """The encoder process (start() made it)."""
        if self._proc is None:
            raise RuntimeError("the encoder process was not started")
        return self._proc

    def _read(self) -> tuple[str, Any]:
        if self._outcome is None:
            try:
                self._outcome = pickle.load(_pipe(self._child().stdout))
            except (EOFError, pickle.UnpicklingError):
                self._outcome = ("crashed", None)
        return self._outcome

    def _raise_failure(self) -> None:
        kind, value = self._read()
        if kind == "error":
            raise value
        raise OutputError(f"the export's encoder process ended unexpectedly (exit code {self._child().wait()}); "
                          f"its finished sentences are kept: rerun with --resume")


def _pipe(end: IO[bytes] | None) -> IO[bytes]:
    """One end of the child's pipes (both are made with it)."""
    if end is None:
        raise RuntimeError("the encoder process has no pipe")
    return end


def serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    """The child: run FollowingAssembly as the parent says; answer once, when done or failed."""
    arguments = pickle.load(stdin)

    def on_end(assembly: FollowingAssembly) -> None:
        outcome = ("error", assembly.error) if assembly.error is not None else ("ok", assembly.result)
        try:
            answer = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):  # an exception that does not pickle
            answer = pickle.dumps(("error", OutputError(f"encoding failed: {assembly.error}")))
        try:
            stdout.write(answer)
            stdout.flush()
        except OSError:
            pass  # the parent is gone: nobody to answer
        if assembly.error is not None:
            os._exit(1)  # the parent's check() sees the exit at its next finished sentence

    assembly = FollowingAssembly(**arguments, on_end=on_end)
    assembly.start()
    while len(raw := stdin.read(INDEX.size)) == INDEX.size:
        (index,) = INDEX.unpack(raw)
        if index == END:
            assembly.wait()  # its outcome went out through on_end
            return 0
        assembly.finished(index)
    assembly.stop()  # the parent left or stopped us: remove what was being written
    return 1


def main() -> int:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # anything printed goes to stderr, not into the answer
    return serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    sys.exit(main())
