"""Provides the Wyoming protocol front end (Home Assistant's voice pipeline): `voicectl serve --wyoming
tcp://HOST:PORT` serves text to speech on the server's engine and event loop, with the `wyoming` package's event
types and writer.

A connection may ask `describe` (answered with `info`: the voices, streaming supported), `synthesize` (one text),
or stream text as it is written: `synthesize-start`, `synthesize-chunk`s, `synthesize-stop`. A streamed request is
one engine request fed as the chunks come, so its first sentence is heard while the rest is still being written or
made; Home Assistant also sends a plain `synthesize` with the whole text inside a stream, for servers that do not
stream, which is ignored there. Audio goes back as `audio-start`, `audio-chunk`s (16-bit mono at the engine's own
rate) and `audio-stop`; a streamed request ends with `synthesize-stopped`.

Events are read here, with limits (the package's reader takes any length a peer announces): a line, its data or
its payload over the limits, JSON that is not an event, or a connection that ends mid-event gets one `error` event
and the connection is closed; an unknown event type gets an `error` and the connection goes on. A client that goes
away mid-audio cancels its request. None of this reaches other connections.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Callable
from urllib.parse import urlparse
from uuid import uuid4

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from engine.config import SamplingOptions, SynthesisRequest
from engine.errors import InputError, VoiceError
from engine.families import family
from engine.voices import resolve_name

if TYPE_CHECKING:
    from voiceapp.server.engine_server import EngineServer

SAMPLE_WIDTH = 2
"""Bytes per sample of the audio sent: 16-bit PCM, what Home Assistant plays."""
CHUNK_S = 0.1
"""Audio per audio-chunk event at most: small enough that the first sound leaves at once."""
DISCARD_S, DISCARD_BYTES = 1.0, 1 << 20
"""After an unreadable event, what of the peer's input is read and dropped at most before the connection closes."""


@dataclass(frozen=True)
class WyomingLimits:
    """What one event may carry; beyond it the connection gets an error and is closed."""

    max_line: int = 64 * 1024
    """Bytes of an event's header line."""
    max_data: int = 1024 * 1024
    """Bytes of an event's data part."""
    max_payload: int = 1024 * 1024
    """Bytes of an event's payload (text to speech takes none)."""
    max_chars: int = 100_000
    """Characters of text one request may gather (a streamed one over all its chunks)."""


class EventError(Exception):
    """The peer sent something that is not a readable event; `fatal`: the stream cannot be read on after it."""

    def __init__(self, message: str, fatal: bool = True) -> None:
        super().__init__(message)
        self.fatal = fatal


