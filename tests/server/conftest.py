"""Server fixtures: an EngineServer on its own event loop in a background thread, on a per-test socket path."""
import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

from engine.factory import EngineConfig, build_synthesizer
from tests.cli_helpers import kill_servers
from voiceapp.server.engine_server import EngineServer, LiveRequests


class ThreadServer:
    """EngineServer running on a private loop in a daemon thread; `call` runs a coroutine there."""

    def __init__(self, path, config: EngineConfig) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self.thread.start()
        self.server: EngineServer = self.call(self._start(config))
        self.synth = self.server.synth

    async def _start(self, config: EngineConfig) -> EngineServer:
        requests = LiveRequests(log=lambda line: None)
        server = EngineServer(build_synthesizer(config, events=requests.route), self.path, requests)
        await server.start()
        return server

    def call(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def status(self):
        async def get():
            return self.server.status()
        return self.call(get())

    def stop(self) -> None:
        if self.loop.is_running():
            self.call(self.server.close())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture(autouse=True)
def _servers_allowed(monkeypatch):
    """The server tests opt back in: `say` here uses (and may start) a server, unlike in the rest of the suite."""
    monkeypatch.setenv("VOICEAPP_NO_SERVER", "0")


@pytest.fixture
def sock_path(tmp_path_factory):
    """A short socket path in a fresh directory (Unix socket paths are limited to 107 bytes); a server started
    there by `say` is killed afterwards."""
    import tempfile

    d = tempfile.mkdtemp(prefix="vs-")
    path = os.path.join(d, "run", "engine.sock")
    yield path
    kill_servers(path)
    import shutil
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake_server(sock_path):
    from pathlib import Path

    server = ThreadServer(Path(sock_path), EngineConfig(backend="fake"))
    yield server
    server.stop()


def start_serve(*args, env=None, **popen):
    """`voicectl serve` as a subprocess; returns once it listens (its stderr line says so, and is kept in the
    process's `startup_log` with the lines before it). `popen`: more subprocess.Popen keywords."""
    proc = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **(env or {})}, **popen)
    seen = b""
    while b"listening on" not in seen:
        line = proc.stderr.readline()
        if not line:
            proc.kill()
            raise AssertionError(f"server did not start: {seen.decode()}{proc.stderr.read().decode()}")
        seen += line
    proc.startup_log = seen.decode()
    return proc


def wait_for(predicate, timeout=10.0, step=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False


def same_audio(a, b) -> bool:
    """Two WAV files hold the same samples in the same format. (Not a byte comparison: libsndfile stamps float
    WAVs with the time they were written, in their PEAK chunk.)"""
    import soundfile

    (x, rate_x), (y, rate_y) = soundfile.read(str(a), dtype="float32"), soundfile.read(str(b), dtype="float32")
    info_x, info_y = soundfile.info(str(a)), soundfile.info(str(b))
    return (rate_x, info_x.subtype) == (rate_y, info_y.subtype) and x.shape == y.shape and x.tobytes() == y.tobytes()
