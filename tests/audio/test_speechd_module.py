"""The speech-dispatcher module's playback on the fake engine (an engine of a GPU's speed: the client's side alone),
heard at a private PulseAudio null sink: the first sound within a budget beyond the engine's own first audio, every
sample as the server made it (gapless, no device underflow), STOP silent within 20 ms, index marks in order; and a
sound server frozen before the module starts (issue 37). The module's Speaker runs in this process where its player
is inspected, and as `voicectl speechd module` for the frozen server. With real speech-dispatcher and the tiny
checkpoint: tests/audio/test_speechd.py."""
from __future__ import annotations

import asyncio
import io
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests import cli_helpers
from tests.audio.conftest import die_with_parent

RATE = 16000
BUDGET_MS = 70
"""The median first sound beyond the engine's first audio: 8-42 ms measured on the 2-core machine at load 3.5-5.6
(the capture's own latency included); the module's player before issue 37's work took ~137 ms."""
TEXT = "Hello there."


class Lines(io.TextIOBase):
    """The module's stdout: its lines as they come, each with when it came (time.perf_counter)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self._partial = ""
        self._cond = threading.Condition()

    def write(self, text: str) -> int:
        with self._cond:
            self._partial += text
            *whole, self._partial = self._partial.split("\n")
            self.lines += [(time.perf_counter(), line) for line in whole]
            self._cond.notify_all()
        return len(text)

    def wait_for(self, line: str, after: int = 0, timeout_s: float = 30.0) -> tuple[int, float]:
        """The index (from `after`) and time of the first line `line`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    if self.lines[i][1] == line:
                        return i, self.lines[i][0]
                left = deadline - time.monotonic()
                assert left > 0, f"no {line!r} within {timeout_s} s: {self.lines[after:]}"
                self._cond.wait(left)


class InProcessModule:
    """The module's protocol and Speaker (voiceapp.speechd.module) on the fake engine, its server at `socket`."""

    def __init__(self, socket: Path) -> None:
        from voiceapp.speechd.module import ModuleConfig, ModuleProtocol, Output, Speaker

        self.socket = socket
        self.out = Lines()
        output = Output(self.out)
        self.speaker = Speaker(ModuleConfig(args=["--backend", "fake", "--socket", str(socket)]), output,
                               lambda line: None)
        self.protocol = ModuleProtocol(output, self.speaker)
        self.protocol.feed("INIT")

    def speak(self, text: str, cap=None) -> tuple[int, float, int]:
        """SPEAK `text`: (index of its first reply line, when its closing "." was fed, the capture's frames then)."""
        first = len(self.out.lines)
        for line in ("SPEAK", *text.split("\n")):
            self.protocol.feed(line)
        frames = cap.frames_so_far() if cap is not None else 0
        t0 = time.perf_counter()
        self.protocol.feed(".")
        return first, t0, frames

    def speak_whole(self, text: str, cap=None) -> tuple[int, float, int]:
        first, t0, frames = self.speak(text, cap)
        self.out.wait_for("702 END", first)
        return first, t0, frames

    @property
    def player(self):
        return self.speaker.output.player

    def reference(self, text: str) -> np.ndarray:
        """What the server makes of `text` as the module asks for it (its voice, seed and options)."""
        from engine.config import SynthesisRequest
        from voiceapp.server.client import RemoteSynthesizer
        from voiceapp.common import sampling_options
        from voiceapp.speechd.module import Settings

        async def render() -> np.ndarray:
            remote = await RemoteSynthesizer.connect(self.socket)
            try:
                voice = self.speaker.choose_voice(Settings())
                return await remote.render(SynthesisRequest(text, voice=voice,
                                                            options=sampling_options(self.speaker.args)))
            finally:
                await remote.close()

        return asyncio.run(render())

    def close(self) -> None:
        self.protocol.feed("QUIT")


