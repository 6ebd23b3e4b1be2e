"""Provides a private PulseAudio server with float32 null sinks, and a recorder of a sink's monitor.

Recipe B of docs/headless-audio-tui.md: `norewinds=1` on every sink, the server stopped by its PID, the
environment restored afterwards. Tests here skip when PulseAudio is not installed; set
VOICEAPP_REQUIRE_AUDIO=1 (CI) to make that a failure instead.
"""
from __future__ import annotations

import contextlib
import ctypes.util
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

SINK_RATES = {"tts16": 16000, "tts48": 48000}
"""Null sinks loaded on the test server: name -> rate. A float32 sink at the stream's own rate is
bit-exact; the default sink is tts16."""


def die_with_parent(args: list[str]) -> list[str]:
    """Wrap a child command so the kernel sends it SIGTERM if this process dies without cleaning up (a crash
    or SIGKILL would otherwise leave an orphaned pulseaudio/parec running)."""
    return ["setpriv", "--pdeathsig", "TERM", *args] if shutil.which("setpriv") else args


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a child (by its PID), SIGKILL it after 5 s, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait(5)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("VOICEAPP_REQUIRE_AUDIO") == "1":
        pytest.fail(f"{reason} (VOICEAPP_REQUIRE_AUDIO=1; run .ci/audio-setup.sh)")
    pytest.skip(reason)


@dataclass
class PulseServer:
    """A running private PulseAudio daemon."""

    dir: Path
    env: dict[str, str]
    """What a client needs: PULSE_SERVER, PULSE_COOKIE, XDG_RUNTIME_DIR."""
    proc: subprocess.Popen
    sinks: dict[str, int]
    """Sink name -> sample rate."""

    def stop(self, before_cleanup: Callable[[], None] | None = None) -> None:
        """Stop by PID (never by name), run `before_cleanup`, then remove its folder."""
        stop_process(self.proc)
        if before_cleanup is not None:
            with contextlib.suppress(Exception):
                before_cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_pulse(sinks: dict[str, int]) -> PulseServer:
    """Start `pulseaudio` with one float32 mono null sink per entry; the first one is the default."""
    d = Path(tempfile.mkdtemp(prefix="pa."))  # mode 0700, as pulse wants
    env = {"XDG_RUNTIME_DIR": str(d), "PULSE_SERVER": f"unix:{d}/native", "PULSE_COOKIE": f"{d}/cookie"}
    args = ["pulseaudio", "--daemonize=no", "-n", "--exit-idle-time=-1", "--enable-memfd=no",
            f"--log-target=file:{d}/pulse.log",
            "-L", f"module-native-protocol-unix auth-anonymous=1 socket={d}/native"]
    for name, rate in sinks.items():
        args += ["-L", f"module-null-sink sink_name={name} format=float32le rate={rate} channels=1 norewinds=1"]
    child_env = {**os.environ, **env, "HOME": str(d)}
    proc = subprocess.Popen(die_with_parent(args), env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    server = PulseServer(d, env, proc, dict(sinks))
    deadline = time.monotonic() + 10
    while subprocess.run(["pactl", "info"], env=child_env, capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (d / "pulse.log").read_text(errors="replace")[-2000:] if (d / "pulse.log").exists() else ""
            server.stop()
            raise RuntimeError(f"pulseaudio did not start:\n{log}")
        time.sleep(0.05)
    subprocess.run(["pactl", "set-default-sink", next(iter(sinks))], env=child_env, check=True,
                   capture_output=True)
    return server


def rescan_sounddevice() -> None:
    """PortAudio lists devices once, at initialisation; re-scan after the environment changed."""
    import sounddevice as sd

    sd._terminate()
    sd._initialize()


@pytest.fixture(scope="session")
def pulse_server() -> Iterator[PulseServer]:
    """Session-wide private PulseAudio with the SINK_RATES null sinks; the client env is set meanwhile."""
    for tool in ("pulseaudio", "pactl", "parec"):
        if not shutil.which(tool):
            _skip_or_fail(f"{tool} not installed (apt-get install pulseaudio pulseaudio-utils)")
    if not ctypes.util.find_library("portaudio"):
        _skip_or_fail("PortAudio library not installed (apt-get install libportaudio2)")
    server = start_pulse(SINK_RATES)
    old = {k: os.environ.get(k) for k in (*server.env, "PULSE_SINK")}
    os.environ.update(server.env)
    os.environ.pop("PULSE_SINK", None)
    try:
        rescan_sounddevice()  # the env must be in place before PortAudio scans
        yield server
    finally:
        # Re-scan while the env still names the stopped server: PortAudio then lists no devices again,
        # and libpulse writes nothing under $HOME (a scan without PULSE_SERVER would).
        server.stop(before_cleanup=rescan_sounddevice)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def private_pulse(pulse_server: PulseServer) -> Iterator[Callable[[dict[str, int]], PulseServer]]:
    """Factory for extra servers a test may kill (e.g. to make the device vanish); all stopped after."""
    started: list[PulseServer] = []

    def start(sinks: dict[str, int]) -> PulseServer:
        started.append(start_pulse(sinks))
        return started[-1]

    yield start
    for server in started:
        server.stop()


class Capture:
    """What `record_monitor` yields: `frames_so_far()` while recording, `data` (float32) afterwards."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: np.ndarray | None = None

    def frames_so_far(self) -> int:
        return self.path.stat().st_size // 4 if self.path.exists() else 0

    def __call__(self) -> np.ndarray:
        assert self.data is not None, "the capture is read after the `with` block"
        return self.data


@pytest.fixture
def record_monitor(pulse_server: PulseServer, tmp_path: Path) -> Callable[..., contextlib.AbstractContextManager]:
    """`with record_monitor("tts16") as cap: ...play...`; then `cap()` is the monitor's float32 samples.

    Recording starts 0.3 s before the block and ends 0.3 s after it; parec is always stopped."""
    counter = iter(range(1_000_000))

    @contextlib.contextmanager
    def rec(sink: str = "tts16", rate: int | None = None) -> Iterator[Capture]:
        rate = rate or pulse_server.sinks[sink]
        cap = Capture(tmp_path / f"cap{next(counter)}.f32")
        proc = subprocess.Popen(
            die_with_parent(["parec", "-d", f"{sink}.monitor", "--raw", "--format=float32le", f"--rate={rate}",
                             "--channels=1", "--latency-msec=10", str(cap.path)]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            yield cap
            time.sleep(0.3)
        finally:
            stop_process(proc)  # always, or an orphaned parec keeps writing
        cap.data = np.fromfile(cap.path, np.float32)

    return rec
