"""Provides EngineServer: one warm engine (engine.engine_api.Engine) served to local clients over a Unix socket (engine.protocol).

Safety: the socket directory is private (0700, ours), the socket is 0600, and connections from another uid are
refused (SO_PEERCRED). A lock file beside the socket makes a second server refuse to start; a socket file left by
a dead server is replaced. Every client gets its own request task; a client that cancels or disconnects has its
request aborted. Malformed input gets an error frame and the connection is closed; the server keeps serving.
Other front ends on the same engine (the HTTP API, voiceapp.http.api) run their requests through `stream`, so that
status lists and counts them too.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from uuid import uuid4

from engine.config import SamplingOptions, SynthesisRequest
from engine.deadlines import Verdict
from engine.errors import EngineBusy, InputError, VoiceError, one_line
from engine.events import Event, Notice
from engine.metrics import RequestMetrics
from engine.pacing import Pacer
from engine.pauses import GcPauses, LoopLag
from engine.engine_api import Engine
from engine.tuning import Tuning
from engine.types import AudioChunk
from engine.protocol import (PROTOCOL_VERSION, AudioFrame, ProtocolError, encode_audio, encode_message, error_message,
                             event_message, project_version, read_frame)
from voiceapp.server.client import lock_path, peer_credentials
from voiceapp.lockfile import LockHeld, PidLock

HELLO_TIMEOUT_S = 10.0
"""A connection that does not say hello within this is dropped."""
MAX_QUEUED_FRAMES = 8
"""Frames read ahead per connection (each at most MAX_FRAME_BYTES); past this the socket itself pushes back."""
MAX_PENDING_TEXT = 1 << 20
"""Characters of streamed text held for one request; past this the server stops reading until the synthesizer
has taken some (a fast sender waits, as it would in-process; the server's memory stays bounded)."""
MAX_UNIX_PATH = 107
ACCEPT_FAILURE_LOG_S = 10.0
"""At most one log line per this many seconds while the server cannot accept (out of file descriptors)."""
IDLE_CHECK_S = 1.0
"""How often a server with an idle timeout looks again while a client is connected."""


# ---- the socket's directory and lock ----------------------------------------------------------------------

def prepare_socket_dir(path: Path, private: bool) -> None:
    """Create the socket's directory (0700). `private`: it must be ours, and is made 0700 if it is not."""
    if len(os.fsencode(str(path))) > MAX_UNIX_PATH:
        raise InputError(f"socket path {path} is too long ({len(os.fsencode(str(path)))} bytes; Unix sockets "
                         f"allow {MAX_UNIX_PATH}); choose a shorter --socket")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a folder (or a link to one) once it returns
        st = os.lstat(path.parent)
    except OSError as err:  # a file where a folder should be, no permission, a read-only filesystem
        raise InputError(f"cannot make the socket's folder {path.parent}: {err.strerror or err}; pass another "
                         f"--socket") from None
    if not private:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise VoiceError(f"{path.parent} is not a directory owned by you; refusing to put the server socket there")
    if st.st_mode & 0o077:
        os.chmod(path.parent, 0o700)



def queued_notice(message: str) -> dict[str, Any]:
    """A waiting request's notice ("queued, N ahead") as its client reads it: a relayed Notice event."""
    relayed = event_message(Notice(message))
    if relayed is None:
        raise ValueError("Notice events must be relayed to clients (engine.protocol.FORWARDED_EVENTS)")
    return relayed

class SocketLock(PidLock):
    """An exclusive flock on `SOCKET.lock`, held for the server's life: a second server cannot start."""

    @classmethod
    def acquire(cls, socket_path: Path) -> "SocketLock":
        try:
            return super().acquire(lock_path(socket_path))
        except LockHeld as held:
            raise VoiceError(f"a voicectl server is already running (pid {held.pid}, socket {socket_path}); "
                             f"stop it first (voicectl stop), or pass --socket to run another") from None


def remove_stale_socket(path: Path) -> None:
    """We hold the lock, so a socket file there belongs to a dead server."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InputError(f"{path} exists and is not a socket; remove it or pass another --socket")
    os.unlink(path)


# ---- requests ---------------------------------------------------------------------------------------------

@dataclass
class _Live:
    """A request being served (what `voicectl status` lists)."""

    req: SynthesisRequest
    conn: "_Conn | None"
    """The socket client's connection; None for another front end's request."""
    client: str | None = None
    """Who asked, for a request of another front end ("http HOST:PORT")."""
    started: float = field(default_factory=time.monotonic)
    samples: int = 0
    """Samples sent so far (pauses included)."""
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    """Its engine events, folded."""
    text: "_PendingText | None" = None
    """Streamed text not yet taken by the synthesizer (requests with "stream": true)."""


def stderr_log(line: str) -> None:
    """The server's default log: one line on stderr."""
    print(f"voicectl serve: {line}", file=sys.stderr)


class LiveRequests:
    """The requests being served, by request id, and the engine's event sink that routes their events: build the
    engine with `events=requests.route`, then serve it with the same `requests` (EngineServer)."""

    def __init__(self, log: Callable[[str], None] = stderr_log) -> None:
        self.log = log
        """Where Notices go (the server's log)."""
        self.live: dict[str, _Live] = {}

    def route(self, event: Event) -> None:
        """An event of a request being served is folded into its metrics and relayed to its client; Notices go to
        the log; the rest (start-up phases, requests no longer served) is dropped."""
        if isinstance(event, Notice):
            self.log(event.message)
            return
        live = self.live.get(getattr(event, "request_id", ""))
        if live is None:
            return
        live.metrics.apply(event)
        message = event_message(event)
        if message is not None and live.conn is not None:
            live.conn.send(message)


class _PendingText:
    """A streamed request's text pieces on their way to the synthesizer, counted so the reader can wait while
    more than `limit` characters are waiting."""

    def __init__(self, limit: int = MAX_PENDING_TEXT) -> None:
        self.limit, self.chars, self.received = limit, 0, 0
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()

    def put(self, text: str | None) -> None:
        """A piece, or None for the end of the text."""
        self._queue.put_nowait(text)
        self.chars += len(text or "")
        self.received += len(text or "")
        if self.chars >= self.limit:
            self._room.clear()

    async def wait_for_room(self) -> None:
        await self._room.wait()

    async def pieces(self) -> AsyncIterator[str]:
        while (piece := await self._queue.get()) is not None:
            self.chars -= len(piece)
            if self.chars < self.limit:
                self._room.set()
            yield piece


class _Conn:
    """One client connection: a reader task turns bytes into frames on a queue, so requests and their control
    messages (text pieces, cancel) are read by one owner and nothing is lost when a waiter is cancelled."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.peer_pid: int | None = None
        self._frames: asyncio.Queue[dict[str, Any] | AudioFrame | Exception | None] = \
            asyncio.Queue(MAX_QUEUED_FRAMES)
        self._reader_task = asyncio.create_task(self._read_all(reader))

    async def _read_all(self, reader: asyncio.StreamReader) -> None:
        """Queue frames until the stream ends (None) or fails: any failure is handed to the reader of the queue,
        whose connection it then ends (a reader that died silently would leave its handler waiting forever)."""
        try:
            while (frame := await read_frame(reader)) is not None:
                await self._frames.put(frame)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except Exception as err:  # ProtocolError, or a bug: either way this connection is over
            await self._frames.put(err)
            return
        await self._frames.put(None)

    async def next(self) -> dict[str, Any] | None:
        """The next message; None when the client has gone. Raises ProtocolError on a malformed frame, and
        whatever else ended the reader."""
        frame = await self._frames.get()
        if isinstance(frame, Exception):
            raise frame
        if isinstance(frame, AudioFrame):
            raise ProtocolError("unexpected", "clients do not send audio frames")
        return frame

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode_message(message))

    async def close(self) -> None:
        self._reader_task.cancel()
        await close_writer(self.writer)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close now: what a peer has not taken is dropped (a flush could wait forever on a peer that reads nothing)."""
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()
    else:
        writer.close()
    with contextlib.suppress(OSError, asyncio.CancelledError, asyncio.TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


def parse_say(message: dict[str, Any]) -> SynthesisRequest:
    """The request a `say` message asks for; InputError on bad fields."""
    text, voice, seed = message.get("text", ""), message.get("voice", "default"), message.get("seed")
    options = message.get("options") or {}
    if not isinstance(text, str) or not isinstance(voice, str) or not isinstance(options, dict):
        raise InputError("say: text and voice must be strings, options an object")
    from voiceapp.limits import REQUEST

    allowed = set(REQUEST) - {"seed"}
    if set(options) - allowed:
        raise InputError(f"say: unknown options {sorted(set(options) - allowed)}")
    if seed is not None:
        REQUEST["seed"].check(seed, "say: seed")
    for key, value in options.items():  # the CLI's table: a float top_k or a NaN fails here, not deep in a sampler
        REQUEST[key].check(value, f"say: {key}")
    try:
        return SynthesisRequest(text, voice=voice, options=SamplingOptions(seed=seed, **options),
                                request_id=uuid4().hex)
    except (TypeError, ValueError) as err:
        raise InputError(f"say: {err}") from None


# ---- the server -------------------------------------------------------------------------------------------

ADMISSION_POLL_S = 0.05
"""How often a queued socket request asks again: a stream that ends frees its room within this."""


class AdmissionLine:
    """Socket requests the engine cannot take yet (one more would push a live stream into an underrun:
    Synthesizer.admit) wait here, first come first served; each is told once where it stands, and again when that
    changes ("queued, N ahead"). A request that finds the line empty and the engine able to take it starts at
    once: no wait, no message."""

    def __init__(self, admit: Callable[[], Verdict], poll_s: float = ADMISSION_POLL_S) -> None:
        self.admit, self.poll_s = admit, poll_s
        self._line: deque[object] = deque()

    def __len__(self) -> int:
        return len(self._line)

    async def turn(self, notify: Callable[[str], None]) -> None:
        """Return once it is this request's turn and the engine admits it; `notify` gets each notice."""
        if not self._line and self.admit().admit:
            return
        place = object()
        self._line.append(place)
        told = None
        try:
            while True:
                ahead = self._line.index(place)
                verdict = self.admit() if ahead == 0 else None
                if verdict is not None and verdict.admit:
                    return
                if ahead != told:
                    why = f" ({verdict.reason})" if verdict is not None else ""
                    notify(f"queued, {ahead} ahead: the engine is at capacity{why}; it starts when a live stream "
                           f"has room")
                    told = ahead
                await asyncio.sleep(self.poll_s)
        finally:
            self._line.remove(place)



class EngineServer:
    """Serves `synth` (an engine.engine_api.Engine: a Synthesizer, or replicas on Ray) on a Unix socket. `requests`:
    the LiveRequests whose `route` is the engine's event sink (so that each request's events reach its client)."""

    def __init__(self, synth: Engine, path: Path, requests: LiveRequests, *, lock: SocketLock | None = None,
                 private_dir: bool = False, log: Callable[[str], None] | None = None, idle_timeout_s: float = 0.0,
                 auto_started: bool = False, tuning: Tuning | None = None) -> None:
        self.synth, self.path, self.requests, self.lock = synth, path, requests, lock
        self.tuning = tuning
        """What the server builds while it answers (engine.tuning), shown by status; None: nothing."""
        self.private_dir = private_dir
        """The socket's directory must be ours and is kept 0700 (the default location)."""
        self.idle_timeout_s = idle_timeout_s
        """`wait_idle` returns once no client has been connected for this long; 0 = never (shown by status)."""
        self.auto_started = auto_started
        """Started by `say` or the TUI rather than by hand (shown by status)."""
        self.log = log or requests.log
        self.started_at = time.time()
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "refused": 0, "busy": 0}
        self.pace = Pacer()
        """What the engine's audio was like as this server sent it (speed, lead: engine.pacing), told in the hello
        so that a client which lives for one request (`say`) starts from it."""
        self.line = AdmissionLine(synth.admit)
        """Socket requests waiting for room (shown by status as `queued`)."""
        self.http: Any = None
        """The HTTP API serving this engine too (voiceapp.http.api.HttpApi), shown by status; None: none."""
        self.gc = GcPauses()
        """The collector's runs in this process while it serves (shown by status: a long full run stops every
        stream at once)."""
        self.loop_lag = LoopLag(busy=lambda: bool(self.requests.live))
        """How late its event loop woke a sleeping task while streams were live (shown by status: a held loop holds
        every stream's audio)."""
        self._handlers: set[asyncio.Task] = set()
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None
        self._accept_failure_logged = -ACCEPT_FAILURE_LOG_S
        self._stopping = False
        self._idle_since = time.monotonic()

    # -- life cycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the lock (unless given), replace a stale socket, listen (0600)."""
        prepare_socket_dir(self.path, self.private_dir)
        if self.lock is None:
            self.lock = SocketLock.acquire(self.path)
        remove_stale_socket(self.path)
        umask = os.umask(0o177)  # the socket is born 0600: no window in a directory others can enter
        try:
            self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        finally:
            os.umask(umask)
        os.chmod(self.path, 0o600)
        self._inode = os.stat(self.path).st_ino
        asyncio.get_running_loop().set_exception_handler(self._loop_exception)
        self.gc.start()
        self.loop_lag.start()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Out of descriptors, asyncio logs a traceback for every refused accept, many a second: one line per
        ACCEPT_FAILURE_LOG_S instead (the server takes connections again once clients close theirs)."""
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._accept_failure_logged >= ACCEPT_FAILURE_LOG_S:
            self._accept_failure_logged = now
            error = context.get("exception")
            self.log(f"cannot accept connections ({one_line(error) if error else 'out of resources'}); "
                     f"retrying as clients close theirs")

    async def close(self) -> None:
        """Stop listening, end in-flight requests (their clients get a "shutting down" error), remove the socket."""
        self._stopping = True
        self.gc.stop()
        self.loop_lag.stop()
        if self._server is not None:
            self._server.close()
        for live in list(self.requests.live.values()):
            if live.conn is not None:
                live.conn.send(error_message("shutdown", "the voicectl server was stopped during the request"))
        self.requests.live.clear()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)
        self._remove_socket()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        await self.synth.close()

    def idle_s(self) -> float:
        """Seconds since the last client went away or request ended (or since the start); 0 while a client is
        connected or a request runs."""
        return 0.0 if self._handlers or self.requests.live else time.monotonic() - self._idle_since

    async def wait_idle(self) -> None:
        """Return once no client (and so no request) has been connected for `idle_timeout_s`; never if it is 0."""
        if not self.idle_timeout_s:
            await asyncio.Event().wait()
        while (left := self.idle_timeout_s - self.idle_s()) > 0:
            await asyncio.sleep(min(left, IDLE_CHECK_S))

    def _remove_socket(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:  # never remove a socket another server bound since
                os.unlink(self.path)

    # -- what clients see ---------------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        return {"type": "hello", "v": PROTOCOL_VERSION, "version": project_version(), "pid": os.getpid(),
                "sample_rate": self.synth.sample_rate, **self.synth.describe(), **self.pace.measured()}

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        streams = [{"voice": live.req.voice, "chars": len(live.req.text) + (live.text.received if live.text else 0),
                    "client_pid": live.conn.peer_pid if live.conn else None, "client": live.client,
                    "age_s": now - live.started, "audio_s": live.samples / self.synth.sample_rate,
                    "ttfa_ms": None if live.metrics.ttfa_s is None else live.metrics.ttfa_s * 1000,
                    "text_pending": live.text.chars if live.text else 0} for live in self.requests.live.values()]
        return {**self.hello(), "type": "status", "socket": str(self.path), "started": self.started_at,
                "uptime_s": time.time() - self.started_at, "clients": len(self._handlers), "streams": streams,
                "queued": len(self.line),
                "idle_timeout_s": self.idle_timeout_s, "auto_started": self.auto_started,
                "gc": self.gc.status(), "loop": self.loop_lag.status(),
                **({"tuning": self.tuning.status()} if self.tuning is not None else {}),
                **({"http": self.http.status()} if self.http is not None else {}),
                **self.synth.status(), **self.counts}

    # -- other front ends ---------------------------------------------------------------------------------

    async def stream(self, req: SynthesisRequest, client: str, counts: dict[str, int],
                     text_stream: AsyncIterable[str] | None = None) -> AsyncGenerator[AudioChunk, None]:
        """Another front end's request: its audio, listed by status while it runs, counted (in `counts` too) when
        it ends: served, failed (the engine's VoiceError, raised on), busy (EngineBusy: every engine was full) or
        cancelled (closed before its end). Text
        from `text_stream` follows the request's own, as it comes."""
        live = self.requests.live[req.request_id] = _Live(req, None, client=client)
        outcome = "cancelled"
        try:
            async with contextlib.aclosing(self.synth.synthesize(req, text_stream)) as chunks:
                async for chunk in chunks:
                    live.samples += len(chunk.samples)
                    yield chunk
            outcome = "served"
        except EngineBusy:  # refused before any audio: the front end says so (HTTP: 429)
            outcome = "busy"
            raise
        except VoiceError:
            outcome = "failed"
            raise
        finally:
            self.requests.live.pop(req.request_id, None)
            self._idle_since = time.monotonic()
            self.counts[outcome] += 1
            counts[outcome] += 1

    # -- connections --------------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's handler as a task
        self._handlers.add(task)
        conn = _Conn(reader, writer)
        try:
            await self._converse(conn)
        except ProtocolError as err:
            conn.send(error_message(err.code, str(err)))
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as err:  # a bug must cost one connection, never the server
            self.log(f"internal error on a connection: {one_line(err)}")
            conn.send(error_message("internal", f"internal server error: {type(err).__name__}"))
        finally:
            self._handlers.discard(task)
            self._idle_since = time.monotonic()
            with contextlib.suppress(OSError):
                await asyncio.wait_for(writer.drain(), 1.0)
            await conn.close()

    async def _converse(self, conn: _Conn) -> None:
        creds = peer_credentials(conn.writer.get_extra_info("socket"))
        conn.peer_pid = creds[0] if creds else None
        if creds is not None and creds[1] != os.getuid():
            self.counts["refused"] += 1
            conn.send(error_message("peer-uid", "refused: the voicectl server only serves its own user"))
            return
        hello = await asyncio.wait_for(conn.next(), HELLO_TIMEOUT_S)
        if hello is None:
            return
        if hello.get("type") != "hello":
            raise ProtocolError("unexpected", f"expected hello, got {hello.get('type')!r}")
        if hello.get("v") != PROTOCOL_VERSION:
            raise ProtocolError("version", f"protocol version {hello.get('v')!r} is not supported (this server "
                                           f"speaks {PROTOCOL_VERSION}); restart `voicectl serve` after upgrading")
        conn.send(self.hello())
        while not self._stopping and (message := await conn.next()) is not None:
            kind = message["type"]
            if kind == "status":
                conn.send(self.status())
            elif kind == "ping":
                conn.send({"type": "pong"})
            elif kind == "say":
                if not await self._serve_say(conn, message):
                    return
            else:
                raise ProtocolError("unexpected", f"unexpected message type {kind!r}")
            await conn.writer.drain()

    async def _serve_say(self, conn: _Conn, message: dict[str, Any]) -> bool:
        """Run one request; False when the connection is finished (client gone or protocol error).
        The final reply goes out only once the engine has let go of the request."""
        try:
            req = parse_say(message)
        except InputError as err:
            conn.send(error_message("bad-request", str(err), type(err).__name__))
            return True
        text = _PendingText() if message.get("stream") else None
        live = self.requests.live[req.request_id] = _Live(req, conn, text=text)
        producer = asyncio.create_task(self._produce(live, None if text is None else text.pieces()))
        control = asyncio.create_task(self._control(conn, text))
        try:
            await asyncio.wait({producer, control}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (producer, control):
                task.cancel()
            await asyncio.gather(producer, control, return_exceptions=True)
            self.requests.live.pop(req.request_id, None)
        outcome, error = producer.result() if not producer.cancelled() else (control.result(), None)
        self.counts[{"done": "served", "failed": "failed"}.get(outcome, "cancelled")] += 1
        if outcome == "failed":
            conn.send(error_message("failed", str(error), type(error).__name__))
        elif outcome in ("done", "cancel"):
            conn.send({"type": "done", "cancelled": outcome == "cancel"})
        return outcome != "gone"

    async def _produce(self, live: _Live, text_stream: AsyncIterator[str] | None) -> tuple[str, VoiceError | None]:
        """Stream the request's audio to its client: ("done" | "failed" | "gone", the error if failed)."""
        conn = live.conn
        if conn is None:
            raise ValueError("only a socket client's request is produced here")
        try:
            await self.line.turn(lambda message: conn.send(queued_notice(message)))
            pace, rate = self.pace.request(), self.synth.sample_rate
            async with contextlib.aclosing(self.synth.synthesize(live.req, text_stream)) as chunks:
                async for chunk in chunks:
                    now = time.perf_counter()
                    age = 0.0 if chunk.made_at is None else max(0.0, now - chunk.made_at)
                    pace.arrived(len(chunk.samples) / rate, chunk.sentence_end, now, None, chunk.made_at)
                    for frame in encode_audio(chunk.sentence_index, chunk.samples, chunk.sentence_end, chunk.pause,
                                              age):
                        conn.writer.write(frame)
                    live.samples += len(chunk.samples)
                    blocked_from = time.perf_counter()
                    await conn.writer.drain()  # backpressure: a client that plays in real time paces us
                    pace.blocked(time.perf_counter() - blocked_from)
        except VoiceError as err:
            return "failed", err
        except OSError:
            return "gone", None
        return "done", None

    async def _control(self, conn: _Conn, pending: _PendingText | None) -> str:
        """Read the client's messages during a request: text pieces, end, cancel. Returns "cancel" or "gone".
        While too much streamed text is waiting, nothing is read (a client that leaves meanwhile is noticed when
        its audio cannot be written)."""
        try:
            while True:
                if pending is not None:
                    await pending.wait_for_room()
                if (message := await conn.next()) is None:
                    break
                kind = message["type"]
                if kind == "cancel":
                    return "cancel"
                if pending is None or kind not in ("text", "end"):
                    raise ProtocolError("unexpected", f"unexpected {kind!r} message during a request")
                text = message.get("text") if kind == "text" else None
                if kind == "text" and not isinstance(text, str):
                    raise ProtocolError("bad-json", "a text message needs a string \"text\"")
                pending.put(text)
        except ProtocolError as err:
            conn.send(error_message(err.code, str(err)))
        return "gone"