@pytest.fixture
def module(pulse_server, tmp_path, monkeypatch):
    monkeypatch.setenv("VOICEAPP_IDLE_TIMEOUT", "120")
    socket = tmp_path / "engine.sock"
    mod = InProcessModule(socket)
    try:
        mod.speak_whole("Warm up.")  # starts the server
        mod.speak_whole("Warm up again.")  # the pacer has measured the engine's speed and lead
        yield mod
    finally:
        mod.close()
        cli_helpers.kill_servers(socket)


def engine_first_audio_ms(socket: Path, text: str) -> float:
    """The warm server's own first audio: a request sent to its first audio frame read."""
    from engine.config import SamplingOptions, SynthesisRequest
    from voiceapp.server.client import RemoteSynthesizer

    async def first() -> float:
        remote = await RemoteSynthesizer.connect(socket)
        try:
            t0 = time.perf_counter()
            async for chunk in remote.synthesize(SynthesisRequest(text, voice="ava", options=SamplingOptions(seed=0))):
                if not chunk.pause:
                    return (time.perf_counter() - t0) * 1000
            raise AssertionError("no audio")
        finally:
            await remote.close()

    return asyncio.run(first())


def first_sound_ms(cap, since: int, timeout_s: float = 10.0) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        heard = np.flatnonzero(np.fromfile(cap.path, np.float32, offset=4 * since))
        if len(heard):
            return float(heard[0]) * 1000 / RATE
        assert time.monotonic() < deadline, "no sound"
        time.sleep(0.005)


@pytest.mark.audio
@pytest.mark.serial
def test_first_sound_within_the_budget_beyond_the_engines_first_audio_and_gapless(module, record_monitor):
    """Five messages, each after the warm server's own first audio for the same text was timed: the median first
    sound in the sink beyond it is within BUDGET_MS; each message is heard exactly as the server makes it (no gap, no
    click), and the device never ran dry (PortAudio's output-underflow flag) nor did the player's ring. No message
    imports anything (the module did that as it started, or for its first message)."""
    ref = module.reference(TEXT)
    engine_first_audio_ms(module.socket, TEXT)
    imported = set(sys.modules)
    beyond, messages = [], []
    with record_monitor("tts16") as cap:
        for _ in range(5):
            engine_ms = engine_first_audio_ms(module.socket, TEXT)
            time.sleep(0.2)
            player = module.player
            counts = (player.output_underflows, player.underruns)
            first, _, since = module.speak(TEXT, cap)
            beyond.append(first_sound_ms(cap, since) - engine_ms)
            module.out.wait_for("702 END", first)
            assert module.player is player, "the stream was not kept between messages"
            messages.append((since, cap.frames_so_far(), player.output_underflows - counts[0],
                             player.underruns - counts[1]))
            time.sleep(0.2)
    heard = cap()
    print(f"first sound beyond the engine's first audio: {', '.join(f'{b:.1f}' for b in beyond)} ms; device "
          f"underflows, ring underruns per message: {[m[2:] for m in messages]}")
    assert statistics.median(beyond) <= BUDGET_MS, beyond
    assert set(sys.modules) == imported, f"a message imported {sorted(set(sys.modules) - imported)}"
    for since, until, device_underruns, underruns in messages:
        part = heard[since:until]
        start = int(np.flatnonzero(part)[0] - np.flatnonzero(ref)[0])  # the first sound is the message's first
        np.testing.assert_array_equal(part[start:start + len(ref)], ref)
        assert not part[:start].any() and not part[start + len(ref):].any(), "sound besides the message"
        assert device_underruns == 0 and underruns == 0, "the device or the ring ran dry"


