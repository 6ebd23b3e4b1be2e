"""engine.compile_ahead: the child that compiles a server's crowd lane ahead, its failures and its stamps (real child
processes; the lane's own build is for the GPU)."""
from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import pytest

from engine.compile_ahead import build_ahead, lane_key, run_child, stamp_path
from engine.errors import GenerationError


def test_a_child_that_fails_is_one_line_naming_its_reason(tmp_path) -> None:
    """The real child on a folder that holds no checkpoint: it exits 1 with the engine's own one-line error."""
    argv = [sys.executable, "-m", "engine.compile_ahead", str(tmp_path / "missing"), "0"]
    with pytest.raises(GenerationError, match="compiling the lane ahead failed: .*missing"):
        run_child(argv, threading.Event(), timeout_s=120)


def test_a_child_past_its_time_or_called_off_is_killed(tmp_path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    t0 = time.monotonic()
    with pytest.raises(GenerationError, match="took over 1 s"):
        run_child(sleeper, threading.Event(), timeout_s=1.0)
    stopped = threading.Event()
    stopped.set()
    assert run_child(sleeper, stopped, timeout_s=120) is False
    assert build_ahead(tmp_path / "stamp", sleeper, stopped, timeout_s=120) == "called off"
    assert not (tmp_path / "stamp").exists()
    assert time.monotonic() - t0 < 10


def test_a_stamp_skips_the_child_and_only_a_success_leaves_one(tmp_path) -> None:
    stamp = tmp_path / "stamps" / "key"
    fails = [sys.executable, "-c", "import sys; sys.exit('no GPU here')"]
    with pytest.raises(GenerationError, match="no GPU here"):
        build_ahead(stamp, fails, threading.Event(), timeout_s=60)
    assert not stamp.exists()
    assert build_ahead(stamp, [sys.executable, "-c", "pass"], threading.Event(), timeout_s=60) == "compiled"
    assert stamp.exists()
    assert build_ahead(stamp, fails, threading.Event(), timeout_s=60) == "caches warm"
    assert build_ahead(None, [sys.executable, "-c", "pass"], threading.Event(), timeout_s=60) == "compiled"


def test_the_key_changes_with_what_the_kernels_depend_on_and_the_stamp_lives_in_the_cache(tmp_path) -> None:
    info = SimpleNamespace(family="spark", llm_config={"hidden_size": 896})
    key = lane_key(info, "NVIDIA H200", 150 << 30)
    assert key == lane_key(info, "NVIDIA H200", 150 << 30)
    assert len({key, lane_key(info, "NVIDIA H100", 80 << 30), lane_key(info, "NVIDIA H200", 80 << 30),
                lane_key(SimpleNamespace(family="spark", llm_config={"hidden_size": 1024}), "NVIDIA H200", 150 << 30),
                lane_key(SimpleNamespace(family="orpheus", llm_config={"hidden_size": 896}), "NVIDIA H200",
                         150 << 30)}) == 5
    assert stamp_path(key, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}) == tmp_path / "voiceapp-lanes-ahead" / key
    assert stamp_path(key, {}) is None


def test_a_child_whose_server_was_killed_leaves_too(tmp_path) -> None:
    """A server killed (SIGKILL) mid-tuning cannot kill its compile child: the child sees its parent gone and exits."""
    import os
    import signal
    import subprocess

    pid_file = tmp_path / "child.pid"
    child = (f"import os, time; from engine.compile_ahead import leave_with_parent; leave_with_parent(0.05); "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    server = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        deadline = time.monotonic() + 10
        while _alive(grandchild):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        server.kill()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by init, counts as gone)."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")
