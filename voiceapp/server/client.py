"""Provides the engine server's client: RemoteSynthesizer, a Synthesizer lookalike (`synthesize` / `render` /
`speak`) whose audio comes from a warm `voicectl serve` process. Where the socket lives: voiceapp.server.rendezvous.

Audio plays in the client (its own Player), so `say` behaves the same whether the engine is in-process or not.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterable

from engine import errors
from engine.config import SynthesisRequest
from engine.errors import VoiceError
from engine.events import EventSink, FirstAudio, RequestStarted, SentenceStarted, ignore_events
from engine.folds import UtteranceFolds
from engine.pacing import Pacer
from engine.protocol import (MAX_TEXT_PIECE, PROTOCOL_VERSION, AudioFrame, ProtocolError, encode_message,
                             parse_event, read_frame)
from engine.types import AudioChunk
from voiceapp.server.rendezvous import (CONNECT_TIMEOUT_S, FIRST_REPLY_S, SentSay, ServerNotAnswering,  # noqa: F401
                                    default_socket_path, is_default_location, lock_holder, lock_path,
                                    not_answering, peer_credentials, say_message, serve_pids, server_mismatch,
                                    socket_path)



STOP_SETTLE_S = 2.0
"""How long a client whose connection ended waits to learn whether the server stopped or died."""


async def stopped_cleanly(path: Path, settle_s: float = STOP_SETTLE_S) -> bool:
    """Whether the server at `path`, whose connection just ended, is stopping cleanly: a server that stops (voicectl
    stop, SIGTERM, its idle timeout) removes its lock file once its connections are closed; one that is killed or
    crashes leaves the file with nobody holding it. False when neither shows within `settle_s`."""
    lock, end = lock_path(path), time.monotonic() + settle_s
    while time.monotonic() < end:
        if not lock.exists():
            return True
        if lock_holder(path) is None:
            return False
        await asyncio.sleep(0.02)
    return False


class ServerGone(VoiceError):
    """The server closed the connection in the middle of a request (killed, crashed or shut down)."""

    def __init__(self, message: str, audio_started: bool) -> None:
        super().__init__(message)
        self.audio_started = audio_started
        """Whether any audio of the request had arrived (if not, the caller may redo it in-process)."""


class ServerUnusable(VoiceError):
    """A server answers at the socket but cannot stand in for the engine asked for (another project or protocol
    version, backend or model; another user): the caller speaks in-process and leaves that server alone."""


# ---- connection -------------------------------------------------------------------------------------------

class Connection:
    """One open connection to a server, after the hello exchange."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, info: dict[str, Any]) -> None:
        self.reader, self.writer, self.info = reader, writer, info

    @classmethod
    async def open(cls, path: Path, timeout_s: float = CONNECT_TIMEOUT_S,
                   silence_is_error: bool = False) -> "Connection | None":
        """Connect and say hello; None when no server is listening there (no socket, or a stale one).

        Raises VoiceError when a server answers but cannot serve us (different protocol version, refused), and
        with `silence_is_error`, ServerNotAnswering when something holds the socket but does not say hello within
        `timeout_s` (a stopped or stuck server: waiting on it, or starting another, would wait for good).
        """
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), timeout_s)
        except asyncio.TimeoutError:  # the listen queue is full: nobody has accepted for a while
            if silence_is_error:
                raise ServerNotAnswering(not_answering(path, timeout_s)) from None
            return None
        except OSError:
            return None
        conn = cls(reader, writer, {})
        try:
            creds = peer_credentials(writer.get_extra_info("socket"))
            if creds is not None and creds[1] != os.getuid():
                raise VoiceError(f"the server at {path} runs as another user; refusing to use it")
            await conn.send({"type": "hello", "v": PROTOCOL_VERSION})
            reply = await asyncio.wait_for(read_frame(reader), timeout_s)
            if not isinstance(reply, dict) or reply.get("type") not in ("hello", "error"):
                raise VoiceError(f"the process at {path} does not speak the voiceapp protocol")
            if reply["type"] == "error":
                raise error_from(reply)
            conn.info = reply
            return conn
        except asyncio.TimeoutError:
            await conn.close()
            if silence_is_error:
                raise ServerNotAnswering(not_answering(path, timeout_s)) from None
            return None
        except (OSError, asyncio.IncompleteReadError, ProtocolError):
            await conn.close()
            return None
        except BaseException:
            await conn.close()
            raise

    async def send(self, message: dict[str, Any]) -> None:
        self.writer.write(encode_message(message))
        await self.writer.drain()

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message and return the one JSON reply (error replies are raised)."""
        await self.send(message)
        reply = await read_frame(self.reader)
        if not isinstance(reply, dict):
            raise VoiceError("the server closed the connection without answering")
        if reply["type"] == "error":
            raise error_from(reply)
        return reply

    async def close(self) -> None:
        """Close at once, dropping unsent data: a server holding back a fast text stream reads nothing more."""
        self.writer.transport.abort()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


def error_from(reply: dict[str, Any]) -> VoiceError:
    """The VoiceError subclass the server named (so exit codes match the in-process run)."""
    cls = getattr(errors, str(reply.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, VoiceError)):
        cls = VoiceError
    return cls(str(reply.get("message") or "the server reported an error"))


async def server_status(path: Path) -> dict[str, Any] | None:
    """The server's status reply, or None when no server is running at `path`."""
    conn = await Connection.open(path)
    if conn is None:
        return None
    try:
        return {**conn.info, **await conn.request({"type": "status"})}
    finally:
        await conn.close()


