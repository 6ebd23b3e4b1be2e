"""Provides `voicectl stop`: stop the running engine server (one that `say` or the TUI started, or `voicectl serve`)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from voiceapp.common import add_socket_arg

STOP_WAIT_S = 10.0
"""How long to wait for the server to remove its socket and lock (it first ends its requests' connections)."""


def add_parser(sub) -> None:
    p = sub.add_parser("stop", help="stop the running engine server (exit status 1 if none)")
    add_socket_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.errors import VoiceError
    from voiceapp.server.client import socket_path

    path = socket_path(args.socket)
    pid = asyncio.run(server_pid(path))
    if pid is None:
        raise VoiceError(f"no server running (socket {path})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)  # the server ends its requests, removes its socket and lock, exits
    if not wait_stopped(path, STOP_WAIT_S):
        raise VoiceError(f"the server (pid {pid}) has not stopped after {STOP_WAIT_S:g} s; kill -9 {pid} stops it")
    print(f"stopped the engine server (pid {pid})")
    return 0


async def server_pid(path: Path) -> int | None:
    """The server's pid from its hello; else from the socket's lock (a server still loading its engine, or one of
    another protocol version); None when no server runs there."""
    from engine.errors import VoiceError
    from voiceapp.server.client import Connection, lock_holder

    try:
        conn = await Connection.open(path)
    except VoiceError:
        conn = None
    if conn is None:
        return lock_holder(path)
    await conn.close()
    return conn.info.get("pid")


def wait_stopped(path: Path, timeout_s: float) -> bool:
    """Wait until the socket and its lock are gone; False if they are still there after `timeout_s`."""
    from voiceapp.server.client import lock_holder

    end = time.monotonic() + timeout_s
    while path.exists() or lock_holder(path) is not None:
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True
