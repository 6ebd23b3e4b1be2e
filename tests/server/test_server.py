"""EngineServer on the fake engine: round trips, concurrency, permissions, malformed input, cancel, stale socket."""
import asyncio
import os
import socket
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from engine.config import SamplingOptions, SynthesisRequest
from engine.errors import InputError, VoiceError, VoiceNotFound
from engine.events import FirstAudio, RequestFinished, RequestStarted, SentenceFinished
from engine.factory import EngineConfig, build_synthesizer
from engine.protocol import HEADER, PROTOCOL_VERSION, encode_audio, encode_message, read_frame
from tests.server.conftest import ThreadServer, wait_for
from voiceapp.server.client import Connection, RemoteSynthesizer, server_status
from voiceapp.server.engine_server import SocketLock, prepare_socket_dir

LONG_TEXT = " ".join(f"Sentence number {i} goes on for a while." for i in range(40))


def req(text, seed=5, voice="default"):
    return SynthesisRequest(text, voice=voice, options=SamplingOptions(seed=seed))


async def test_remote_render_equals_in_process_render_and_events_arrive(fake_server):
    events = []
    remote = await RemoteSynthesizer.connect(fake_server.path, events.append)
    assert remote.info["backend"] == "fake" and remote.info["pid"] == os.getpid()
    got = await remote.render(req("Hello there. A second sentence!"))
    again = await remote.render(req("Hello there. A second sentence!"))  # same connection, second request
    await remote.close()
    local = build_synthesizer(EngineConfig(backend="fake"))
    want = await local.render(req("Hello there. A second sentence!"))
    assert got.tobytes() == want.tobytes() == again.tobytes()
    kinds = [type(e) for e in events]
    assert kinds.count(RequestStarted) == 2 and kinds.count(FirstAudio) == 2 and kinds.count(SentenceFinished) == 4
    done = [e for e in events if isinstance(e, RequestFinished)]
    assert len(done) == 2 and not done[0].cancelled and done[0].audio_s == pytest.approx(len(want) / 16000)


async def test_a_sentence_rendered_ahead_reaches_the_client_with_when_it_was_made(fake_server):
    """The client paces by when audio was made: chunks of a sentence rendered ahead of its turn carry their age over
    the socket, and the client turns it back into a time of its own clock; the first sentence's were made as sent."""
    fake_server.synth.eager_lookahead = True  # as a batching engine's: a lone request's next sentence renders ahead
    remote = await RemoteSynthesizer.connect(fake_server.path)
    try:
        assert remote.info["paced_ahead_windows_s"] == list(fake_server.synth.pacer.ahead_windows_s)
        chunks = [c async for c in remote.synthesize(req("One sentence here. Another one there. And a third one."))]
    finally:
        await remote.close()
    spoken = [c for c in chunks if not c.pause]
    assert all(c.made_at is None for c in spoken if c.sentence_index == 0)
    later = [c for c in spoken if c.sentence_index > 0]
    assert later and all(c.made_at is not None and c.made_at <= time.perf_counter() for c in later)
    assert min(c.made_at for c in later) < max(c.made_at for c in later)


async def test_streamed_text_pieces_equal_whole_text(fake_server):
    async def pieces():
        for piece in ["Hello th", "ere. A sec", "ond sentence!"]:
            yield piece

    remote = await RemoteSynthesizer.connect(fake_server.path)
    streamed = await remote.render(req(""), pieces())
    whole = await remote.render(req("Hello there. A second sentence!"))
    await remote.close()
    assert streamed.tobytes() == whole.tobytes()


async def test_many_concurrent_clients(fake_server):
    async def one(seed):
        remote = await RemoteSynthesizer.connect(fake_server.path)
        try:
            return await remote.render(req(f"Client {seed} speaks. Twice over.", seed=seed))
        finally:
            await remote.close()

    outs = await asyncio.gather(*[one(seed) for seed in range(12)])
    local = build_synthesizer(EngineConfig(backend="fake"))
    for seed in (0, 11):
        want = await local.render(req(f"Client {seed} speaks. Twice over.", seed=seed))
        assert outs[seed].tobytes() == want.tobytes()
    assert wait_for(lambda: fake_server.status()["served"] == 12)


async def test_engine_errors_reach_the_client_as_the_same_error_class(fake_server):
    remote = await RemoteSynthesizer.connect(fake_server.path)
    with pytest.raises(VoiceNotFound):
        await remote.render(req("Hello.", voice="nobody"))
    with pytest.raises(InputError, match="no speakable"):
        await remote.render(req("?!"))
    await remote.close()
    assert wait_for(lambda: fake_server.status()["failed"] == 2)