@pytest.mark.audio
@pytest.mark.serial
def test_stop_silences_within_20_ms_and_the_next_message_plays(module, record_monitor, monkeypatch):
    """Three long messages, each stopped once it sounds: silent within 20 ms of the STOP (median; each within 60 ms
    on a loaded machine), 703 STOP reported; then a message plays on the same stream. A stopped message's
    connection closes (the server aborts its request), and the next one's is made while none plays: no message
    after a STOP connects on its road to first sound (a screen reader stops one at every keystroke)."""
    from voiceapp.server.client import Connection

    opened = []
    plain_open = Connection.open.__func__

    async def open_counted(cls, *args, **kwargs):
        opened.append(time.perf_counter())
        return await plain_open(cls, *args, **kwargs)

    monkeypatch.setattr(Connection, "open", classmethod(open_counted))
    silent_ms, roads = [], []
    with record_monitor("tts16") as cap:
        for _ in range(3):
            first, t0, since = module.speak("Keep talking. " * 40, cap)
            first_sound_ms(cap, since)
            roads.append([t for t in opened if t >= t0])
            time.sleep(0.3)
            at = cap.frames_so_far()
            module.protocol.feed("STOP")
            module.out.wait_for("703 STOP", first, timeout_s=2)
            time.sleep(0.3)
            after = np.fromfile(cap.path, np.float32, offset=4 * at)
            nonzero = np.flatnonzero(after)
            silent_ms.append((int(nonzero[-1]) + 1 if len(nonzero) else 0) * 1000 / RATE)
        player = module.player
        first, t0, since = module.speak(TEXT, cap)
        first_sound_ms(cap, since)
        roads.append([t for t in opened if t >= t0])
        module.out.wait_for("702 END", first)
    print(f"sound after STOP: {', '.join(f'{t:.1f}' for t in silent_ms)} ms")
    assert statistics.median(silent_ms) <= 20 and max(silent_ms) <= 60, silent_ms
    assert module.player is player and np.count_nonzero(cap()[since:]) > RATE // 2
    assert len(opened) >= 3 and roads == [[]] * 4, (len(opened), roads)  # one ahead of each message after a STOP


MARKED = ('<speak><mark name="start"/>First words here. <mark name="middle"/>Then <emphasis>more words'
          '</emphasis> follow. <mark name="last"/></speak>')


@pytest.mark.audio
def test_marks_come_in_order_each_once_the_audio_before_it_was_heard(module, record_monitor):
    """BEGIN, the three marks in order, END; "middle" once the first sentence has sounded, "last" once the second
    has too (the sound in the sink by then)."""
    with record_monitor("tts16") as cap:
        first, _, since = module.speak_whole(MARKED, cap)
    events = [line for _, line in module.out.lines[first:]]
    assert [e for e in events if e[:3] in ("701", "702") or e.startswith("700-")] == [
        "701 BEGIN", "700-start", "700-middle", "700-last", "702 END"], events
    ref_first = len(module.reference("First words here."))
    times = {line: t for t, line in module.out.lines[first:]}
    _, begin_at = module.out.wait_for("701 BEGIN", first)
    assert times["700-middle"] - begin_at >= 0.9 * ref_first / RATE, "'middle' came before the first sentence played"
    assert np.count_nonzero(cap()[since:]) > ref_first


# ---- a frozen sound server --------------------------------------------------------------------------------------

def send(proc: subprocess.Popen, *lines: str) -> None:
    proc.stdin.write("".join(line + "\n" for line in lines))
    proc.stdin.flush()


def read_until(proc: subprocess.Popen, wanted: str, timeout_s: float) -> tuple[list[str], float]:
    """The module's stdout lines up to `wanted`, and how long that took; fails after `timeout_s`."""
    got: list[str] = []
    t0 = time.monotonic()
    box: list[str] = []

    def read() -> None:
        while True:
            line = proc.stdout.readline()
            if not line:
                return
            got.append(line.rstrip("\n"))
            if got[-1] == wanted:
                box.append(wanted)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert box, f"no {wanted!r} within {timeout_s} s; got {got}"
    return got, time.monotonic() - t0


