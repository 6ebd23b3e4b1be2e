"""Provides the rules of the OpenAI-compatible speech API as pure functions: what a request asks for, which voice a
name means, who may ask, the error bodies. `voiceapp.http.api` serves them; nothing here does I/O.

A request (`POST /v1/audio/speech`, a JSON object):
  input            the text (required; at most `HttpLimits.max_chars` characters)
  voice            one of our voices (`voicectl voices`), or an OpenAI voice name (OPENAI_VOICES maps it to a preset)
  response_format  wav | pcm | flac | mp3 | opus | aac, those the installed FFmpeg can write (voiceapp.http.formats)
  speed            0.25 to 4.0: the tempo, pitch kept (FFmpeg's atempo)
  model            any string: one engine serves every model name (GET /v1/models lists those clients send)
  instructions     kept in SpeechParams; a model without an instruction knob ignores it (the response says so);
                   "None" and "" mean none (Home Assistant sends the string "None" when unset)
  stream_format    "audio" (the bytes of response_format) or "sse" (OpenAI's speech.audio.delta events)
  stream           false: the body is encoded whole and sent with its length (sizes in its header); true or absent:
                   streamed as it is synthesized (FLAC when absent: whole, see voiceapp.http.formats)
  lang_code        taken and unused (Kokoro-style clients send it; the model reads the text's own language)
  seed, sample_rate   ours (OpenAI has neither): the sampling seed, as `voicectl say --seed`; the output rate
Any other field is ignored; those and lang_code are named in the result (`SpeechParams.unused`), for the server
to log once per name and to list in its response.
Errors are OpenAI's shape: {"error": {"message", "type", "param", "code"}} with a 4xx status.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from engine.errors import InputError
from engine.text import is_speakable, normalize
from engine.engine_api import Voices
from engine.voices import preset_slots, resolve_name
from voiceapp.http.formats import SPEED_RANGE

OPENAI_VOICES = {"alloy": "FEMALE1", "ash": "MALE1", "ballad": "MALE2", "cedar": "MALE1", "coral": "FEMALE3",
                 "echo": "MALE1", "fable": "MALE3", "marin": "FEMALE1", "nova": "FEMALE3", "onyx": "MALE2",
                 "sage": "FEMALE2", "shimmer": "FEMALE2", "verse": "MALE3"}
"""OpenAI's voice names -> the kind of voice each is (engine.voices.VOICE_SLOTS, by gender and register), which the
model family's presets fill (`openai_aliases`). A voice of ours by the same name wins."""
MODEL_IDS = ("voiceapp", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
"""What GET /v1/models lists: clients pick a model from it; every name gets the same engine."""
SAMPLE_RATES = (8000, 12000, 16000, 24000, 48000)
"""Output rates one may ask for: those every format (Opus's five included) can carry."""
OPENAI_PCM_RATE = 24000
"""OpenAI's `pcm` is 24 kHz (it has no header to say otherwise), so ours is too unless `sample_rate` says."""
API_KEY_ENV = "VOICEAPP_API_KEY"
"""Where `voicectl serve --http` takes the API key from when --api-key is not given."""
FIELDS = {"input", "voice", "response_format", "speed", "model", "instructions", "stream_format", "seed",
          "sample_rate", "stream", "lang_code"}
"""The fields a request may carry; others are ignored (and logged)."""
UNUSED_FIELDS = {"lang_code"}
"""Fields taken (and type-checked) but not acted on: the model reads the text's own language."""
SPEECH_CHARS_PER_S = 14.0
"""The speaking pace (characters of text a second of audio) that `retry_after_s` assumes for a response's text."""
RETRY_AFTER_MAX_S = 60
"""The longest Retry-After a 429 gives: past that the estimate says little, and a client may as well try again."""
STREAM_FORMATS = ("audio", "sse")
UNSET_INSTRUCTIONS = ("", "none", "null")
"""`instructions` values that mean none (after stripping, in any case)."""


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may ask of the HTTP API."""

    max_chars: int = 4096
    """Characters of `input` per request (OpenAI's own limit, so clients that split text for it fit here)."""
    max_streams: int = 64
    """Speech requests served at once; more get 429."""
    max_connections: int = 256
    """HTTP connections held at once, idle ones included (fewer where the descriptor limit is low: see
    voiceapp.http.api.connection_cap); past that a new one gets a 503 and is closed."""

    timeout_s: float = 10.0
    """Seconds a client may take to send a request's head, or its body, or may leave a response unread while the
    server waits to write; past that its connection is closed (a body: 408)."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise InputError(f"the HTTP timeout must be more than 0 seconds (not {self.timeout_s:g})")
        if min(self.max_chars, self.max_streams, self.max_connections) < 1:
            raise InputError(f"HTTP limits must be at least 1 (max chars {self.max_chars}, max streams "
                             f"{self.max_streams}, max connections {self.max_connections})")

    @property
    def max_body_bytes(self) -> int:
        """Bytes of a request body: the longest input written as JSON escapes (12 bytes a character: one outside
        the BMP is a surrogate pair, two 6-byte escapes), and room for the other fields."""
        return 12 * self.max_chars + 4096


class ApiError(Exception):
    """A request the API refuses: HTTP `status` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, code: str, type: str = "invalid_request_error",
                 param: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.type, self.param = status, code, type, param
        self.headers = dict(headers or {})
        """Headers the error response carries (Retry-After on a 429)."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def expected_audio_s(text: str, speed: float = 1.0) -> float:
    """Seconds of audio `text` should make at `speed`, at SPEECH_CHARS_PER_S."""
    return len(text) / SPEECH_CHARS_PER_S / speed


def retry_after_s(streams: Iterable[tuple[float, float, float]]) -> int:
    """A 429's Retry-After: whole seconds until the live response nearest its end should end, at least 1 and at
    most RETRY_AFTER_MAX_S. Each stream is (seconds since it started, seconds of audio sent, seconds of audio its
    text should make: `expected_audio_s`); the audio still to come is made at the pace the stream has kept so far,
    or at real time before its first audio."""
    soonest = math.inf
    for elapsed, sent, expected in streams:
        pace = sent / elapsed if sent > 0 and elapsed > 0 else 1.0
        soonest = min(soonest, max(0.0, expected - sent) / pace)
    if not math.isfinite(soonest):
        return 1
    return int(min(RETRY_AFTER_MAX_S, max(1, math.ceil(soonest))))


def bad(message: str, code: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code, param=param)


@dataclass(frozen=True, slots=True)
class SpeechParams:
    """What a speech request asks the engine for, checked."""

    text: str
    voice: str
    """One of the engine's voice names."""
    response_format: str
    sample_rate: int
    seed: int | None = None
    speed: float = 1.0
    """The tempo, within SPEED_RANGE (1: as the voice speaks)."""
    instructions: str | None = None
    """How to speak, for a model family that takes it; None when unset ("None" and "" included)."""
    stream_format: str = "audio"
    """"audio": the bytes of response_format; "sse": server-sent events carrying them in base64."""
    sized: bool = False
    """Encode the whole body before sending it: lengths in the container's header, and a Content-Length."""
    unused: tuple[str, ...] = ()
    """Fields of the request that nothing acts on: those this API does not know, and UNUSED_FIELDS."""


def parse_speech(body: bytes, voices: Voices, formats: Iterable[str], native_rate: int,
                 limits: HttpLimits = HttpLimits()) -> SpeechParams:
    """The request a body asks for, given the engine's voices, the response formats this machine can write and the
    engine's sample rate. Raises ApiError (400) naming the first field at fault."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("the request body is not valid JSON", "invalid_json") from None
    if not isinstance(request, dict):
        raise bad("the request body must be a JSON object", "invalid_json")
    formats = tuple(formats)
    fmt = _string(request, "response_format", "mp3" if "mp3" in formats else "wav")
    if fmt not in formats:
        raise bad(f"response_format {fmt!r} is not supported here; use one of {', '.join(formats)}",
                  "unsupported_value", "response_format")
    _string(request, "model", "")
    _string(request, "lang_code", "")
    stream_format = _string(request, "stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise bad(f"stream_format must be \"audio\" or \"sse\", not {stream_format[:32]!r}", "unsupported_value",
                  "stream_format")
    stream = request.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream must be true or false", "invalid_type", "stream")
    return SpeechParams(text=_input(request, limits), voice=resolve_voice(_string(request, "voice", "default"), voices),
                        response_format=fmt, sample_rate=_sample_rate(request, fmt, native_rate),
                        seed=_seed(request), speed=_speed(request), instructions=_instructions(request),
                        stream_format=stream_format,
                        sized=stream_format == "audio" and (stream is False or (stream is None and fmt == "flac")),
                        unused=tuple(sorted((set(request) - FIELDS) | (set(request) & UNUSED_FIELDS))))


def _string(request: dict[str, Any], name: str, default: str) -> str:
    value = request.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad(f"{name} must be a string", "invalid_type", name)
    return value


def _input(request: dict[str, Any], limits: HttpLimits) -> str:
    if "input" not in request:
        raise bad("input is required: the text to speak", "missing_required_parameter", "input")
    text = _string(request, "input", "")
    if not text.strip():
        raise bad("input is empty: nothing to say", "empty_input", "input")
    if len(text) > limits.max_chars:
        raise bad(f"input is {len(text)} characters; at most {limits.max_chars} per request (split the text, or "
                  f"start the server with a higher --http-max-chars)", "string_above_max_length", "input")
    if not is_speakable(normalize(text)):
        raise bad("input has no speakable words (only punctuation, symbols or emoji)", "empty_input", "input")
    return text


def _speed(request: dict[str, Any]) -> float:
    speed = request.get("speed")
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise bad("speed must be a number", "invalid_type", "speed")
    low, high = SPEED_RANGE
    if not low <= speed <= high:
        raise bad(f"speed {speed:g} is out of range: it goes from {low:g} to {high:g} (1 is the voice's own pace)",
                  "unsupported_value", "speed")
    return float(speed)


def _instructions(request: dict[str, Any]) -> str | None:
    text = _string(request, "instructions", "").strip()
    return None if text.lower() in UNSET_INSTRUCTIONS else text


def _sample_rate(request: dict[str, Any], fmt: str, native_rate: int) -> int:
    rate = request.get("sample_rate")
    if rate is None:
        return OPENAI_PCM_RATE if fmt == "pcm" else native_rate
    if isinstance(rate, bool) or rate not in SAMPLE_RATES:
        raise bad(f"sample_rate must be one of {', '.join(map(str, SAMPLE_RATES))}", "unsupported_value",
                  "sample_rate")
    return int(rate)


def _seed(request: dict[str, Any]) -> int | None:
    seed = request.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("seed must be an integer or null", "invalid_type", "seed")
    return seed


def openai_aliases(voices: Voices) -> dict[str, str]:
    """OpenAI's voice names -> the voices of ours they mean with this bank (its family's presets), except where a
    voice of ours has that name."""
    slots, have = preset_slots(voices.presets()), voices.all()
    return {name: slots[slot] for name, slot in OPENAI_VOICES.items() if slot in slots and name not in have}


def resolve_voice(name: str, voices: Voices) -> str:
    """The engine voice `name` means: ours by that name ("" and "default" are the bank's default voice), else the
    preset an OpenAI voice name stands for. ApiError (400) for anything else."""
    have = voices.all()
    wanted = resolve_name(name, voices.default)
    if wanted in have:
        return wanted
    mapped = openai_aliases(voices).get(name.lower())
    if mapped is not None:
        return mapped
    raise bad(f"unknown voice {name[:64]!r}; available: {', '.join(sorted(have) + sorted(OPENAI_VOICES))}",
              "invalid_voice", "voice")


def voices_body(voices: Mapping[str, str], aliases: Mapping[str, str]) -> dict[str, Any]:
    """GET /v1/audio/voices: ours (name -> description), then the OpenAI names with the voice each one means
    (`openai_aliases`). Shaped as Open WebUI reads it ({"voices": [{"id", "name"}]})."""
    ours = [{"id": name, "name": name, "description": voices[name]} for name in sorted(voices)]
    named = [{"id": name, "name": name, "description": f"OpenAI's {name}: our {ours_}", "voice": ours_}
             for name, ours_ in sorted(aliases.items()) if ours_ in voices and name not in voices]
    return {"voices": ours + named}


_PATH = re.compile(r"(?<![\w.])(?:~|[A-Za-z]:)?(?:[/\\][^\s/\\'\"]+)+[/\\]?")


def public_text(text: str) -> str:
    """`text` with every file path cut to its last part (a cloned voice's description names its reference file:
    the listing must not tell callers about the machine's folders)."""
    return _PATH.sub(lambda m: m.group(0).rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1], text)


def models_body(created: int) -> dict[str, Any]:
    """GET /v1/models, in OpenAI's list shape."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "voiceapp"}
                                       for name in MODEL_IDS]}


# ---- who may ask, and where to listen ----------------------------------------------------------------------

def authorized(header: str | None, key: str | None) -> bool:
    """Whether an Authorization header carries the API key (`Bearer KEY`); anything goes when there is no key."""
    if not key:
        return True
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where the HTTP API listens, the key its clients must send, and what they may ask."""

    host: str
    port: int
    api_key: str | None = None
    """None: no key is asked for (loopback only)."""
    limits: HttpLimits = HttpLimits()
    cors: tuple[str, ...] = ()
    """Origins whose web pages may call the API from a browser ("*": any); empty: none (no CORS headers)."""


def http_settings(listen: str, api_key: str | None, limits: HttpLimits = HttpLimits(),
                  cors: Iterable[str] = ()) -> HttpSettings:
    """`--http [HOST:]PORT` with its key and `--cors` origins, checked: an address other machines can reach needs a
    key; an origin is `*` or scheme://host[:port]."""
    host, port = parse_listen(listen)
    if not api_key and not is_loopback(host):
        raise InputError(f"--http {listen}: other machines can reach that address, so requests need a key: set "
                         f"{API_KEY_ENV} (or pass --api-key), or listen on 127.0.0.1")
    origins = tuple(dict.fromkeys(o.strip().rstrip("/") for o in cors))
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and (not sep or scheme not in ("http", "https") or not rest or "/" in rest):
            raise InputError(f"--cors {origin!r}: expected an origin such as http://localhost:3000, or *")
    return HttpSettings(host, port, api_key or None, limits, origins)


def parse_listen(text: str) -> tuple[str, int]:
    """`--http [HOST:]PORT` -> (host, port); the host is 127.0.0.1 when left out, IPv6 goes in brackets."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or not host:
        raise InputError(f"--http {text}: expected [HOST:]PORT (an IPv6 address goes in brackets: [::1]:8000)")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"--http {text}: the port must be a number from 0 to 65535")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host`: localhost or a loopback address (any other name may resolve elsewhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
