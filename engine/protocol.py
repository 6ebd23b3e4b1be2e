"""Provides the engine server's wire format: length-prefixed frames over a stream socket. Pure (stdlib + numpy, which
only audio frames import, so that a client can send its first request before importing it).

A frame is a 5-byte header (kind: 1 byte, payload length: uint32 big-endian) and the payload:
- kind `J`: one UTF-8 JSON object with a "type" key (requests, replies, engine events);
- kind `A`: audio, a 9-byte little-endian prefix (sentence index: uint32, flags: uint8, age: float32, the seconds
  since its audio was made, 0 where it was made as it was sent: AudioChunk.made_at) and float32 LE samples.
No payload may exceed MAX_FRAME_BYTES; a bigger length is refused before anything is read or allocated.

A connection starts with `hello` both ways (the client's carries "v"; a different version is refused; the server's
also names its project "version", which a client compares with its own), then carries requests one at a time:
  client: {"type": "say", "text", "voice", "seed", "options", "stream"}  [text pieces: {"type": "text", "text"},
          then {"type": "end"} when "stream" is true]  {"type": "cancel"} at any time;  or {"type": "status"}
  server: {"type": "started", "request_id"}, event and audio frames in order, then {"type": "done", "cancelled"}
          or {"type": "error", "code", "error", "message"};  {"type": "status", ...}
A request the engine has no room for yet (voiceapp.server AdmissionLine) waits; meanwhile its first frames are Notice
events ("queued, N ahead: ..."), one each time its place changes, which the client shows.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    import numpy as np

    from engine import events as ev

PROTOCOL_VERSION = 2
"""Bumped on any incompatible change; client and server must agree exactly."""
MAX_FRAME_BYTES = 1 << 20
"""Largest payload accepted (1 MiB): bounds what a peer can make us buffer per frame."""
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a message may have (real ones nest two or three deep): deeper is refused
before the JSON parser recurses into it, so a hostile frame never takes the server's thread near the interpreter's
recursion limit."""
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")
MAX_TEXT_PIECE = 65536
"""Characters per text message the client sends (4 bytes each at worst in UTF-8: far below the frame limit)."""

HEADER = struct.Struct(">cI")
AUDIO_PREFIX = struct.Struct("<IBf")
KIND_JSON, KIND_AUDIO = b"J", b"A"
FLAG_SENTENCE_END, FLAG_PAUSE = 1, 2
MAX_AUDIO_SAMPLES = (MAX_FRAME_BYTES - AUDIO_PREFIX.size) // 4

FORWARDED_EVENTS = ("FirstToken", "ChunkDecoded", "SentenceStarted", "SentenceFinished", "RequestFinished",
                    "RequestFailed", "Notice")
"""Engine events (engine.events classes, by name) the server relays to the client (RequestStarted and FirstAudio are
measured client-side). Names, so that a client sends its request before it imports the events."""


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; `code` names the kind of fault for the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class AudioFrame:
    """One piece of a request's audio, in playback order."""

    sentence_index: int
    samples: np.ndarray
    """float32, mono."""
    sentence_end: bool = False
    pause: bool = False
    age_s: float = 0.0
    """Seconds between when its audio was made and when it was sent (a sentence rendered ahead of its turn)."""


# ---- encoding ---------------------------------------------------------------------------------------------

def encode_message(message: dict[str, Any]) -> bytes:
    """A JSON frame. Raises ValueError if it would exceed MAX_FRAME_BYTES (callers keep messages small)."""
    payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return HEADER.pack(KIND_JSON, len(payload)) + payload


def encode_audio(sentence_index: int, samples: np.ndarray, sentence_end: bool = False,
                 pause: bool = False, age_s: float = 0.0) -> list[bytes]:
    """Audio frames for one chunk: split when longer than a frame holds; flags go on the last piece only."""
    import numpy as np

    x = np.ascontiguousarray(samples, dtype="<f4").reshape(-1)
    pieces = [x[i:i + MAX_AUDIO_SAMPLES] for i in range(0, len(x), MAX_AUDIO_SAMPLES)] or [x]
    frames = []
    for n, piece in enumerate(pieces):
        last = n == len(pieces) - 1
        flags = (FLAG_SENTENCE_END if sentence_end and last else 0) | (FLAG_PAUSE if pause else 0)
        payload = AUDIO_PREFIX.pack(sentence_index, flags, age_s) + piece.tobytes()
        frames.append(HEADER.pack(KIND_AUDIO, len(payload)) + payload)
    return frames


def error_message(code: str, message: str, error: str = "VoiceError") -> dict[str, Any]:
    """The error reply: `error` names the engine.errors class the client raises (so exit codes match)."""
    return {"type": "error", "code": code, "error": error, "message": message}