def test_socket_is_0600_in_a_0700_directory(fake_server):
    path = fake_server.path
    assert stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_private_socket_dir_is_tightened_and_a_foreign_one_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    prepare_socket_dir(loose / "engine.sock", private=True)
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(loose)
    with pytest.raises(VoiceError, match="not a directory owned by you"):
        prepare_socket_dir(link / "engine.sock", private=True)
    with pytest.raises(InputError, match="too long"):
        prepare_socket_dir(tmp_path / ("x" * 120) / "engine.sock", private=False)


# ---- malformed input never takes the server down ------------------------------------------------------------

async def raw_exchange(path, data: bytes, hello=True):
    """Send raw bytes (after a valid hello, if asked); return the frames received until the server closes."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        if hello:
            writer.write(encode_message({"type": "hello", "v": PROTOCOL_VERSION}))
        writer.write(data)
        await writer.drain()
    except (ConnectionResetError, BrokenPipeError):
        pass  # a server that refuses us may close before we finish sending; what it said is still readable
    frames = []
    try:
        while (frame := await asyncio.wait_for(read_frame(reader), 5)) is not None:
            frames.append(frame)
    except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
        pass
    writer.close()
    return frames


async def still_serves(path):
    remote = await RemoteSynthesizer.connect(path)
    assert remote is not None
    audio = await remote.render(req("Still here."))
    await remote.close()
    return len(audio) > 0


rng = np.random.default_rng(1)
MALFORMED = {
    "huge_length": (HEADER.pack(b"J", 1 << 30), "too-big"),
    "oversized_frame": (HEADER.pack(b"J", (1 << 20) + 1) + b"x" * 100, "too-big"),
    "bad_kind": (b"GET / HTTP/1.1\r\n\r\n", "bad-frame"),
    "bad_json": (HEADER.pack(b"J", 5) + b"{nope", "bad-json"),
    "not_an_object": (HEADER.pack(b"J", 2) + b"[]", "bad-json"),
    "unknown_type": (encode_message({"type": "format_disk"}), "unexpected"),
    "audio_from_client": (b"".join(encode_audio(0, np.zeros(4, np.float32))), "unexpected"),
    "random_bytes": (rng.bytes(4096), None),
    "deeply_nested_json": (HEADER.pack(b"J", 200_000) + b"[" * 200_000, "bad-json"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_frames_get_an_error_and_the_server_keeps_serving(fake_server, case):
    data, code = MALFORMED[case]
    frames = await raw_exchange(fake_server.path, data)
    assert frames[0]["type"] == "hello"
    if code is not None:
        assert frames[-1]["type"] == "error" and frames[-1]["code"] == code, frames
    assert await still_serves(fake_server.path)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_malformed_frames_end_their_connections_and_leak_nothing(fake_server):
    """Each bad frame ends its connection: no handler waits on a dead reader, no descriptor stays open."""
    nested = HEADER.pack(b"J", 100_000) + b'{"a":' * 20_000
    bad = [MALFORMED["deeply_nested_json"][0], nested, MALFORMED["bad_json"][0], MALFORMED["bad_kind"][0]]
    assert await still_serves(fake_server.path)
    for data in bad:  # once each first: whatever the first failures open lazily (and keep) is not a leak
        await raw_exchange(fake_server.path, data)
    assert wait_for(lambda: fake_server.status()["clients"] == 0)
    before = open_fds()
    for n in range(20):
        frames = await raw_exchange(fake_server.path, bad[n % len(bad)])
        assert frames[-1]["type"] == "error", frames
    assert wait_for(lambda: fake_server.status()["clients"] == 0, timeout=5), fake_server.status()["clients"]
    assert wait_for(lambda: open_fds() <= before, timeout=5), (open_fds(), before)
    assert await still_serves(fake_server.path)


async def test_an_unexpected_reader_failure_ends_the_connection_and_is_logged_once(fake_server, monkeypatch):
    import voiceapp.server.engine_server as server_module

    async def broken(reader):
        raise RuntimeError("boom")

    logged = []
    fake_server.server.log = logged.append
    monkeypatch.setattr(server_module, "read_frame", broken)
    frames = await asyncio.wait_for(raw_exchange(fake_server.path, b"", hello=False), 10)
    assert [f["code"] for f in frames] == ["internal"]
    assert wait_for(lambda: fake_server.status()["clients"] == 0, timeout=5)
    assert len(logged) == 1 and "RuntimeError: boom" in logged[0] and "\n" not in logged[0]
    monkeypatch.undo()
    assert await still_serves(fake_server.path)


async def test_truncated_frame_then_disconnect_is_harmless(fake_server):
    reader, writer = await asyncio.open_unix_connection(str(fake_server.path))
    writer.write(encode_message({"type": "hello", "v": PROTOCOL_VERSION}) + HEADER.pack(b"J", 100) + b'{"type"')
    await writer.drain()
    assert (await read_frame(reader))["type"] == "hello"
    writer.close()
    await writer.wait_closed()
    assert wait_for(lambda: fake_server.status()["clients"] == 0)
    assert await still_serves(fake_server.path)


@pytest.mark.parametrize("hello,code", [({"type": "hello", "v": 99}, "version"), ({"type": "hello"}, "version"),
                                        ({"type": "status", "v": PROTOCOL_VERSION}, "unexpected")])
async def test_wrong_version_or_no_hello_is_refused(fake_server, hello, code):
    frames = await raw_exchange(fake_server.path, encode_message(hello), hello=False)
    assert frames == [frames[0]] and frames[0]["code"] == code
    assert "voicectl serve" in frames[0]["message"] or code != "version"
    assert await still_serves(fake_server.path)


async def test_bad_request_fields_are_refused_but_the_connection_goes_on(fake_server):
    conn = await Connection.open(fake_server.path)
    for bad in ({"seed": "x"}, {"options": {"temperature": -1}}, {"options": {"evil": 1}}, {"text": 5}):
        with pytest.raises(InputError):
            await conn.request({"type": "say", "text": "Hi.", **bad})
    assert (await conn.request({"type": "ping"}))["type"] == "pong"
    await conn.close()


async def test_a_fast_text_stream_is_held_back_not_buffered_without_bound(fake_server):
    """A client that streams text far faster than it is spoken: the server stops reading (the client's writes
    block) instead of holding everything; the request still ends when that client leaves."""
    from engine.protocol import MAX_TEXT_PIECE
    from voiceapp.server.engine_server import MAX_PENDING_TEXT

    reader, writer = await asyncio.open_unix_connection(str(fake_server.path))
    writer.write(encode_message({"type": "hello", "v": PROTOCOL_VERSION}))
    writer.write(encode_message({"type": "say", "text": "", "seed": 1, "stream": True}))
    piece = "Go on. " * (MAX_TEXT_PIECE // 7)
    sent = 0

    async def flood():
        nonlocal sent
        while True:
            writer.write(encode_message({"type": "text", "text": piece}))
            await writer.drain()
            sent += len(piece)

    task = asyncio.create_task(flood())
    last = -1
    while sent != last:  # until the server stops taking more
        last = sent
        await asyncio.sleep(0.3)
    (stream,) = fake_server.status()["streams"]
    assert MAX_PENDING_TEXT <= stream["text_pending"] < MAX_PENDING_TEXT + len(piece)
    assert sent < 4 * MAX_PENDING_TEXT  # the rest is frames read ahead and socket buffers
    task.cancel()
    writer.transport.abort()  # a plain close would first wait to send what the server does not read
    await asyncio.sleep(0.05)  # let this loop close the socket
    assert wait_for(lambda: not fake_server.status()["streams"], timeout=10)
    assert await still_serves(fake_server.path)


async def test_abandoning_a_held_back_text_stream_ends_at_once(fake_server):
    """The client side of the above: `say -` on endless input, then Ctrl-C. Closing must not wait to flush text
    the server will not read."""
    async def endless():
        while True:
            yield "More words here. " * 4000
            await asyncio.sleep(0)

    remote = await RemoteSynthesizer.connect(fake_server.path)
    chunks = remote.synthesize(req(""), endless())
    await chunks.__anext__()
    await asyncio.sleep(0.5)  # the sender is blocked by now
    await asyncio.wait_for(chunks.aclose(), 3)
    await asyncio.wait_for(remote.close(), 3)
    for _ in range(100):
        if not fake_server.status()["streams"]:
            break
        await asyncio.sleep(0.05)
    assert not fake_server.status()["streams"]


# ---- cancel and disconnect abort the request on the server --------------------------------------------------

async def first_audio(conn):
    while True:
        frame = await read_frame(conn.reader)
        if not isinstance(frame, dict):
            return frame


async def test_client_disconnect_aborts_the_request(fake_server):
    conn = await Connection.open(fake_server.path)
    await conn.send({"type": "say", "text": LONG_TEXT, "voice": "default", "seed": 1})
    await first_audio(conn)
    assert len(fake_server.status()["streams"]) == 1
    await conn.close()
    assert wait_for(lambda: not fake_server.status()["streams"], timeout=5)
    generator = fake_server.synth.generator
    steps = generator.steps
    await asyncio.sleep(0.2)
    assert generator.steps == steps, "generation went on after the client left"
    assert generator.aborted and wait_for(lambda: fake_server.status()["cancelled"] == 1)


async def test_cancel_message_stops_the_request_and_keeps_the_connection(fake_server):
    conn = await Connection.open(fake_server.path)
    await conn.send({"type": "say", "text": LONG_TEXT, "seed": 1})
    await first_audio(conn)
    await conn.send({"type": "cancel"})
    while (frame := await read_frame(conn.reader)) is not None and not (isinstance(frame, dict)
                                                                       and frame["type"] == "done"):
        pass
    assert frame == {"type": "done", "cancelled": True}
    assert not fake_server.status()["streams"] and fake_server.status()["cancelled"] == 1
    assert (await conn.request({"type": "ping"}))["type"] == "pong"
    await conn.close()


async def test_status_lists_live_streams(fake_server):
    conn = await Connection.open(fake_server.path)
    await conn.send({"type": "say", "text": LONG_TEXT, "voice": "mia", "seed": 1})
    await first_audio(conn)
    status = await server_status(fake_server.path)
    await conn.close()
    assert status["pid"] == os.getpid() and status["backend"] == "fake" and status["model"] is None
    assert status["socket"] == str(fake_server.path) and status["uptime_s"] >= 0 and status["devices"] == [{"device": "cpu"}]
    (stream,) = status["streams"]
    assert stream["voice"] == "mia" and stream["chars"] == len(LONG_TEXT) and stream["client_pid"] == os.getpid()
    assert stream["ttfa_ms"] is not None and stream["audio_s"] > 0
    assert "lane" not in status  # the fake engine has no graph lane
    assert len(status["gc"]["runs"]) == len(status["gc"]["longest_ms"]) == 3 and status["gc"]["frozen"] >= 0
    assert status["decoder"]["calls"] >= 1 and status["decoder"]["windows"] >= status["decoder"]["calls"]
    assert status["decoder"]["longest_ms"] >= 0 and isinstance(status["decoder"]["slow"], list)
    assert status["loop"]["late"] >= 0 and status["loop"]["longest_ms"] >= 0


# ---- one server per socket; stale sockets; other users -------------------------------------------------------

async def test_second_server_on_the_same_socket_is_refused(fake_server):
    with pytest.raises(VoiceError, match=f"already running \\(pid {os.getpid()}"):
        SocketLock.acquire(fake_server.path)
    assert await still_serves(fake_server.path)


def test_stale_socket_is_replaced(sock_path):
    path = Path(sock_path)
    path.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays: like a server that was SIGKILLed
    assert asyncio.run(server_status(path)) is None
    server = ThreadServer(path, EngineConfig(backend="fake"))
    try:
        assert asyncio.run(server_status(path))["pid"] == os.getpid()
    finally:
        server.stop()
    assert not path.exists() and not Path(str(path) + ".lock").exists()


def test_a_non_socket_file_in_the_way_is_not_deleted(sock_path):
    path = Path(sock_path)
    path.parent.mkdir(mode=0o700)
    path.write_text("precious")
    with pytest.raises(InputError, match="not a socket"):
        ThreadServer(path, EngineConfig(backend="fake"))
    assert path.read_text() == "precious"


async def test_a_peer_of_another_uid_is_refused_before_hello(fake_server, monkeypatch):
    """The SO_PEERCRED check, with the kernel's answer faked (the test below does it for real, as root)."""
    import voiceapp.server.engine_server

    monkeypatch.setattr(voiceapp.server.engine_server, "peer_credentials", lambda sock: (4242, os.getuid() + 1))
    frames = await raw_exchange(fake_server.path, b"", hello=False)  # refused before we could say anything
    assert [(f["type"], f["code"]) for f in frames] == [("error", "peer-uid")]
    assert fake_server.status()["refused"] == 1
    monkeypatch.undo()
    assert await still_serves(fake_server.path)


@pytest.mark.skipif(os.geteuid() != 0 or not hasattr(socket, "SO_PEERCRED"), reason="needs root to switch uid")
def test_connections_from_another_uid_are_refused(fake_server):
    os.chmod(fake_server.path.parent, 0o755)
    os.chmod(fake_server.path, 0o666)  # only SO_PEERCRED stands in the way now
    for d in list(fake_server.path.parents)[:-1]:
        os.chmod(d, os.stat(d).st_mode | 0o011)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes "nobody" and tries to use the server
        try:
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(fake_server.path))
            s.settimeout(10)
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            os.write(write_end, reply)
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as f:
        reply = f.read()
    assert b'"code":"peer-uid"' in reply and b"hello" not in reply
    assert wait_for(lambda: fake_server.status()["refused"] == 1)
    assert asyncio.run(still_serves(fake_server.path))
