"""Provides `replacing`: a file written beside its target and renamed over it when complete, so that the target is
never seen half-written. Pure (standard library only)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


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