def parse_uri(uri: str) -> tuple[str, int]:
    """tcp://HOST:PORT -> (host, port); InputError (one line) for anything else."""
    parsed = urlparse(uri)
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme != "tcp" or not parsed.hostname or port is None or parsed.path not in ("", "/"):
        raise InputError(f"--wyoming {uri}: expected tcp://HOST:PORT (e.g. tcp://0.0.0.0:10200)")
    return parsed.hostname, port


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (a port in use fails before the model loads)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError as err:
        raise VoiceError(f"--wyoming: cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.setblocking(False)
    return sock


async def read_event(reader: asyncio.StreamReader, limits: WyomingLimits) -> Event | None:
    """The next event, or None at a clean end of the stream (between events). EventError when it is not one."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as err:
        if not err.partial.strip():
            return None
        raise EventError("the connection ended inside an event") from None
    except asyncio.LimitOverrunError:
        raise EventError(f"an event header longer than {limits.max_line} bytes") from None
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        raise EventError("an event header that is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise EventError("an event header without a string \"type\"")
    data = header.get("data") or {}
    data_length, payload_length = header.get("data_length") or 0, header.get("payload_length") or 0
    if not isinstance(data, dict) or not all(isinstance(n, int) and n >= 0 for n in (data_length, payload_length)):
        raise EventError("an event whose data or lengths are malformed")
    if data_length > limits.max_data or payload_length > limits.max_payload:
        raise EventError(f"an event of {data_length} data and {payload_length} payload bytes (at most "
                         f"{limits.max_data} and {limits.max_payload})")
    try:
        if data_length:
            more = json.loads(await reader.readexactly(data_length))
            if not isinstance(more, dict):
                raise EventError("event data that is not a JSON object")
            data = {**data, **more}
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        raise EventError("the connection ended inside an event") from None
    except (ValueError, RecursionError):
        raise EventError("event data that is not JSON") from None
    return Event(type=header["type"], data=data, payload=payload)


def pcm16(samples) -> bytes:
    """float32 samples -> 16-bit little-endian PCM (clipped)."""
    import numpy as np

    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class WyomingApi:
    """Serves the Wyoming protocol on a bound listening socket for `server`'s engine."""

    def __init__(self, server: EngineServer, sock: socket.socket, *, limits: WyomingLimits = WyomingLimits(),
                 log: Callable[[str], None] = print) -> None:
        self.server, self.sock, self.limits, self.log = server, sock, limits, log
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "busy": 0, "rejected": 0}
        """Requests by how they ended (busy: every engine was full), and events refused (malformed, oversized,
        unknown)."""
        self._listener: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()

    @property
    def uri(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"tcp://{f'[{host}]' if ':' in host else host}:{port}"

    async def start(self) -> None:
        self._listener = await asyncio.start_server(self._connection, sock=self.sock, limit=self.limits.max_line)

    async def close(self) -> None:
        """Stop listening and end every connection (a request still speaking is cancelled)."""
        if self._listener is None:
            self.sock.close()
            return
        self._listener.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._listener.wait_closed(), 5)

    def info(self) -> Info:
        """The voices and languages of the engine's model family, credited to the family's model."""
        fam = family(self.server.synth.describe()["family"])
        model = fam.description.split(" (")[0]
        attribution = Attribution(name=f"voiceapp ({model})", url=f"https://huggingface.co/{fam.downloads[0][0]}")
        voices = self.server.synth.voices.all()
        tts_voices = [TtsVoice(name=name, description=voice.description or name, attribution=attribution,
                               installed=True, version=None, languages=list(fam.languages))
                      for name, voice in sorted(voices.items())]
        program = TtsProgram(name="voiceapp", description=f"{model} through voiceapp's warm engine",
                             attribution=attribution, installed=True, version=self.server.hello().get("version"),
                             voices=tts_voices, supports_synthesize_streaming=True)
        return Info(tts=[program])

    # -- a connection ---------------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's handler as a task
        self._connections.add(task)
        conn = _Connection(self, reader, writer)
        try:
            await conn.run()
        except (OSError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        except Exception as err:  # noqa: BLE001 - a bug costs this connection, never the server
            self.log(f"Wyoming: internal error on a connection: {type(err).__name__}: {err}")
        finally:
            self._connections.discard(task)
            await conn.finish()


class _Connection:
    """One client: its events in order; a request's audio is sent while the next events are read."""

    def __init__(self, api: WyomingApi, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.api, self.reader, self.writer = api, reader, writer
        self.peer = "wyoming " + ":".join(str(p) for p in (writer.get_extra_info("peername") or ("?",))[:2])
        self.speaking: asyncio.Task | None = None
        self.stream: _TextStream | None = None
        """The streamed request's text while synthesize-start .. synthesize-stop lasts."""
        self.write_lock = asyncio.Lock()

    async def send(self, event: Event) -> None:
        async with self.write_lock:
            await async_write_event(event, self.writer)

    async def run(self) -> None:
        while True:
            try:
                event = await read_event(self.reader, self.api.limits)
            except EventError as err:
                self.api.counts["rejected"] += 1
                await self.send(Error(text=str(err), code="bad-event").event())
                await self.discard_input()
                return
            if event is None:
                return
            await self.handle(event)

    async def discard_input(self) -> None:
        """After an unreadable event: say no more, and read what the peer still sends for a moment, so that closing
        does not reset the connection before it has read the error."""
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.write_eof()
        deadline = asyncio.get_running_loop().time() + DISCARD_S
        discarded = 0
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            while discarded < DISCARD_BYTES:
                left = deadline - asyncio.get_running_loop().time()
                part = await asyncio.wait_for(self.reader.read(65536), max(left, 0))
                if not part:
                    break
                discarded += len(part)

    async def handle(self, event: Event) -> None:
        try:
            if Describe.is_type(event.type):
                await self.send(self.api.info().event())
            elif Ping.is_type(event.type):
                await self.send(Pong(text=Ping.from_event(event).text).event())
            elif SynthesizeStart.is_type(event.type):
                await self.start_stream(SynthesizeStart.from_event(event))
            elif SynthesizeChunk.is_type(event.type):
                self.add_text(SynthesizeChunk.from_event(event).text)
            elif SynthesizeStop.is_type(event.type):
                await self.stop_stream()
            elif Synthesize.is_type(event.type):
                if self.stream is None:  # inside a stream: the whole text again, for servers that do not stream
                    synthesize = Synthesize.from_event(event)
                    await self.speak(self.request_of(synthesize.voice, synthesize.text), None, streamed=False)
            else:
                raise EventError(f"unknown event type {event.type[:40]!r}", fatal=False)
        except (KeyError, TypeError, AttributeError, ValueError):
            self.api.counts["rejected"] += 1
            await self.send(Error(text=f"malformed {event.type[:40]} event", code="bad-event").event())
        except EventError as err:
            self.api.counts["rejected"] += 1
            await self.send(Error(text=str(err), code="bad-event").event())
        except VoiceError as err:
            self.api.counts["rejected"] += 1
            await self.send(Error(text=str(err), code="bad-request").event())

    def request_of(self, voice, text: str = "") -> SynthesisRequest:
        """A request for `voice` (a SynthesizeVoice or None): a name of ours, or our default."""
        bank = self.api.server.synth.voices
        name = resolve_name(getattr(voice, "name", None) or "", bank.default)
        voices = bank.all()
        if name not in voices:
            raise InputError(f"unknown voice {name!r}; available: {', '.join(sorted(voices))}")
        if not isinstance(text, str) or len(text) > self.api.limits.max_chars:
            raise InputError(f"the text must be a string of at most {self.api.limits.max_chars} characters")
        return SynthesisRequest(text, voice=name, options=SamplingOptions(), request_id=uuid4().hex)

    async def start_stream(self, start: SynthesizeStart) -> None:
        if self.busy():
            raise EventError("synthesize-start while a request is still speaking", fatal=False)
        self.stream = _TextStream(self.api.limits.max_chars)
        await self.speak(self.request_of(start.voice), self.stream, streamed=True)

    def add_text(self, text: str) -> None:
        if self.stream is None:
            raise EventError("synthesize-chunk outside synthesize-start .. synthesize-stop", fatal=False)
        if not isinstance(text, str):
            raise TypeError("text")
        self.stream.put(text)

    async def stop_stream(self) -> None:
        if self.stream is None:
            raise EventError("synthesize-stop without synthesize-start", fatal=False)
        self.stream.end()
        self.stream = None

    def busy(self) -> bool:
        return self.speaking is not None and not self.speaking.done()

    async def speak(self, req: SynthesisRequest, text_stream: "_TextStream | None", streamed: bool) -> None:
        if self.busy():
            raise EventError("a request while another is still speaking", fatal=False)
        self.speaking = asyncio.create_task(self.answer(req, text_stream, streamed))

    async def answer(self, req: SynthesisRequest, text_stream: "_TextStream | None", streamed: bool) -> None:
        """The request's audio as Wyoming events; an engine error as an error event."""
        rate = self.api.server.synth.sample_rate
        step = max(1, int(CHUNK_S * rate))
        started = False
        chunks = self.api.server.stream(req, self.peer, self.api.counts,
                                        text_stream=text_stream.pieces() if text_stream is not None else None)
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if not started:
                        await self.send(AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=1).event())
                        started = True
                    for i in range(0, len(chunk.samples), step):
                        await self.send(AudioChunk(rate=rate, width=SAMPLE_WIDTH, channels=1,
                                                   audio=pcm16(chunk.samples[i:i + step])).event())
        except VoiceError as err:
            await self.send(Error(text=str(err), code="engine").event())
            if streamed:
                await self.send(SynthesizeStopped().event())
            return
        if not started:
            await self.send(AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=1).event())
        await self.send(AudioStop().event())
        if streamed:
            await self.send(SynthesizeStopped().event())

    async def finish(self) -> None:
        """The connection is over: its request is cancelled, its socket closed."""
        if self.stream is not None:
            self.stream.end()
        if self.speaking is not None and not self.speaking.done():
            self.speaking.cancel()
            with contextlib.suppress(BaseException):
                await self.speaking
        self.writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


class _TextStream:
    """A streamed request's text, as the engine's text stream: each chunk as it comes, until synthesize-stop."""

    def __init__(self, max_chars: int) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.chars, self.max_chars = 0, max_chars

    def put(self, text: str) -> None:
        self.chars += len(text)
        if self.chars > self.max_chars:
            raise InputError(f"a streamed request of more than {self.max_chars} characters")
        self.queue.put_nowait(text)

    def end(self) -> None:
        self.queue.put_nowait(None)

    async def pieces(self) -> AsyncIterator[str]:
        while (text := await self.queue.get()) is not None:
            yield text

