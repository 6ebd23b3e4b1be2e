"""Shared fixtures: one tiny synthetic checkpoint per test session, isolated user dirs, no background servers; and
under pytest-xdist, `serial` tests that run while no other test does."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from tests.cli_helpers import kill_servers
from tests.turns import Turns, serial_last

if not torch.cuda.is_available():
    # Triton reads this when it is first imported: without a GPU its kernels (engine.backends.decode_kernels)
    # run on its CPU interpreter, so the unit tests check their indexing on CI's machine
    os.environ.setdefault("TRITON_INTERPRET", "1")


_turns: list[Turns] = []
"""This worker's Turns, made at its first test (none without xdist: one process runs one test at a time)."""


def pytest_collection_modifyitems(config, items):
    """Under xdist, `serial` tests go last: their wait for the other worker is then paid once (serial_last)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        serial_last(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Whole protocol (set-up to tear-down, module and session fixtures included) inside the test's turn."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    if not _turns:
        # each worker's basetemp is <the run's folder>/popen-gwN
        _turns.append(Turns(item.config._tmp_path_factory.getbasetemp().parent))
    with _turns[0].alone() if item.get_closest_marker("serial") else _turns[0].shared():
        yield


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Never touch the real ~/.cache or ~/.local/share (globals cache, cloned voices)."""
    root = tmp_path_factory.getbasetemp() / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(root / "data"))
    monkeypatch.delenv("VOICEAPP_MODEL", raising=False)


@pytest.fixture(scope="session", autouse=True)
def _no_background_servers():
    """`say` and the TUI start a background engine server when none runs, and it outlives them: in tests they run
    in-process (VOICEAPP_NO_SERVER=1) unless a test opts back in (tests/server), on a socket of this session's own,
    and any server left there is killed at the end (auto-started ones also stop after a minute idle)."""
    d = Path(tempfile.mkdtemp(prefix="vt-"))
    sock = d / "engine.sock"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VOICEAPP_NO_SERVER", "1")
        mp.setenv("VOICEAPP_SOCKET", str(sock))
        mp.setenv("VOICEAPP_IDLE_TIMEOUT", "60")
        yield sock
    kill_servers(sock)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def orpheus_tiny(tmp_path_factory):
    """A tiny random-weight checkpoint in the exact Orpheus layout (LLM folder + snac/), seed 0, once per session."""
    from engine.families.orpheus.synthetic import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("orpheus") / "tiny", size="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random-weight checkpoint in the exact Spark-TTS layout (written once per session)."""
    from engine.synthetic import write_checkpoint

    path = tmp_path_factory.mktemp("models") / "tiny"
    write_checkpoint(path, size="tiny", seed=0)
    return path