# ---- the Synthesizer lookalike ----------------------------------------------------------------------------

class RemoteSynthesizer(UtteranceFolds):
    """Streams a request's audio from the server. One request at a time per instance.

    Events: RequestStarted and FirstAudio are measured here (so TTFA includes the socket); the server's
    FirstToken, ChunkDecoded, SentenceFinished, RequestFinished, RequestFailed and Notice are relayed.
    """

    def __init__(self, conn: Connection, path: Path, events: EventSink = ignore_events) -> None:
        self.path, self.events = path, events
        self.info = conn.info
        """The server's hello: pid, project version, model, backend, sample_rate."""
        self.sample_rate = int(conn.info.get("sample_rate", 16000))
        self.pacer = Pacer.from_hello(conn.info)
        """Pacing of `speak`, the server's engine's (engine.pacing); it learns the speed in this client."""
        self.started_server = False
        """This client started the server (`voiceapp.server.autostart`); it keeps running after the client is done."""
        self._conn: Connection | None = conn
        self._sent: SentSay | None = None
        """A request already sent on `_conn` (`adopt`): the next `synthesize` reads its answer instead of asking."""

    @classmethod
    async def adopt(cls, sent: SentSay, path: Path, events: EventSink = ignore_events) -> "RemoteSynthesizer":
        """Take over a connection on which `voiceapp.server.rendezvous.send_say` has sent a request: the next
        `synthesize` call, with that same request, streams its answer."""
        reader, writer = await asyncio.open_unix_connection(sock=sent.sock)
        remote = cls(Connection(reader, writer, sent.info), path, events)
        remote._sent = sent
        return remote

    @classmethod
    async def connect(cls, path: Path, events: EventSink = ignore_events) -> "RemoteSynthesizer | None":
        """A client of the server at `path`; None when none listens. ServerNotAnswering when one holds the socket
        but does not answer."""
        conn = await Connection.open(path, silence_is_error=True)
        return None if conn is None else cls(conn, path, events)

    async def synthesize(self, req: SynthesisRequest,
                         text_stream: AsyncIterable[str] | None = None) -> AsyncGenerator[AudioChunk, None]:
        conn = self._conn or await Connection.open(self.path)
        self._conn = None  # a connection left mid-request is closed, never reused
        if conn is None:
            raise ServerGone(f"the voicectl server at {self.path} is not running any more", audio_started=False)
        sent, self._sent = self._sent, None
        t0 = sent.sent_perf if sent is not None else time.perf_counter()
        self.events(RequestStarted(req.request_id, t0))
        pieces = [req.text[i:i + MAX_TEXT_PIECE] for i in range(0, len(req.text), MAX_TEXT_PIECE)] or [""]
        streamed = text_stream is not None or len(pieces) > 1
        sender = None
        state = _Received()
        try:
            if sent is None:
                await conn.send(say_message(req, pieces[0], streamed))
            elif streamed:
                raise ValueError("a request sent ahead carries its whole text: nothing may follow")
            if streamed:
                sender = asyncio.create_task(_send_text(conn, pieces[1:], text_stream))
            try:
                async for chunk in self._receive(conn, req, t0, state):
                    yield chunk
            except errors.Cancelled:
                await _raise_failure(sender)  # the text stream failed: that is the error to report
                raise
            self._conn = conn
        finally:
            if sender is not None and not sender.done():
                sender.cancel()
            elif sender is not None and not sender.cancelled():
                sender.exception()  # seen: a failed send (the server hung up) is reported as what was read back
            if self._conn is not conn:
                await conn.close()  # the server aborts a request whose client went away

    async def _receive(self, conn: Connection, req: SynthesisRequest, t0: float,
                       state: "_Received") -> AsyncGenerator[AudioChunk, None]:
        while True:
            frame = await self._next_frame(conn, state)
            if isinstance(frame, AudioFrame):
                if not frame.pause and not state.audio:
                    self.events(FirstAudio(req.request_id, time.perf_counter() - t0))
                state.audio = state.audio or not frame.pause
                made_at = time.perf_counter() - frame.age_s if frame.age_s > 0 else None
                yield AudioChunk(req.request_id, frame.samples, self.sample_rate, frame.sentence_index,
                                 state.chunks, frame.sentence_end, frame.pause, state.planned.get(frame.sentence_index),
                                 made_at)
                state.chunks += 1
            elif frame["type"] == "event":
                event = parse_event(frame, req.request_id)
                if isinstance(event, SentenceStarted):
                    state.planned[event.sentence_index] = event.planned_s
                if event is not None:
                    self.events(event)
            elif frame["type"] == "done":
                if frame.get("cancelled"):
                    raise errors.Cancelled("the request was cancelled")
                return
            elif frame["type"] == "error":
                if frame.get("code") == "shutdown":  # like a kill, but announced: the caller may redo it
                    raise ServerGone(str(frame.get("message") or "the voicectl server was stopped"), state.audio)
                raise error_from(frame)

    async def _next_frame(self, conn: Connection, state: "_Received") -> dict[str, Any] | AudioFrame:
        try:
            frame = await (self._first_reply(conn) if not state.replied else read_frame(conn.reader))
        except (OSError, asyncio.IncompleteReadError, ProtocolError):
            frame = None
        state.replied = True
        if frame is None:
            said = "after some audio" if state.audio else "before any audio"
            pid = self.info.get("pid", "?")
            if await stopped_cleanly(self.path):  # its "stopped" frame was queued behind audio we had not read
                raise ServerGone(f"the voicectl server (pid {pid}) was stopped during the request, {said}",
                                 audio_started=state.audio)
            raise ServerGone(f"the voicectl server (pid {pid}) stopped in the middle of the request, {said} "
                             f"(killed or crashed?)", audio_started=state.audio)
        return frame

    async def _first_reply(self, conn: Connection) -> dict[str, Any] | AudioFrame | None:
        """The request's first frame. While it is late (FIRST_REPLY_S at a time) the server is asked for a hello on
        a new connection; one that does not answer is given up on: ServerGone, no audio yet, so a text argument
        is spoken in-process (a server stopped with SIGSTOP after its hello would be waited on for good)."""
        reading = asyncio.ensure_future(read_frame(conn.reader))
        try:
            while not (await asyncio.wait({reading}, timeout=FIRST_REPLY_S))[0]:
                try:
                    probe = await Connection.open(self.path, silence_is_error=True)
                except ServerNotAnswering as err:
                    raise ServerGone(str(err), audio_started=False) from None
                except VoiceError:
                    probe = None
                if probe is not None:
                    await probe.close()
            return reading.result()
        finally:
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reading

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


