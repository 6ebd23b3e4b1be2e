"""Provides PidLock: one process at a time (one server per socket, one export per output), by an exclusive flock
on a lock file that holds the holder's pid.

The kernel drops a flock when its process dies, so a lock file left by a killed process never blocks. `release`
removes the file while still holding it; `acquire` re-checks the inode, so a process that opened the removed file
tries again on a new one.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import TypeVar

_Lock = TypeVar("_Lock", bound="PidLock")


class LockHeld(Exception):
    """Another live process holds the lock; `pid` is what its lock file says ("?" before it has written it)."""

    def __init__(self, pid: str) -> None:
        super().__init__(pid)
        self.pid = pid


class PidLock:
    """An exclusive flock on `path`, held until `release` (or the process's end); usable as a context manager."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    @classmethod
    def acquire(cls: type[_Lock], path: Path) -> _Lock:
        """Take the lock at once and write our pid into the file, or raise LockHeld."""
        while True:
            # never through a symbolic link: one planted in a shared directory would have us truncate its target
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise LockHeld(pid) from None
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not unlinked by a holder that just released it
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(fd, path)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still holding it: acquire() re-checks the inode
        os.close(self.fd)

    def __enter__(self) -> "PidLock":
        return self

    def __exit__(self, *_exc) -> None:
        self.release()
