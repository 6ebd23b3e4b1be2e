"""Shared fixtures: one tiny synthetic checkpoint per test session, isolated user dirs."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when it is first imported: without a GPU its kernels (engine.backends.decode_kernels)
    # run on its CPU interpreter, so the unit tests check their indexing on CI's machine
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Never touch the real ~/.cache or ~/.local/share (globals cache, cloned voices)."""
    root = tmp_path_factory.getbasetemp() / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(root / "data"))
    monkeypatch.delenv("VOICEAPP_MODEL", raising=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random-weight checkpoint in the exact Spark-TTS layout (written once per session)."""
    from engine.synthetic import write_checkpoint

    path = tmp_path_factory.mktemp("models") / "tiny"
    write_checkpoint(path, size="tiny", seed=0)
    return path