@pytest.mark.audio
def test_a_frozen_sound_server_ends_each_message_with_one_line_and_stop_is_heard(private_pulse, tmp_path):
    """The sound server frozen before the module starts: INIT answers at once; a STOP during the first message's wait
    on PortAudio ends it at once (703 STOP); a message left alone ends within PortAudio's bounds with one line in the
    module's log saying the audio output does not answer; the module answers and quits cleanly afterwards."""
    from voiceapp.speechd.module import config_text

    server = private_pulse({"frozen": RATE})
    socket, log = tmp_path / "engine.sock", tmp_path / "module.log"
    config = tmp_path / "voiceapp.conf"
    config.write_text(config_text(["--backend", "fake", "--socket", str(socket)], {}, "ava", log))
    env = {**os.environ, **server.env, "VOICEAPP_IDLE_TIMEOUT": "60", "PYTHONPATH": os.getcwd()}
    server.proc.send_signal(signal.SIGSTOP)
    proc = subprocess.Popen(die_with_parent([sys.executable, "-m", "voiceapp.cli", "speechd", "module", str(config)]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        send(proc, "INIT")
        _, took = read_until(proc, "299 OK LOADED SUCCESSFULLY", 10)
        assert took < 5, f"INIT waited {took:.1f} s on the frozen sound server"
        send(proc, "SPEAK", "Hello there.", ".")
        read_until(proc, "200 OK SPEAKING", 5)
        time.sleep(0.5)
        send(proc, "STOP")
        _, took = read_until(proc, "703 STOP", 5)
        assert took < 1, f"STOP took {took:.1f} s while PortAudio waited on the frozen server"
        send(proc, "SPEAK", "Hello again.", ".")
        got, took = read_until(proc, "703 STOP", 20)
        assert got[:2] == ["202 OK RECEIVING MESSAGE", "200 OK SPEAKING"] and took < 15, (got, took)
        errors = [line for line in log.read_text().splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].endswith(
            "error: the audio output does not answer (is the sound server frozen?)"), errors
        send(proc, "LIST VOICES")
        read_until(proc, "200 OK VOICE LIST SENT", 5)
        send(proc, "QUIT")
        read_until(proc, "210 OK QUIT", 10)
        assert proc.wait(15) == 0
    finally:
        server.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cli_helpers.kill_servers(socket)


@pytest.mark.audio
def test_a_sound_server_frozen_between_messages_ends_the_next_with_one_line(private_pulse, tmp_path):
    """A message plays; the sound server freezes; the next message's stream start does not come back: a STOP is
    heard within the start's bound, a message left alone ends (703 STOP) within PortAudio's bounds with one log line
    (the stopped one may have said it too), and the module answers and quits cleanly."""
    from voiceapp.speechd.module import config_text

    server = private_pulse({"freezes": RATE})
    socket, log = tmp_path / "engine.sock", tmp_path / "module.log"
    config = tmp_path / "voiceapp.conf"
    config.write_text(config_text(["--backend", "fake", "--socket", str(socket)], {}, "ava", log))
    env = {**os.environ, **server.env, "VOICEAPP_IDLE_TIMEOUT": "60", "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(die_with_parent([sys.executable, "-m", "voiceapp.cli", "speechd", "module", str(config)]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        send(proc, "INIT")
        read_until(proc, "299 OK LOADED SUCCESSFULLY", 10)
        send(proc, "SPEAK", "Hello there.", ".")
        read_until(proc, "702 END", 30)
        server.proc.send_signal(signal.SIGSTOP)
        send(proc, "SPEAK", "Hello again.", ".")
        read_until(proc, "200 OK SPEAKING", 5)
        time.sleep(0.3)
        send(proc, "STOP")
        _, took = read_until(proc, "703 STOP", 10)
        assert took < 3, f"STOP took {took:.1f} s while the stream's start waited on the frozen server"
        send(proc, "SPEAK", "Hello at last.", ".")
        got, took = read_until(proc, "703 STOP", 20)
        assert "200 OK SPEAKING" in got and took < 10, (got, took)
        errors = [line for line in log.read_text().splitlines() if "error:" in line]
        assert len(errors) <= 2 and all(line.endswith("error: the audio output does not answer (is the sound "
                                                      "server frozen?)") for line in errors), errors
        assert errors, "the message left alone ended without a word in the log"
        send(proc, "QUIT")
        read_until(proc, "210 OK QUIT", 10)
        assert proc.wait(15) == 0
    finally:
        server.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cli_helpers.kill_servers(socket)
