"""Provides start_compile_pool: Inductor's compile workers started at a lower CPU priority, for a server that
compiles its lane in the background while it serves.

Inductor compiles kernels in a pool of worker processes, one per core. While a fresh server tunes, that pool takes
every core at once, and the live streams' threads (the event loop, the decode thread, the lane's stepping thread)
queue behind it for the CPU: their first audio waits. Workers started at a higher nice value give those threads the
cores first; the compile still gets whatever the streams leave.
"""
from __future__ import annotations

import os
import threading

COMPILE_NICE = 10
"""The compile workers' nice value: behind every thread that serves (0), ahead of what the user runs at idle
priority (19)."""


def start_compile_pool(nice: int = COMPILE_NICE) -> bool:
    """Start Inductor's worker pool now, from a throwaway thread at `nice` whose processes inherit it (the caller's
    own priority is untouched). False where there is no pool to start (one compile thread, a platform without
    per-thread priorities, or a torch whose Inductor has no such pool); the compile then runs as it would have."""
    if not hasattr(os, "setpriority"):
        return False
    try:  # Inductor's pool is private API: a torch without it compiles as before, only without the lower priority
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads
    except ImportError:
        return False
    if get_compile_threads() <= 1:
        return False
    started: list[bool] = []

    def spawn() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)  # this thread only, on Linux
            AsyncCompile.warm_pool()
        except Exception:  # noqa: BLE001 - no pool now: Inductor starts its own on the first compile, as before
            return
        started.append(True)

    worker = threading.Thread(target=spawn, name="compile-pool", daemon=True)
    worker.start()
    worker.join()
    return bool(started)
