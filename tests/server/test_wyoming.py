"""`voicectl serve --wyoming`: Home Assistant's Wyoming protocol, driven by the `wyoming` package's own client
against a real server process (fake engine): describe, synthesize with a voice, streaming synthesis heard before its
last sentence is even written, and hostile or vanishing clients that must cost only their own connection."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from tests import cli_helpers
from tests.server.conftest import start_serve

LONG = "A sentence that keeps the engine busy for a while. " * 12


@pytest.fixture
def wyoming_server(sock_path):
    """A fake-engine server with Wyoming on a free loopback port: (port, socket path, process)."""
    proc = start_serve("--backend", "fake", "--socket", sock_path, "--wyoming", "tcp://127.0.0.1:0")
    port = int(re.search(r"Wyoming tcp://127\.0\.0\.1:(\d+)", proc.startup_log).group(1))
    yield port, sock_path, proc
    proc.terminate()
    proc.wait(10)


def status(sock_path) -> dict:
    return json.loads(cli_helpers.voicectl("status", "--json", "--socket", sock_path).stdout)


async def speak(port: int, event) -> tuple[list, bytes]:
    """Send one event; the events answered until audio-stop or an error, and the audio bytes."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(event.event())
        return await answer(client)


async def answer(client) -> tuple[list, bytes]:
    events, audio = [], b""
    while True:
        event = await asyncio.wait_for(client.read_event(), 30)
        assert event is not None, "the server closed the connection"
        if AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            audio += chunk.audio
        events.append(event)
        if event.type in ("audio-stop", "error"):
            return events, audio


def test_describe_lists_the_voices_and_streaming(wyoming_server):
    port, _, _ = wyoming_server

    async def run():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await asyncio.wait_for(client.read_event(), 10))

    info = asyncio.run(run())
    voices = cli_helpers.voicectl("voices", text=True).stdout
    tts = info.tts[0]
    assert tts.supports_synthesize_streaming and tts.installed
    assert {v.name for v in tts.voices} >= {"leo", "ava", "mia"}
    assert all(v.name in voices for v in tts.voices)


def test_synthesize_gets_the_voices_audio_at_the_engines_rate(wyoming_server):
    port, sock_path, _ = wyoming_server
    rate = status(sock_path)["sample_rate"]
    ava_events, ava = asyncio.run(speak(port, Synthesize("Hello there.", voice=SynthesizeVoice(name="ava"))))
    _, leo = asyncio.run(speak(port, Synthesize("Hello there.", voice=SynthesizeVoice(name="leo"))))
    _, default = asyncio.run(speak(port, Synthesize("Hello there.")))
    start = AudioStart.from_event(ava_events[0])
    assert (start.rate, start.width, start.channels) == (rate, 2, 1)
    assert AudioStop.is_type(ava_events[-1].type)
    assert len(ava) > rate * 2 * 0.3 and len(ava) == len(leo) and ava != leo  # each voice its own audio
    assert default  # no voice: ours by default
    events, audio = asyncio.run(speak(port, Synthesize("Hello.", voice=SynthesizeVoice(name="nobody"))))
    assert Error.from_event(events[-1]).text.startswith("unknown voice 'nobody'") and not audio


def test_streaming_synthesis_is_heard_before_the_last_sentence_is_written(wyoming_server):
    """The first audio chunk comes while the last sentence has not even been sent (so it cannot have been made);
    the plain synthesize Home Assistant sends inside a stream is not spoken twice."""
    port, _, _ = wyoming_server

    async def run():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="mia")).event())
            await client.write_event(SynthesizeChunk("The first sentence is here. ").event())
            await client.write_event(SynthesizeChunk("The").event())  # the next begins: the first is complete
            first = []
            while not first or not AudioChunk.is_type(first[-1].type):
                first.append(await asyncio.wait_for(client.read_event(), 30))
            await client.write_event(SynthesizeChunk(" last one ends it.").event())
            await client.write_event(Synthesize("The first sentence is here. The last one ends it.").event())
            await client.write_event(SynthesizeStop().event())
            rest = []
            while not rest or rest[-1].type != "synthesize-stopped":
                rest.append(await asyncio.wait_for(client.read_event(), 30))
            return first, rest

    first, rest = asyncio.run(run())
    assert [e.type for e in first] == ["audio-start", "audio-chunk"]
    kinds = [e.type for e in rest]
    assert kinds[-2:] == ["audio-stop", "synthesize-stopped"] and set(kinds[:-2]) == {"audio-chunk"}
    assert "audio-start" not in kinds  # one answer: the plain synthesize inside the stream was not spoken


