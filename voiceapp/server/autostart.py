"""Provides a warm engine without asking: `say` and the TUI connect to the running `voicectl serve`, or start one
in the background (detached, stopping itself once idle) and wait for it, relaying its progress as Notices.

Two front ends starting at once end with one server: each spawns a child, the socket's lock lets one of them
load the engine and the other exits at once ("already running"); both clients then wait for the winner's socket.
A server that cannot stand in (another project or protocol version, backend, or a checkpoint of another hash:
`voiceapp.server.rendezvous.server_mismatch`) is never used nor stopped: the front end speaks in-process.
`--no-server` or VOICEAPP_NO_SERVER=1 turns all of this off.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from engine.errors import InputError, VoiceError
from engine.events import EventSink, Notice, ignore_events
from voiceapp.server.client import RemoteSynthesizer, ServerUnusable, connect_usable
from voiceapp.server.rendezvous import (LOG_PREFIX, NO_SERVER_ENV, is_default_location, lock_holder,  # noqa: F401
                                    server_disabled)

if TYPE_CHECKING:
    from engine.factory import EngineConfig
IDLE_ENV = "VOICEAPP_IDLE_TIMEOUT"
"""Seconds a server started here waits with no client before it stops (0 = never)."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
START_TIMEOUT_S = 600.0
"""Longest wait for a starting server that is still alive; past it the front end speaks in-process."""
FIRST_POLL_S, LAST_POLL_S = 0.01, 0.05
"""The socket is tried again after FIRST_POLL_S, each wait twice the one before, up to LAST_POLL_S. A try on a socket
nobody listens on fails at once, so trying often costs little, and the first request waits at most LAST_POLL_S
beyond the moment the server listens."""
STOP_SIGNALS = ("SIGTERM", "SIGINT")
"""What `voicectl stop` and Ctrl-C send: a server must never start with them blocked or ignored."""
SIGNAL_SHIM = ("import os, signal, sys\n"
               "signal.pthread_sigmask(signal.SIG_SETMASK, ())\n"
               "for name in sys.argv[1].split(','):\n"
               "    signal.signal(getattr(signal, name), signal.SIG_DFL)\n"
               "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n")
"""Run as `python -S -c SIGNAL_SHIM SIGNALS CMD...`: empties the signal mask, gives SIGNALS their default action
and execs the interpreter with CMD. A mask and ignored signals survive fork and exec, so a server spawned by a
client that has SIGTERM blocked (speech-dispatcher's generic module blocks it for the programs it runs) would
never hear `voicectl stop`; subprocess offers no way to clear them short of preexec_fn, which is unsafe in a
process with threads. It costs one more interpreter start (without site), against an engine's seconds."""
MAX_LOG_BYTES = 1 << 20
"""A log bigger than this when a server starts is moved aside (to LOG.1) first."""


