"""Provides compile_lane_ahead: a server's crowd lane compiled first in a child process, so that the server's own
build of it finds every kernel in the compile caches.

Why a process: Inductor's compile of a lane's ~90 step shapes runs minutes of Python (tracing, lowering, code
generation) in the process that calls it. In the serving process that Python holds the GIL in long stretches, and a
live request's first audio waits behind it. A child process compiles the same lane into the same on-disk caches
(Inductor's and Triton's) with the GIL of its own and at a lower CPU priority; the server's build after it then only
traces and loads what is cached. The child's lane is the server's to the byte (same checkpoint, GPU and rows), so the
cache keys match.

A stamp in the Inductor cache folder records a lane compiled ahead (its key: checkpoint config, GPU, torch and the
lane's code), so a later launch with warm caches skips the child; a cache folder emptied takes its stamps with it.

The child: `python -m engine.compile_ahead ROOT DEVICE_INDEX`, exit 0 once the lane is built, else 1 with the
failure's line on stderr.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.child_env import engine_env
from engine.errors import GenerationError

AHEAD_NICE = 10
"""The child's nice value (its compile workers inherit it): behind every thread that serves."""
AHEAD_TIMEOUT_S = 1800.0
"""The longest the server waits for the child: past it the child is stopped and the server compiles as before."""
POLL_S = 0.5
"""How often the waiting thread looks whether tuning was called off."""
STAMPS = "voiceapp-lanes-ahead"
"""The stamps' folder inside the Inductor cache folder."""


def lane_key(info: Any, device_name: str, device_bytes: int) -> str:
    """What the lane's compiled kernels depend on: the LLM's config, the GPU (its memory sizes the lane's rows),
    torch, and the code that builds and sizes it (the backends, the lane's shapes, the families)."""
    import torch

    engine = Path(__file__).parent
    code = hashlib.sha256()
    for path in sorted([*engine.glob("backends/*.py"), *engine.glob("families/**/*.py"), engine / "lane_scheduler.py"]):
        code.update(path.read_bytes())
    parts = {"family": info.family, "llm": info.llm_config, "gpu": device_name, "bytes": device_bytes,
             "torch": torch.__version__, "code": code.hexdigest()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def stamp_path(key: str, env: dict[str, str] | os._Environ[str] | None = None) -> Path | None:
    """Where the stamp for `key` lives (None: no Inductor cache folder is named, so none is kept across launches)."""
    folder = (os.environ if env is None else env).get("TORCHINDUCTOR_CACHE_DIR")
    return Path(folder) / STAMPS / key if folder else None


def compile_lane_ahead(info: Any, device: str, stopped: threading.Event,
                       timeout_s: float = AHEAD_TIMEOUT_S) -> str:
    """Build the lane of checkpoint `info` on `device` in a child process and wait for it (the caller is a tuning
    thread). What it did, for the tuning's status: "compiled", "caches warm" where a stamp says so, or "called off"
    once `stopped` was set (the child killed). GenerationError when the child failed or took longer than
    `timeout_s`."""
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    gpu = torch.cuda.get_device_properties(index)
    stamp = stamp_path(lane_key(info, gpu.name, gpu.total_memory))
    argv = [sys.executable, "-m", "engine.compile_ahead", str(info.root), str(index)]
    return build_ahead(stamp, argv, stopped, timeout_s)


def build_ahead(stamp: Path | None, argv: list[str], stopped: threading.Event, timeout_s: float) -> str:
    """Run the child `argv` unless `stamp` exists; stamp it once it succeeded."""
    if stamp is not None and stamp.exists():
        return "caches warm"
    if not run_child(argv, stopped, timeout_s):
        return "called off"
    if stamp is not None:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    return "compiled"


def run_child(argv: list[str], stopped: threading.Event, timeout_s: float) -> bool:
    """Run the child to its end (True), or kill it once `stopped` is set (False). GenerationError with its last
    stderr line where it failed, or where it ran past `timeout_s` (killed)."""
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=engine_env(), close_fds=True, start_new_session=True)  # Ctrl-C reaches the server only
    waited = 0.0
    while True:
        try:
            _, err = child.communicate(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            waited += POLL_S
            if stopped.is_set() or waited >= timeout_s:
                child.kill()
                child.communicate()
                if stopped.is_set():
                    return False
                raise GenerationError(f"compiling the lane ahead took over {timeout_s:.0f} s") from None
    if child.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise GenerationError(f"compiling the lane ahead failed: {lines[-1] if lines else f'exit {child.returncode}'}")
    return True


def leave_with_parent(poll_s: float = 1.0) -> threading.Thread:
    """Exit this process once its parent is gone (it was killed, not stopped: a stopped server kills the child
    itself), so that no orphan goes on compiling, holding GPU memory, for minutes."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    watcher = threading.Thread(target=watch, name="leave-with-parent", daemon=True)
    watcher.start()
    return watcher


def main(argv: list[str]) -> int:
    """The child: build the crowd lane of the checkpoint at argv[0] on GPU argv[1], as the server's tuning will."""
    os.nice(AHEAD_NICE)
    leave_with_parent()
    root, index = Path(argv[0]), int(argv[1])
    try:
        from engine.factory import _new_lane, keep_compile_caches
        from engine.families import detect

        keep_compile_caches()
        info = detect(root).read(root)
        import torch

        torch.cuda.set_device(index)
        _new_lane(info, torch.device("cuda", index), None, compiled=True)
    except Exception as err:  # noqa: BLE001 - the parent reports it and compiles in-process
        from engine.errors import one_line

        print(one_line(err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
