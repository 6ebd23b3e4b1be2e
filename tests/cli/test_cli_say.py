"""`voicectl say` refuses what it cannot do well with one line, before or instead of writing bad output."""
import os
import shutil
import stat

import pytest

import torch
from safetensors.torch import load_file, save_file

from tests.cli_helpers import one_line_error, voicectl

TINY = ["--backend", "torch", "--seed", "1", "--max-tokens", "40", "--no-server"]


def nan_decoder_checkpoint(tiny_model, tmp_path):
    """A copy of the tiny checkpoint whose BiCodec decoder has a NaN weight (a broken download or conversion)."""
    model = tmp_path / "nan-model"
    shutil.copytree(tiny_model, model)
    weights = model / "BiCodec" / "model.safetensors"
    state = load_file(weights)
    state["decoder.model.6.bias"] = torch.full_like(state["decoder.model.6.bias"], float("nan"))
    save_file(state, str(weights), metadata={"format": "pt"})
    return model


def test_nan_decoder_weights_fail_with_one_line_and_write_no_wav(tiny_model, tmp_path):
    model = nan_decoder_checkpoint(tiny_model, tmp_path)
    out = tmp_path / "x.wav"
    proc = voicectl("say", "Hello there.", "--out", str(out), "--model", str(model), *TINY)
    line = one_line_error(proc)
    assert "non-finite audio" in line and "BiCodec" in line and str(model) in line, line
    assert not out.exists() and not list(tmp_path.glob(".x.wav.*"))


@pytest.mark.parametrize("name", ["say", "export"])
def test_an_unknown_voice_is_named_before_any_model_is_looked_for(name, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("Hello there.")
    args = {"say": ["say", "Hello there.", "--out", str(tmp_path / "o.wav"), "--no-server"],
            "export": ["export", str(src), "-o", str(tmp_path / "o.wav")]}[name]
    proc = voicectl(*args, "--voice", "nobody", "--model", str(tmp_path / "no-such-model"), "--backend", "torch")
    line = one_line_error(proc)
    assert proc.returncode == 2 and "unknown voice 'nobody'" in line, line


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_say_out_files_get_the_umasks_permissions(umask, mode, tmp_path):
    """As export and the TUI: a WAV the user asked for is theirs to share as their umask says (not 0600)."""
    out = tmp_path / "o.wav"
    old = os.umask(umask)
    try:
        proc = voicectl("say", "Hello there.", "--out", str(out), "--backend", "fake", "--no-server")
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == mode


def test_say_refuses_to_replace_a_read_only_file(tmp_path):
    out = tmp_path / "keep.wav"
    out.write_bytes(b"precious")
    out.chmod(0o444)
    line = one_line_error(voicectl("say", "Hello there.", "--out", str(out), "--backend", "fake", "--no-server"))
    assert "read-only" in line and str(out) in line, line
    assert out.read_bytes() == b"precious" and sorted(os.listdir(tmp_path)) == ["keep.wav"]


def test_a_full_disk_during_say_out_is_named_and_leaves_nothing(tmp_path):
    """A real 32 kB tmpfs: the WAV does not fit; one line says the disk is full (not libsndfile's "System
    error."), and neither the WAV nor its hidden partial file is left."""
    from tests.cli_helpers import small_tmpfs

    with small_tmpfs(tmp_path / "mnt", "32k") as mnt:
        proc = voicectl("say", "A sentence long enough to fill a tiny disk. And another one.", "--backend", "fake",
                        "--out", str(mnt / "out.wav"), "--no-server")
        err = one_line_error(proc)
        assert "disk full" in err and "System error" not in err, err
        assert list(mnt.iterdir()) == []


def test_a_partial_file_of_a_killed_say_is_removed_by_the_next_write(tmp_path):
    """SIGKILL mid-write leaves a hidden partial file; the next write to that output removes it (its writer is
    gone), and leaves a live writer's alone."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out.wav"
    long_text = "A sentence that takes a while to say. " * 40
    proc = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "say", long_text, "--backend", "fake", "--out",
                             str(out), "--no-server"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".out.wav.*.partial")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert list(tmp_path.glob(".out.wav.*.partial")), "the killed say left no partial file to clean up"
    live = tmp_path / f".out.wav.{os.getpid()}-00000000.partial"
    live.write_bytes(b"")
    assert voicectl("say", "Hello.", "--backend", "fake", "--out", str(out), "--no-server").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.wav", live.name])


@pytest.mark.parametrize("value", ["0", "0.2", "-3", "601", "nan", "inf", "lots"])
def test_a_buffer_outside_its_range_is_refused_before_anything_loads(value, tmp_path):
    proc = voicectl("say", "Hello there.", "--buffer", value, "--model", str(tmp_path / "none"), "--no-server")
    err = one_line_error(proc)  # the one table of numeric limits (voiceapp.limits)
    assert proc.returncode == 2 and err.startswith(f"voicectl: --buffer {value}: "), err
    assert "0.5 to 600" in err and "model" not in err
