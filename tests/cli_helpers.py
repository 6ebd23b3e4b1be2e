"""Helpers for tests that run `voicectl` as a real process: the run itself, the one-line-error check every bad
input gets, and a small real tmpfs for disk-full cases."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


def voicectl(*args: str, stdin: bytes | str | None = None, env: dict[str, str] | None = None, text: bool = False,
             cwd: str | Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m voiceapp.cli ARGS` with this interpreter, output captured, `env` added to ours."""
    return subprocess.run([sys.executable, "-m", "voiceapp.cli", *args], input=stdin, capture_output=True,
                          text=text, env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The process failed with exactly one `voicectl: ...` line on stderr and no traceback; returns that line."""
    err = (proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr).strip()
    assert proc.returncode != 0, err
    assert err.startswith("voicectl: ") and "\n" not in err and "Traceback" not in err, err
    return err


@contextmanager
def small_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` (mount's syntax, e.g. 32k) at `mnt`, unmounted afterwards; skips without root."""
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