def idle_timeout(env: Mapping[str, str] | None = None) -> float:
    """$VOICEAPP_IDLE_TIMEOUT seconds, else DEFAULT_IDLE_TIMEOUT_S; a bad value is a one-line InputError."""
    env = os.environ if env is None else env
    text = env.get(IDLE_ENV, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_IDLE_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InputError(f"{IDLE_ENV}={text}: expected seconds (0 = never stop)")
    return seconds


def idle_text(seconds: float) -> str:
    """`10 min`, `90 s`."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def log_path(path: Path) -> Path:
    """The log of servers started for the socket at `path` (their stderr), beside it."""
    return path.with_suffix(".log")


def serve_command(path: Path, config: EngineConfig, idle_s: float) -> list[str]:
    """`voicectl serve` with this interpreter, serving at `path` the engine `config` describes (as
    voiceapp.common.engine_config builds it from the same flags), stopping after `idle_s` with no client."""
    cmd = [sys.executable, "-m", "voiceapp.cli", "serve", "--auto-started", "--socket", str(path),
           "--idle-timeout", f"{idle_s:g}", "--backend", config.backend, "--compute", config.decoder_device]
    if config.model:
        cmd += ["--model", str(config.model)]
    if config.threads is not None:
        cmd += ["--threads", str(config.threads)]
    if config.quantize != "auto":
        cmd += ["--quantize", config.quantize]
    if config.decoder_dtype != "auto":
        cmd += ["--decoder-dtype", config.decoder_dtype]
    if not config.graph_lane:
        cmd.append("--no-graph-lane")
    if config.warm_up is False:
        cmd.append("--no-warm-up")
    return cmd


class ServerLog:
    """A starting server's log, read from where it ended when the server was spawned: its own progress lines to
    relay, and its last line as the reason when it exits without listening."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        """Open for appending (the server's stderr) and for reading at `offset`."""
        self.offset = os.fstat(fd).st_size
        self.last = ""
        """The last line read so far."""

    @classmethod
    def open(cls, path: Path) -> "ServerLog":
        try:
            if path.stat().st_size > MAX_LOG_BYTES:
                os.replace(path, path.with_name(path.name + ".1"))
        except FileNotFoundError:
            pass
        return cls(os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def new_lines(self) -> list[str]:
        """The complete lines written since the last call (a progress bar's line: its last state)."""
        data = b""
        while chunk := os.pread(self.fd, 1 << 16, self.offset + len(data)):
            data += chunk
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = [line.rsplit("\r", 1)[-1].strip() for line in complete.decode(errors="replace").split("\n")]
        lines = [line for line in lines if line]
        self.last = lines[-1] if lines else self.last
        return lines

    def relay(self, events: EventSink) -> None:
        for line in self.new_lines():
            if line.startswith(LOG_PREFIX):
                events(Notice(f"server: {line[len(LOG_PREFIX):]}"))

    def close(self) -> None:
        os.close(self.fd)


def spawn_server(path: Path, config: EngineConfig, idle_s: float) -> tuple[subprocess.Popen, ServerLog]:
    """Start the server detached (its own session, no terminal, stderr to its log); it outlives this process."""
    from voiceapp.server.engine_server import prepare_socket_dir

    prepare_socket_dir(path, is_default_location(path))
    log = ServerLog.open(log_path(path))
    try:
        python, *rest = serve_command(path, config, idle_s)
        command = [python, "-S", "-c", SIGNAL_SHIM, ",".join(STOP_SIGNALS), *rest]
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=log.fd, start_new_session=True)
    except OSError as err:
        log.close()
        raise VoiceError(f"cannot run {sys.executable}: {err.strerror or err}") from None
    return child, log


def unblock_stop_signals() -> None:
    """Empty this process's signal mask and give SIGTERM and SIGINT their default actions where they were ignored
    (what a parent may hand down; see SIGNAL_SHIM): `serve` calls it before loading anything."""
    import signal

    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for name in STOP_SIGNALS:
        sig = getattr(signal, name)
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


async def connect_or_start(path: Path, config: EngineConfig, events: EventSink = ignore_events,
                           start: bool = True) -> RemoteSynthesizer | None:
    """A RemoteSynthesizer on the server at `path` that can stand in for `config`, started first (with `start`)
    when none runs; None means speak in-process (a Notice has said why when a server was there or failed)."""
    try:
        remote = await connect_usable(path, config.backend, config.model, events)
        if remote is None and start:
            remote = await start_server(path, config, events)
        return remote
    except ServerUnusable as err:
        events(Notice(f"{err}; speaking in-process"))
        return None


async def start_server(path: Path, config: EngineConfig, events: EventSink) -> RemoteSynthesizer | None:
    """Spawn a server for `config`, wait until it (or the one that won the lock) listens, and connect."""
    if config.backend != "fake":
        from engine.model import resolve_model_dir

        # no model: the one-line error in-process would give, before a futile start; the server gets the path
        config = replace(config, model=str(resolve_model_dir(config.model).resolve()))
    idle_s = idle_timeout()
    try:
        child, log = spawn_server(path, config, idle_s)
    except VoiceError as err:  # its socket's folder cannot be made or is not ours, or no process can start
        events(Notice(f"the background engine server did not start ({err}); speaking in-process"))
        return None
    try:
        remote = await wait_for_server(path, config, child, log, events)
    finally:
        log.close()
    if remote is not None and remote.info.get("pid") == child.pid:
        remote.started_server = True
        stops = f"it stops after {idle_text(idle_s)} idle" if idle_s else "it runs until stopped"
        events(Notice(f"started a background engine server (pid {child.pid}); {stops} (voicectl stop)"))
    return remote


async def wait_for_server(path: Path, config: EngineConfig, child: subprocess.Popen, log: ServerLog,
                          events: EventSink) -> RemoteSynthesizer | None:
    """Try the socket with a short backoff while `child` or the lock's holder lives, relaying the log. None (with
    a Notice giving the log's last line) when they have all gone without listening."""
    delay, deadline = FIRST_POLL_S, time.monotonic() + START_TIMEOUT_S
    while True:
        log.relay(events)
        remote = await connect_usable(path, config.backend, config.model, events)
        if remote is not None:
            log.relay(events)
            return remote
        if child.poll() is not None and lock_holder(path) is None:
            log.relay(events)
            events(Notice(f"the background engine server did not start ({failure(child, log)}); "
                          f"speaking in-process"))
            return None
        if time.monotonic() > deadline:
            child.terminate()  # ours only: a server that won the lock is left alone
            events(Notice(f"the background engine server is not listening after {START_TIMEOUT_S:g} s; "
                          f"speaking in-process (see {log_path(path)})"))
            return None
        await asyncio.sleep(delay)
        delay = min(delay * 2, LAST_POLL_S)


def failure(child: subprocess.Popen, log: ServerLog) -> str:
    """Why a server exited without listening: its last log line, unless that was progress."""
    if log.last and not log.last.startswith(LOG_PREFIX):
        return log.last.removeprefix("voicectl: ")
    return f"exit status {child.returncode}"
