"""Provides `replacing` and `writing`: a file written beside its target and renamed over it when complete, so that
the target is never seen half-written. `writing` also never follows a link planted at the temp file's name (a
shared, writable output directory). Pure (standard library only)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Iterator

CREATE_ATTEMPTS = 3
"""How often `writing` removes what holds its temp file's name and tries again to create it."""


@contextlib.contextmanager
def replacing(path: Path, suffix: str = ".tmp", tmp: Path | None = None) -> Iterator[Path]:
    """A temp file to write in the block: it replaces `path` when the block ends, and is deleted when the block
    fails. It lies beside `path`, in the same directory, so the rename never crosses filesystems: `tmp` where
    given (a name the caller reserved), else the hidden `.NAME{suffix}`."""
    tmp = path.with_name(f".{path.name}{suffix}") if tmp is None else tmp
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def writing(path: Path, suffix: str = ".tmp", mode: str = "wb") -> Iterator[IO]:
    """An open file (`mode`: "wb" or "w") to write in the block; it replaces `path` when the block ends, and is
    deleted when the block fails. The temp file `.NAME{suffix}` beside `path` is created new, never opened
    through a symbolic link: whatever already holds the name (a killed run's temp file, a link planted to make
    us overwrite its target) is removed, not written through."""
    tmp = path.with_name(f".{path.name}{suffix}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for attempt in range(CREATE_ATTEMPTS):
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            tmp.unlink(missing_ok=True)  # unlinks a link itself, never its target
    try:
        with open(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
