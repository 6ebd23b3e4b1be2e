"""Provides the Protocols the pipeline depends on: TokenGenerator, CodecDecoder, AudioSink. No device imports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Sequence, runtime_checkable

import numpy as np

from engine.config import SamplingOptions
from engine.prompt import Prompt


@runtime_checkable
class TokenGenerator(Protocol):
    """Streams generated token ids for a prompt, as they are sampled."""

    def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        """Yield lists of new token ids (deltas) until a stop id (included) or opts.max_tokens."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running stream now and free its state; unknown ids are ignored."""
        ...

    async def close(self) -> None:
        ...


@dataclass(frozen=True, slots=True)
class DecodeItem:
    """One decoder window: codes including context, and which of them to return audio for."""

    codes: tuple[int, ...]
    """Semantic codes 0..8191, left context + new codes + right context."""
    global_tokens: tuple[int, ...]
    """The voice's 32 global codes 0..4095."""
    keep_start: int = 0
    """Index into `codes` of the first code whose samples are returned."""
    keep_stop: int | None = None
    """Index into `codes` one past the last code whose samples are returned (None = len(codes))."""


@runtime_checkable
class CodecDecoder(Protocol):
    """Turns semantic codes (+ speaker globals) into float32 mono audio."""

    sample_rate: int
    samples_per_code: int
    """Samples produced per semantic code (320 for BiCodec); read from the checkpoint config."""

    def decode(self, items: Sequence[DecodeItem]) -> list[np.ndarray]:
        """Decode windows (batched where the device allows); returns float32 arrays of
        (keep_stop - keep_start) * samples_per_code samples each. Blocking: call it off the event loop."""
        ...


@runtime_checkable
class AudioSink(Protocol):
    """Where synthesized audio goes: speakers, a file, memory."""

    sample_rate: int

    async def write(self, samples: np.ndarray) -> None:
        """Queue float32 mono samples; awaits while the sink is full (backpressure)."""
        ...

    async def drain(self) -> None:
        """Return once everything written has been played or written out."""
        ...

    def clear(self) -> None:
        """Drop everything queued (stop / barge-in)."""
        ...

    def close(self) -> None:
        ...