async def _raise_failure(sender: "asyncio.Task[None] | None") -> None:
    if sender is not None:
        await asyncio.wait([sender], timeout=1.0)
        error = sender.exception() if sender.done() and not sender.cancelled() else None
        if error is not None:
            raise error


class _Received:
    """What a request has received so far."""

    def __init__(self) -> None:
        self.audio = False
        self.replied = False
        """Any frame has come (until then the server is asked whether it still answers: `_first_reply`)."""
        self.chunks = 0
        self.planned: dict[int, float] = {}
        """Sentence index -> its planned seconds (SentenceStarted), for the chunks' `planned_s`."""


async def _send_text(conn: Connection, pieces: list[str], text_stream: AsyncIterable[str] | None) -> None:
    """Send the rest of the text, then "end". On a failing stream (e.g. binary stdin) cancel the request; the
    error is re-raised by synthesize() once the server confirms."""
    try:
        for piece in pieces:
            await conn.send({"type": "text", "text": piece})
        if text_stream is not None:
            async for text in text_stream:
                for i in range(0, len(text), MAX_TEXT_PIECE):
                    await conn.send({"type": "text", "text": text[i:i + MAX_TEXT_PIECE]})
        await conn.send({"type": "end"})
    except (OSError, asyncio.CancelledError):
        raise
    except BaseException:
        try:
            await conn.send({"type": "cancel"})
        except OSError:
            pass
        raise


async def connect_usable(path: Path, backend: str, model: str | None,
                         events: EventSink = ignore_events) -> "RemoteSynthesizer | None":
    """A RemoteSynthesizer on the server at `path` if one runs and can stand in for the engine these options ask
    for; None when no server listens there. Raises ServerUnusable when one answers that cannot stand in."""
    try:
        remote = await RemoteSynthesizer.connect(path, events)
    except VoiceError as err:  # a server that cannot serve us (another protocol version, another user)
        raise ServerUnusable(str(err)) from None
    if remote is None:
        return None
    try:
        why = server_mismatch(remote.info, backend, model)
    except BaseException:
        await remote.close()
        raise
    if why is not None:
        await remote.close()
        raise ServerUnusable(f"the running server {why}")
    return remote