def event_message(event: ev.Event) -> dict[str, Any] | None:
    """A relayed engine event, or None for events that are not relayed."""
    name = type(event).__name__
    if name not in FORWARDED_EVENTS:
        return None
    data = {f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name not in ("request_id", "t")}
    return {"type": "event", "event": name, "data": _finite(data)}


def _finite(data: dict[str, Any]) -> dict[str, Any]:
    """JSON has no inf/nan: send them as null (e.g. the RTF of a request that produced no audio)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}


def parse_event(message: dict[str, Any], request_id: str) -> ev.Event | None:
    """Rebuild a relayed event for the client's own request id; None if unknown or malformed."""
    from engine import events as ev

    name = str(message.get("event"))
    cls = getattr(ev, name) if name in FORWARDED_EVENTS else None
    data = message.get("data")
    if cls is None or not isinstance(data, dict):
        return None
    data = {k: (float("inf") if v is None and k == "rtf" else v) for k, v in data.items()}
    if "request_id" in {f.name for f in dataclasses.fields(cls)}:
        data["request_id"] = request_id
    try:
        return cls(**data)
    except TypeError:
        return None


@functools.lru_cache(maxsize=1)
def project_version() -> str:
    """The version of the code that runs: the pyproject.toml beside it in a source tree (a checkout on PYTHONPATH
    or an editable install), else the installed package's metadata, else "unknown"."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        version = pyproject_version(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        version = None
    if version is not None:
        return version
    import importlib.metadata  # only where the source tree does not answer

    try:
        return importlib.metadata.version("voiceapp")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def pyproject_version(text: str) -> str | None:
    """`version` of the [project] table of a pyproject.toml naming the project voiceapp; None otherwise. Read line
    by line, not with tomllib: every client compares it with its server's before sending a request, and the
    project's own file keeps both keys as plain `key = "value"` lines (a test checks it against tomllib)."""
    table: str | None = None
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            table = line
        elif table == "[project]" and "=" in line:
            key, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                found.setdefault(key.strip(), value[1:-1])
    return found.get("version") if found.get("name") == "voiceapp" else None


# ---- decoding ---------------------------------------------------------------------------------------------

def parse_header(header: bytes) -> tuple[bytes, int]:
    """(kind, length) of a frame header; ProtocolError on an unknown kind or an oversized length."""
    kind, length = HEADER.unpack(header)
    if kind not in (KIND_JSON, KIND_AUDIO):
        raise ProtocolError("bad-frame", f"unknown frame kind {kind!r} (not a voiceapp client?)")
    if length > MAX_FRAME_BYTES:
        raise ProtocolError("too-big", f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return kind, length


def parse_payload(kind: bytes, payload: bytes) -> dict[str, Any] | AudioFrame:
    """The message or audio a payload holds; ProtocolError on anything malformed (nesting too deep included)."""
    if kind == KIND_AUDIO:
        return _parse_audio(payload)
    if _nesting(payload) > MAX_JSON_DEPTH:
        raise ProtocolError("bad-json", "frame payload nests JSON too deeply")
    try:
        message = json.loads(payload.decode())
    except RecursionError:  # MAX_JSON_DEPTH is far below the interpreter's limit; kept for a caller already deep
        raise ProtocolError("bad-json", "frame payload nests JSON too deeply") from None
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("bad-json", "frame payload is not valid UTF-8 JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("bad-json", "a message must be a JSON object with a string \"type\"")
    return message


def _nesting(payload: bytes) -> int:
    """How deep the payload's arrays and objects nest, strings left out; a payload with few brackets (every real
    message) is not scanned."""
    if payload.count(b"[") + payload.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b"", payload)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _parse_audio(payload: bytes) -> AudioFrame:
    if len(payload) < AUDIO_PREFIX.size or (len(payload) - AUDIO_PREFIX.size) % 4:
        raise ProtocolError("bad-frame", f"audio frame of {len(payload)} bytes is not prefix + float32 samples")
    import numpy as np

    index, flags, age_s = AUDIO_PREFIX.unpack_from(payload)
    if not 0 <= age_s < math.inf:
        raise ProtocolError("bad-frame", f"audio frame of age {age_s} s")
    samples = np.frombuffer(payload, dtype="<f4", offset=AUDIO_PREFIX.size).astype(np.float32, copy=False)
    return AudioFrame(index, samples, bool(flags & FLAG_SENTENCE_END), bool(flags & FLAG_PAUSE), age_s)


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | AudioFrame | None:
    """The next frame, or None on a clean end of stream between frames.

    Raises ProtocolError on a malformed frame and asyncio.IncompleteReadError when the stream ends mid-frame.
    """
    import asyncio  # here, so that a client sends its first request before importing it

    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise
    kind, length = parse_header(header)
    return parse_payload(kind, await reader.readexactly(length))
