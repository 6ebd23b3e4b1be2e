"""Provides typed metric events; the engine emits these and never prints. Front ends decide how to show them."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Union


def _now() -> float:
    return time.perf_counter()


@dataclass(frozen=True, slots=True)
class RequestStarted:
    request_id: str
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class FirstToken:
    request_id: str
    ttft_s: float
    """Seconds from request start to the first generated token."""
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class FirstAudio:
    request_id: str
    ttfa_s: float
    """Seconds from request start to the first audio sample being ready (TTFA)."""
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class ChunkDecoded:
    request_id: str
    sentence_index: int
    codes: int
    """New semantic codes this chunk covers."""
    samples: int
    """Samples emitted for this chunk."""
    decode_s: float
    """Wall time of the decoder call."""
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class SentenceStarted:
    request_id: str
    sentence_index: int
    planned_s: float
    """The most audio the sentence may make (its token cap): what a paced `speak` pre-rolls against."""
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class SentenceFinished:
    request_id: str
    sentence_index: int
    tokens: int
    """Semantic tokens generated for this sentence."""
    hit_limit: bool
    """True when the sentence stopped at max_tokens instead of the stop token."""
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class RequestFinished:
    request_id: str
    audio_s: float
    wall_s: float
    rtf: float
    """wall_s / audio_s: below 1 is faster than real time."""
    tokens: int
    cancelled: bool
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class RequestFailed:
    request_id: str
    error: str
    """One-line user-facing message."""
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know that is not a failure (e.g. a backend fallback)."""

    message: str
    t: float = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class StartupPhase:
    """One step of building the engine finished (the start-up benchmark and `say --json` time each)."""

    name: str
    """What was done: checkpoint, tokenizer, cuda_init, decoder, decoder_graphs, lane, llm, vllm, warm_up, ..."""
    seconds: float
    """Wall time of the step."""
    t: float = field(default_factory=_now)


Event = Union[RequestStarted, FirstToken, FirstAudio, ChunkDecoded, SentenceStarted, SentenceFinished,
              RequestFinished, RequestFailed, Notice, StartupPhase]
EventSink = Callable[[Event], None]


def ignore_events(event: Event) -> None:
    """Default event sink: drop everything."""