def raw_exchange(port: int, data: bytes, read_s: float = 5.0) -> tuple[list[dict], bool]:
    """Send raw bytes and end the sending side; the events read back (headers with their data) and whether the
    server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received, closed = b"", False
        deadline = time.monotonic() + read_s
        while time.monotonic() < deadline:
            try:
                part = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not part:
                closed = True
                break
            received += part
            if b"error" in received and b"\n" in received and len(received) > 60:
                sock.settimeout(0.5)
    events, rest = [], received
    while b"\n" in rest:
        line, rest = rest.split(b"\n", 1)
        header = json.loads(line)
        n = header.get("data_length") or 0
        header["data"] = {**header.get("data", {}), **(json.loads(rest[:n]) if n else {})}
        rest = rest[n + (header.get("payload_length") or 0):]
        events.append(header)
    return events, closed


@pytest.mark.parametrize("data", [
    b"this is not json\n",
    b'{"type": "synthesize", "data_length": 1000000000}\n',
    b'{"type": "synthesize", "payload_length": 1000000000}\n',
    b"x" * 200_000,
    b'{"type": 5}\n',
    b'{"type": "synthesize", "data_length": 10}\n{"te',
], ids=["not-json", "huge-data", "huge-payload", "endless-line", "type-not-string", "cut-short"])
def test_unreadable_events_get_an_error_and_cost_only_their_connection(wyoming_server, data):
    port, _, proc = wyoming_server
    events, _ = raw_exchange(port, data, read_s=3.0)
    assert events and events[-1]["type"] == "error", events
    assert proc.poll() is None
    _, audio = asyncio.run(speak(port, Synthesize("Still here.")))
    assert audio


def test_unknown_and_malformed_events_are_refused_and_the_connection_goes_on(wyoming_server):
    port, _, _ = wyoming_server

    async def run():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            replies = []
            for event in (Ping(text="x").event(), Describe().event()):
                await client.write_event(event)
                replies.append(await asyncio.wait_for(client.read_event(), 10))
            from wyoming.event import Event

            for odd in (Event("no-such-event"), Event("synthesize", {"voice": {"name": "ava"}}),
                        Event("synthesize-chunk", {"text": "outside a stream"}), Event("synthesize-stop")):
                await client.write_event(odd)
                replies.append(await asyncio.wait_for(client.read_event(), 10))
            await client.write_event(Synthesize("Fine.").event())
            return replies, await answer(client)

    replies, (events, audio) = asyncio.run(run())
    assert [e.type for e in replies] == ["pong", "info", "error", "error", "error", "error"]
    assert AudioStop.is_type(events[-1].type) and audio


def test_a_client_that_vanishes_mid_audio_is_cancelled_and_others_are_served(wyoming_server):
    port, sock_path, proc = wyoming_server
    before = status(sock_path)["cancelled"]

    async def vanish():
        client = AsyncTcpClient("127.0.0.1", port)
        await client.connect()
        await client.write_event(Synthesize(LONG).event())
        while not AudioChunk.is_type((await asyncio.wait_for(client.read_event(), 30)).type):
            pass
        client._writer.transport.abort()  # gone without a word, mid-audio

    asyncio.run(vanish())
    _, audio = asyncio.run(speak(port, Synthesize("Another client.")))
    assert audio and proc.poll() is None
    deadline = time.monotonic() + 10
    while status(sock_path)["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(sock_path)["cancelled"] == before + 1, "the vanished client's request was not cancelled"


def test_a_bad_wyoming_address_is_one_line(tmp_path):
    for bad in ("10200", "http://x:1", "tcp://nohost", "tcp://127.0.0.1:99999"):
        proc = cli_helpers.voicectl("serve", "--backend", "fake", "--socket", str(tmp_path / "s.sock"),
                                    "--wyoming", bad, text=True, timeout=60)
        assert "tcp://HOST:PORT" in cli_helpers.one_line_error(proc)
