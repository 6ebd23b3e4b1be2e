"""Provides HttpApi: the OpenAI-compatible speech API of a `voicectl serve` process, served on the engine and the
event loop of its Unix-socket server (voiceapp.server.engine_server.EngineServer).

A thin shell: Starlette routes, served by uvicorn on a socket bound before the model loads. What a request means
is voiceapp.http.rules's, how its audio is written voiceapp.http.formats'. Each speech response's audio is pulled
from the engine and encoded by a task of its own (`_Pump`), a few pieces ahead of the client; whatever ends the
response (its end, a client gone, the server stopping) stops that task, which closes the engine's stream (the engine
aborts the request) and counts it. The first piece is awaited before the response starts, so a request the engine
refuses gets an error status rather than a 200 with no audio, and the first bytes go out with the first audio.

Connections are held to deadlines and a count (`_GuardedH11`, uvicorn's h11 protocol with what it lacks): a
request's head must arrive within `limits.timeout_s` of the connection or of the previous response, and its body
within as long; a client whose unread response stalls the writes for as long is cut off, an idle keep-alive
connection after IDLE_TIMEOUT_S. At most `max_connections` are held (well below the process's descriptor limit,
which the Unix socket shares): past that a new connection replaces the one waiting longest for a request, or gets
a 503 when all are busy. On a loopback address the Host header must name it (DNS rebinding), and a POST must say
its body is JSON (a web page cannot send that without CORS's consent).

A response is one of three shapes: streamed audio (chunked, as it is synthesized), a sized body (`stream: false`,
and FLAC unless streamed: encoded whole, sent with Content-Length), or server-sent events (`stream_format: "sse"`:
OpenAI's speech.audio.delta events with the audio in base64, each naming the sentences that start in it, then
speech.audio.done).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import resource
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Awaitable, Callable
from uuid import uuid4

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.config import SamplingOptions, SynthesisRequest
from engine.errors import EngineBusy, InputError, VoiceError, one_line
from engine.types import AudioChunk
from voiceapp.http.rules import (ApiError, HttpLimits, SpeechParams, authorized, expected_audio_s, is_loopback,
                                 models_body, openai_aliases, parse_speech, public_text, retry_after_s,
                                 voices_body)
from voiceapp.http.formats import FORMATS, StreamEncoder, supported_formats

if TYPE_CHECKING:
    from voiceapp.server.engine_server import EngineServer

IDLE_TIMEOUT_S = 5.0
"""A keep-alive connection with no new request is closed after this (uvicorn's timeout_keep_alive), or after
`limits.timeout_s` where that is shorter."""
RESERVED_FDS = 32
"""Descriptors kept from HTTP connections for the rest of the process (the engine's files, the Unix socket and
its clients): HTTP holds at most half of what the descriptor limit leaves after these (`connection_cap`)."""
ACCEPT_BATCH = 16
"""Connections accepted in one go (uvicorn's backlog, which asyncio also hands to listen()): a flood is taken, and
refused, a batch at a time, so the refused ones are closed before the next batch takes descriptors."""
LISTEN_BACKLOG = 1024
"""The kernel's queue of connections not yet accepted, set again once uvicorn has listened with ACCEPT_BATCH
(queued connections hold no descriptor of ours; a short queue makes clients' connects wait a second or more)."""
PIECES_AHEAD = 2
"""Encoded pieces a response's pump may hold ahead of its client: past that the engine waits, as for a slow
socket client."""
CLOSE_GRACE_S = 1.0
"""On stop, how long uvicorn lets responses end before it cancels them."""
IGNORED_HEADER = "X-Voiceapp-Ignored"
"""A speech response's header naming the request's fields this server took but did not act on (`ignored_list`)."""
LOGGED_FIELDS_MAX = 256
"""Distinct ignored field names the log mentions (once each); past that, one line says no more are logged."""
SSE_FRAMES_PER_S = 50
"""The unit of speech.audio.done's output_tokens: 20 ms of audio (this engine does not count billing tokens)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The HTTP API's listening socket, bound now (so that a port in use fails before the model loads)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as err:
        raise InputError(f"--http {host}:{port}: cannot listen there ({err.strerror or err})") from None


class HttpApi:
    """Serves POST /v1/audio/speech, GET /v1/models, /v1/audio/models, /v1/audio/voices and /health for `server`'s
    engine. With an API key, every request must carry it (Authorization: Bearer KEY)."""

    def __init__(self, server: EngineServer, sock: socket.socket, *, api_key: str | None = None,
                 limits: HttpLimits = HttpLimits(), cors: tuple[str, ...] = (),
                 log: Callable[[str], None] = print) -> None:
        self.server, self.sock, self.api_key, self.limits, self.log = server, sock, api_key, limits, log
        self.cors = cors
        self.formats = supported_formats()
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "rejected": 0, "busy": 0}
        """Speech requests by how they ended (served, cancelled: the client left, failed: the engine's error), and
        requests refused with 429 (busy) or another 4xx (rejected)."""
        self.created = int(time.time())
        self._pumps: set[_Pump] = set()
        self._uvicorn: _Uvicorn | None = None
        self._task: asyncio.Task | None = None
        self._log_handler = _LogLines(log)
        self._fields_logged: set[str] = set()
        self.max_connections = connection_cap(limits.max_connections)
        """HTTP connections held at once: the configured limit, or less where the descriptor limit is low."""
        self.refused_connections = 0
        """Connections turned away with a 503: the cap was full of connections busy with requests."""
        self.evicted_connections = 0
        """Connections closed to make room for a new one: the cap was full and they had no request under way."""
        host, port = sock.getsockname()[:2]
        self.hosts = loopback_hosts(port) if is_loopback(host) else None
        """The Host headers a request may carry (None: any), on a loopback address."""

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "api_key": bool(self.api_key), "formats": list(self.formats),
                "live": len(self._pumps), "max_streams": self.limits.max_streams,
                "max_chars": self.limits.max_chars, "max_connections": self.max_connections,
                "refused_connections": self.refused_connections, "evicted_connections": self.evicted_connections,
                "capacity_streams": _rounded(self.server.synth.capacity()), **self.counts}

    # -- life cycle ---------------------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [Route("/v1/audio/speech", self._guard(self._speech), methods=["POST"]),
                  Route("/v1/models", self._guard(self._models)),
                  Route("/v1/audio/models", self._guard(self._audio_models)),
                  Route("/v1/audio/voices", self._guard(self._voices)),
                  Route("/health", self._guard(self._health))]
        # any request header, for an allowed origin: the openai SDK in a browser sends its own x-stainless-* ones
        middleware = [Middleware(_Cors, allow_origins=list(self.cors), allow_methods=["GET", "POST"],
                                 allow_headers=["*"], expose_headers=[IGNORED_HEADER, "Retry-After"],
                                 max_age=600)] if self.cors else []
        return Starlette(routes=routes, middleware=middleware,
                         exception_handlers={HTTPException: self._http_error, Exception: self._internal_error})

    async def start(self) -> None:
        """Serve on the bound socket, on this event loop (no signal handlers of uvicorn's: `serve` owns those)."""
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addHandler(self._log_handler)
        uvicorn_log.propagate = False
        protocol = type("GuardedH11", (_GuardedH11,), {"api": self})
        # uvicorn annotates both timeouts as int, and hands them to asyncio's timers, which take float seconds
        config = uvicorn.Config(self.app(), http=protocol, lifespan="off", log_config=None, log_level="warning",
                                access_log=False, server_header=False,
                                timeout_graceful_shutdown=CLOSE_GRACE_S,  # type: ignore[arg-type]
                                timeout_keep_alive=min(IDLE_TIMEOUT_S, self.limits.timeout_s),  # type: ignore[arg-type]
                                backlog=ACCEPT_BATCH)
        self._uvicorn = _Uvicorn(config)
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[self.sock]))
        while not self._uvicorn.started:
            if self._task.done():
                self._task.result()
                raise VoiceError(f"the HTTP API did not start on {self.url}")
            await asyncio.sleep(0.01)
        self.sock.listen(LISTEN_BACKLOG)

    async def close(self) -> None:
        """Stop listening; responses still streaming are cut (their clients see the stream end early)."""
        if self._task is None or self._uvicorn is None:
            self.sock.close()
            return
        self._uvicorn.should_exit = True
        if self._pumps:
            self.log(f"HTTP: {len(self._pumps)} responses cut short")
        for pump in list(self._pumps):
            pump.stop()
        with contextlib.suppress(asyncio.TimeoutError, SystemExit):
            await asyncio.wait_for(self._task, CLOSE_GRACE_S + 5)
        logging.getLogger("uvicorn.error").removeHandler(self._log_handler)

    # -- requests -----------------------------------------------------------------------------------------

    def _guard(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """The checks every route has (the Host on loopback, JSON on a POST, the API key), and refusals as
        OpenAI-style errors (counted)."""
        async def endpoint(request: Request) -> Response:
            try:
                if self.hosts is not None and request.headers.get("host", "").lower() not in self.hosts:
                    raise ApiError(403, "the Host header must name this server's loopback address (a page of "
                                        "another site that resolves to it may not call it)", "host_not_allowed")
                if request.method == "POST" and not is_json(request.headers.get("content-type", "")):
                    raise ApiError(415, "the request body must be JSON: send Content-Type: application/json",
                                   "unsupported_media_type")
                if not authorized(request.headers.get("authorization"), self.api_key):
                    raise ApiError(401, "invalid API key: send Authorization: Bearer KEY with the key the server "
                                        "was started with", "invalid_api_key")
                return await handler(request)
            except ApiError as err:
                self.counts["busy" if err.status == 429 else "rejected"] += 1
                return error_response(err)
        return endpoint

    async def _speech(self, request: Request) -> Response:
        synth = self.server.synth
        params = parse_speech(await self._body(request), synth.voices, self.formats, synth.sample_rate,
                              self.limits)
        self._admit(synth)
        req, ignored = self._synthesis_request(params)
        client = f"http {request.client.host}:{request.client.port}" if request.client else "http"
        encoder = StreamEncoder(params.response_format, synth.sample_rate, params.sample_rate, speed=params.speed,
                                sized=params.sized)
        pump = _Pump(self.server.stream(req, client, self.counts), encoder, synth.sample_rate, params.speed,
                     expected_audio_s(params.text, params.speed))
        self._pumps.add(pump)
        pump.task.add_done_callback(lambda _: self._pumps.discard(pump))
        try:
            first = await pump.next()
        except EngineBusy as err:  # every engine replica is full (voiceapp.cluster.serve); counted by server.stream
            return error_response(ApiError(429, str(err), "too_many_requests", "rate_limit_error",
                                           headers={"Retry-After": str(err.retry_after_s)}))
        except VoiceError as err:  # refused by the engine before any audio (counted there as failed)
            status, kind = (400, "invalid_request_error") if isinstance(err, InputError) else (500, "server_error")
            return error_response(ApiError(status, str(err), "engine_error", kind))
        except BaseException:
            pump.stop()
            raise
        headers = {"Cache-Control": "no-store", **({IGNORED_HEADER: ignored_list(ignored)} if ignored else {})}
        media_type = FORMATS[params.response_format].media_type
        if params.stream_format == "sse":
            return _SpeechResponse(pump, _sse_events(pump, first, params.text), "text/event-stream", headers)
        if params.sized:
            try:
                body = b"".join([p.data async for p in pump.pieces(first)])
            except VoiceError as err:  # nothing was sent yet: the status can say so
                self.log(f"HTTP: {request.url.path}: the engine failed: {err}")
                return error_response(ApiError(500, str(err), "engine_error", "server_error"))
            finally:
                pump.stop()
            return Response(body, media_type=media_type, headers=headers)
        return _SpeechResponse(pump, (p.data async for p in pump.pieces(first)), media_type, headers)

    def _admit(self, synth: Any) -> None:
        """A 429 with Retry-After where one more stream is past --http-max-streams, or would push a live stream
        into an underrun (the engine's deadlines: Synthesizer.admit); Retry-After is when the live response nearest
        its end should end."""
        full = len(self._pumps) >= self.limits.max_streams
        if full:
            why = f"this server is speaking {len(self._pumps)} requests, the most it takes at once (--http-max-streams)"
        else:
            verdict = synth.admit()
            if verdict.admit:
                return
            why = f"this server is at capacity ({verdict.reason})"
        now = asyncio.get_running_loop().time()
        wait = retry_after_s((now - p.started, p.seconds, p.expected_s) for p in self._pumps)
        raise ApiError(429, f"{why}; try again in {wait} s", "too_many_requests", "rate_limit_error",
                       headers={"Retry-After": str(wait)})

    def _synthesis_request(self, params: SpeechParams) -> tuple[SynthesisRequest, list[str]]:
        """The engine's request for `params`, and the names of the fields it leaves unused. No family takes a
        style instruction (Orpheus renders emotion tags written in the input itself), so `instructions` is named as
        ignored; a family that takes one would hand it on here."""
        ignored = list(params.unused)
        if params.instructions:
            ignored.insert(0, "instructions")
        for name in ignored:
            if name in self._fields_logged or len(self._fields_logged) > LOGGED_FIELDS_MAX:
                continue
            self._fields_logged.add(name)
            if len(self._fields_logged) > LOGGED_FIELDS_MAX:
                self.log(f"HTTP: {LOGGED_FIELDS_MAX} ignored field names logged; no more will be")
                continue
            what = {"instructions": "the engine has no instruction knob",
                    "lang_code": "the model reads the text's own language"}.get(name, "not an API field")
            self.log(f"HTTP: ignoring the request field \"{ascii_name(name)}\" ({what}; logged once)")
        req = SynthesisRequest(params.text, voice=params.voice, options=SamplingOptions(seed=params.seed),
                               request_id=uuid4().hex)
        return req, ignored

    async def _body(self, request: Request) -> bytes:
        """The request body, at most `limits.max_body_bytes` (413 past that, 408 when it does not come)."""
        limit = self.limits.max_body_bytes
        too_big = ApiError(413, f"the request body exceeds {limit} bytes", "request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_big
        body = bytearray()

        async def read() -> None:
            async for piece in request.stream():
                body.extend(piece)
                if len(body) > limit:
                    raise too_big

        try:
            await asyncio.wait_for(read(), self.limits.timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.limits.timeout_s:g} s",
                           "timeout") from None
        return bytes(body)

    async def _models(self, request: Request) -> Response:
        return JSONResponse(models_body(self.created))

    async def _audio_models(self, request: Request) -> Response:
        """Open WebUI's list of speech models ({"models": [{"id"}]})."""
        return JSONResponse({"models": [{"id": m["id"]} for m in models_body(self.created)["data"]]})

    async def _voices(self, request: Request) -> Response:
        bank = self.server.synth.voices
        voices = {name: public_text(voice.description) for name, voice in bank.all().items()}
        return JSONResponse(voices_body(voices, openai_aliases(bank)))

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "live": len(self._pumps), "max_streams": self.limits.max_streams,
                             "capacity_streams": _rounded(self.server.synth.capacity())})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """Starlette's own refusals (no such path, wrong method) in OpenAI's error shape."""
        status = getattr(exc, "status_code", 400)
        detail = getattr(exc, "detail", "") or "bad request"
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "bad_request")
        self.counts["rejected"] += 1
        return error_response(ApiError(status, f"{request.method} {request.url.path}: {detail}", code))

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        """Whatever else the app raised (Starlette calls this for every such exception, also once a response has
        started, and uvicorn then cuts the connection): one log line."""
        if isinstance(exc, VoiceError):  # the engine failed mid-stream
            self.log(f"HTTP: {request.method} {request.url.path}: the audio was cut short: {exc}")
        elif not isinstance(exc, (StreamStopped, ClientDisconnect)):  # (a client gone while it sent its body)
            self.log(f"HTTP: internal error on {request.method} {request.url.path}: {one_line(exc)}")
        return error_response(ApiError(500, f"internal server error: {type(exc).__name__}", "internal_error",
                                       "server_error"))


def _rounded(capacity: float | None) -> float | None:
    """The engine's capacity in streams as status shows it (None: not measured yet; engine.deadlines)."""
    return None if capacity is None else round(capacity, 1)


def connection_cap(configured: int) -> int:
    """The HTTP connections this process may hold: `configured`, or half of what the descriptor limit leaves after
    RESERVED_FDS and a batch of connections being refused (ACCEPT_BATCH), where that is less (at least 2)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(2, min(configured, (soft - RESERVED_FDS - ACCEPT_BATCH) // 2))


def loopback_hosts(port: int) -> frozenset[str]:
    """The Host headers that name a loopback listener on `port` (the port may be left out only where it is 80)."""
    names = ("localhost", "127.0.0.1", "[::1]")
    return frozenset([f"{n}:{port}" for n in names] + (list(names) if port == 80 else []))


def ascii_name(name: str) -> str:
    """A field name as it may go into a header or a log line: JSON-escaped to printable ASCII (no line breaks),
    at most 64 characters."""
    text = json.dumps(name)[1:-1]
    return text if len(text) <= 64 else text[:61] + "..."


def ignored_list(names: list[str], most: int = 16) -> str:
    """IGNORED_HEADER's value: the names (`ascii_name`), at most `most` of them, then how many more."""
    shown = ", ".join(ascii_name(name) for name in names[:most])
    return shown + (f", and {len(names) - most} more" if len(names) > most else "")


def is_json(content_type: str) -> bool:
    """application/json, with or without parameters (charset)."""
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def error_response(err: ApiError) -> JSONResponse:
    headers = {**({"WWW-Authenticate": "Bearer"} if err.status == 401 else {}), **err.headers}
    return JSONResponse(err.body(), status_code=err.status, headers=headers or None)


class StreamStopped(Exception):
    """The server stopped while a response was streaming."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece of a response's encoded audio."""

    data: bytes
    """Encoded bytes of the response format (b"" only for a last piece that just carries `starts`)."""
    starts: tuple[tuple[int, float], ...] = ()
    """(sentence index, start in seconds of the response's audio) for each sentence whose audio begins in the
    samples encoded since the previous piece."""


class _Pump:
    """One response's audio: a task pulls chunks from the engine and encodes them, at most PIECES_AHEAD pieces
    ahead of the client. `stop` cancels that task, and the engine's stream is closed inside it, undisturbed by the
    cancellation of the response itself (Starlette cancels a response whose client left, again and again until it
    ends)."""

    def __init__(self, chunks: AsyncGenerator[AudioChunk, None], encoder: StreamEncoder, rate: int, speed: float,
                 expected_s: float = 0.0) -> None:
        self.started = asyncio.get_running_loop().time()
        """When the response's audio was first asked of the engine (the loop's clock)."""
        self.expected_s = expected_s
        """Seconds of audio its text should make (speech_api.expected_audio_s): what Retry-After estimates from."""
        self._pieces: asyncio.Queue[Piece | BaseException | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(PIECES_AHEAD)
        self._rate, self._speed = rate, speed
        self._starts: list[tuple[int, float]] = []
        self.seconds = 0.0
        """Seconds of audio the response carries so far (after `speed`)."""
        self.task = asyncio.create_task(self._run(chunks, encoder))

    async def _run(self, chunks: AsyncGenerator[AudioChunk, None], encoder: StreamEncoder) -> None:
        end: BaseException | None = StreamStopped("the server was stopped during the request")
        sentence = -1
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if not chunk.pause and chunk.sentence_index != sentence:
                        sentence = chunk.sentence_index
                        self._starts.append((sentence, round(self.seconds, 3)))
                    self.seconds += len(chunk.samples) / self._rate / self._speed
                    await self._put(encoder.encode(chunk.samples))
            await self._put(encoder.finish(), last=True)
            end = None
        except Exception as err:  # the engine's VoiceError (or a bug): the response ends with it
            end = err
        finally:
            encoder.close()
            self._pieces.put_nowait(end)

    async def _put(self, data: bytes, last: bool = False) -> None:
        if data or (last and self._starts):
            await self._room.acquire()
            self._pieces.put_nowait(Piece(data, tuple(self._starts)))
            self._starts.clear()

    async def next(self) -> Piece | None:
        """The next piece; None at the end. Raises what ended the audio early (the engine's VoiceError, or
        StreamStopped), and again on every later call."""
        piece = await self._pieces.get()
        if piece is None or isinstance(piece, BaseException):
            self._pieces.put_nowait(piece)
            if piece is not None:
                raise piece
            return None
        self._room.release()
        return piece

    async def pieces(self, first: Piece | None) -> AsyncIterator[Piece]:
        if first is not None:
            yield first
        while (piece := await self.next()) is not None:
            yield piece

    def stop(self) -> None:
        self.task.cancel()


async def _sse_events(pump: _Pump, first: Piece | None, text: str) -> AsyncIterator[bytes]:
    """OpenAI's speech events: a speech.audio.delta per piece (its audio in base64; ours: `sentences`, where each
    sentence starting in it begins), then speech.audio.done with the usage (characters in, 20 ms frames out)."""
    async for piece in pump.pieces(first):
        event: dict[str, Any] = {"type": "speech.audio.delta", "audio": base64.b64encode(piece.data).decode()}
        if piece.starts:
            event["sentences"] = [{"index": index, "start_s": start} for index, start in piece.starts]
        yield _sse(event)
    frames = round(pump.seconds * SSE_FRAMES_PER_S)
    yield _sse({"type": "speech.audio.done",
                "usage": {"input_tokens": len(text), "output_tokens": frames, "total_tokens": len(text) + frames}})


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class _SpeechResponse(StreamingResponse):
    """Streams a pump's pieces (`body`: what is sent of them); however the response ends, the pump stops."""

    def __init__(self, pump: _Pump, body: AsyncIterator[bytes], media_type: str, headers: dict[str, str]) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self.pump = pump

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass  # the client left (servers of ASGI 2.4 say so by raising): the pump stops below
        finally:
            self.pump.stop()


class _Cors(CORSMiddleware):
    """Starlette's CORS, except that an origin not allowed gets no CORS header at all: its preflight a 403 in
    OpenAI's error shape, its other requests the app's answer untouched (a browser then hides it from the page)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        origin = dict(scope.get("headers") or ()).get(b"origin") if scope["type"] == "http" else None
        if origin is None or self.is_allowed_origin(origin.decode("latin-1")):
            await super().__call__(scope, receive, send)
        elif scope["method"] == "OPTIONS":
            await error_response(ApiError(403, "this origin may not call the API (see voicectl serve --cors)",
                                          "origin_not_allowed"))(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the limits it lacks: at most `api.max_connections` at once (past that a 503 and
    the connection closed), a deadline for each request's head (slowloris; also a connection that sends nothing),
    and one for a client whose unread response fills the socket's buffers. At the cap, a new connection replaces
    the one that has waited longest for a request, if any does; only when all are busy is it refused. And a
    client that half-closes after its requests (`printf ... | nc`) gets all its answers: uvicorn let asyncio close
    the connection at the end of the client's data, dropping the answers still to come."""

    api: HttpApi
    _BUSY_BODY = json.dumps(ApiError(503, "too many connections; try again shortly", "too_many_connections",
                                     "server_error").body()).encode()
    _BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))

    # uvicorn's H11Protocol narrows asyncio's BaseTransport to Transport here; this takes what it takes
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._since = self.loop.time()
        if len(self.connections) >= self.api.max_connections and not self._evict_one():
            self.api.refused_connections += 1
            self.transport = transport
            transport.write(self._BUSY)
            transport.close()
            return
        super().connection_made(transport)
        self._peer_done = False
        self._arm_head_timer()

    def _evict_one(self) -> bool:
        """Make room by closing the connection that has waited longest for a request (idle, or a head still
        coming): a flood of silent connections then churns through the cap instead of holding it."""
        waiting = [c for c in self.connections if isinstance(c, _GuardedH11) and c._waiting()]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: c._since)
        self.api.evicted_connections += 1
        victim.transport.abort()
        self.connections.discard(victim)  # its connection_lost comes on the next turn of the loop
        return True

    def _waiting(self) -> bool:
        """Open, and neither answering a request nor holding one whole."""
        return (not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)
                and self.conn.their_state is h11.IDLE)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        if self in self.connections or self.flow is not None:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.flow is None:  # refused in connection_made
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    # asyncio.Protocol's eof_received may return true to keep the transport open; uvicorn annotates it as None
    def eof_received(self) -> bool:  # type: ignore[override]
        """The client sent all it will (true: keep the connection open to answer it)."""
        if self.flow is None:
            return False
        self._peer_done = True
        mid_body = self.conn.their_state is h11.SEND_BODY  # a body that can no longer arrive
        return not (mid_body or self._answered_all())

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self._peer_done and self._answered_all():
            self._unset_keepalive_if_required()
            self.transport.close()
        elif self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def _answered_all(self) -> bool:
        """No response under way and no request waiting in the buffer."""
        return (self.cycle is None or self.cycle.response_complete) and not self.conn.trailing_data[0]

    def pause_writing(self) -> None:
        if self.flow is None:
            return
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.api.limits.timeout_s, self._cut, "did not read its response")

    def resume_writing(self) -> None:
        if self.flow is None:
            return
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.api.limits.timeout_s, self._cut, "sent no complete request")

    def _cut(self, why: str) -> None:
        if not self.transport.is_closing():
            if why.startswith("did not read"):
                self.api.log(f"HTTP: {self.client[0] if self.client else 'a client'} {why} for "
                             f"{self.api.limits.timeout_s:g} s: connection closed")
            self.transport.abort()


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: `voicectl serve` owns SIGTERM and SIGINT, and stops the API itself."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _LogLines(logging.Handler):
    """uvicorn's warnings and errors as one line each in the server's log, except its reports of exceptions raised
    in the app: HttpApi._internal_error has logged those already."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is None:
            self._log(f"HTTP: {record.getMessage().strip()}")
