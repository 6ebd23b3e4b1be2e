"""Helpers for tests that run `voicectl` as a real process: the run itself, the one-line-error check every bad
input gets, a small real tmpfs for disk-full cases, and finding (and killing) servers `say` started."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from voiceapp.server.client import serve_pids  # noqa: F401 - the tests find servers with it


def voicectl(*args: str, stdin: bytes | str | None = None, env: dict[str, str] | None = None, text: bool = False,
             cwd: str | Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m voiceapp.cli ARGS` with this interpreter, output captured, `env` added to ours."""
    return subprocess.run([sys.executable, "-m", "voiceapp.cli", *args], input=stdin, capture_output=True,
                          text=text, env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def lab(module: str, *args: str, env: dict[str, str] | None = None, text: bool = True,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m lab.MODULE ARGS` from the repository root (as lab/*.sh run them), output captured."""
    return subprocess.run([sys.executable, "-m", f"lab.{module}", *args], capture_output=True, text=text,
                          env={**os.environ, **(env or {})}, cwd=ROOT, timeout=timeout)


ROOT = Path(__file__).resolve().parents[1]
"""The repository root: lab scripts run from there."""


START_NOTICES = ("voicectl: LLM on the CPU: ", "voicectl: decoder on the CPU: ", "voicectl: converting the LLM to int8",
                 "voicectl: LLM converted to int8")
"""What an engine on the CPU says while it starts (which LLM path it took; its int8 conversion, once per
checkpoint): notices, before and apart from any error."""


def without_start_notices(stderr: bytes | str) -> str:
    """stderr without the engine's start-up notices (START_NOTICES)."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    return "\n".join(line for line in text.splitlines() if not line.startswith(START_NOTICES)).strip()


def one_line_error(proc: subprocess.CompletedProcess, prog: str = "voicectl") -> str:
    """The process failed with exactly one `PROG: ...` line on stderr (besides the engine's start-up notices)
    and no traceback; returns that line."""
    err = without_start_notices(proc.stderr)
    assert proc.returncode != 0, err
    assert err.startswith(f"{prog}: ") and "\n" not in err and "Traceback" not in err, err
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


def kill_servers(socket: str | Path, timeout: float = 10.0) -> list[int]:
    """SIGKILL every server `serve_pids` finds for `socket` and wait until they are gone; returns their pids."""
    pids = serve_pids(socket)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + timeout
    while serve_pids(socket) and time.monotonic() < end:
        time.sleep(0.02)
    return pids


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below `pid` (children, theirs, ...): the Ray processes a command
    started, to kill one of them and no one else's."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            try:
                found.append((child, (Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())))
            except OSError:
                continue
            todo.append(child)
    return found
