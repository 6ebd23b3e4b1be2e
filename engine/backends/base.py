"""Provides the Protocols the pipeline and its front ends depend on: TokenGenerator, CodecDecoder, AudioSink and
MonitoredSink. No device imports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol, Sequence, runtime_checkable

import numpy as np

from engine.config import SamplingOptions
from engine.deadlines import DeadlineBoard
from engine.prompt import Prompt


@runtime_checkable
class TokenGenerator(Protocol):
    """Streams generated token ids for a prompt, as they are sampled."""

    @property
    def concurrent_streams(self) -> bool:
        """Streams step together (one batch), so a second one costs the first little: the pipeline may start a
        request's next sentence beside its current one (Synthesizer's eager_lookahead)."""
        ...

    def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        """Yield lists of new token ids (deltas) until a stop id (included) or opts.max_tokens."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running stream now and free its state; unknown ids are ignored."""
        ...

    async def close(self) -> None:
        ...


@runtime_checkable
class DeadlineScheduled(Protocol):
    """A TokenGenerator that orders its queued work by the streams' deadlines (engine.deadlines): the graph lane's
    admission, vLLM's submission priority. The Synthesizer hands it its board."""

    def follow(self, board: DeadlineBoard) -> None:
        """Order queued work by `board`'s due times from now on."""
        ...


@dataclass(frozen=True, slots=True)
class DecodeItem:
    """One decoder window: codes including context, and which of them to return audio for."""

    codes: tuple[Any, ...]
    """Codec frames, left context + new frames + right context: the family's frame type (Spark: semantic codes
    0..8191; Orpheus: 7-code SNAC frames)."""
    global_tokens: tuple[int, ...]
    """The voice's conditioning of the decoder (Spark: its 32 global codes 0..4095; empty where the decoder has
    none, as SNAC)."""
    keep_start: int = 0
    """Index into `codes` of the first code whose samples are returned."""
    keep_stop: int | None = None
    """Index into `codes` one past the last code whose samples are returned (None = len(codes))."""
    start: int = 0
    """Position of `codes[0]` in its sentence: a decoder whose output depends on the position (SNAC's noise,
    keyed to it so that overlapping windows agree) reads it; others ignore it. Negative where a short last window
    was padded on the left to a standard length (engine.batching widen_left): those codes are filler."""


@runtime_checkable
class CodecDecoder(Protocol):
    """Turns codec frames (+ the voice's conditioning, where the codec has one) into float32 mono audio."""

    device: Any
    """Where it computes ("cpu", "cuda", a torch.device): whether speech may come slower than real time."""

    sample_rate: int
    samples_per_code: int
    """Samples produced per codec frame (320 for BiCodec, 2048 for SNAC 24 kHz); read from the checkpoint config."""
    batch_limit: int
    """Most windows worth handing over in one decode() call (engine.batching.DecodeBatcher's batch size)."""
    fixed_shapes: bool
    """Windows of equal length decode together in one pass (or replay a captured graph): the pipeline widens its
    windows to the schedule's standard lengths (engine.batching.lengths_for) and batches one length per call."""

    def decode(self, items: Sequence[DecodeItem]) -> list[np.ndarray]:
        """Decode windows (batched where the device allows); returns float32 arrays of
        (keep_stop - keep_start) * samples_per_code samples each. Blocking: call it off the event loop."""
        ...

    def warmup(self, lengths: Sequence[int], batches: Sequence[int], background: bool = False) -> float:
        """Prepare for windows of these lengths and batch sizes (capture CUDA graphs where the decoder replays
        them; `background`: while others use the GPU). Returns the seconds it took (0 where there is nothing to
        prepare)."""
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

    def allow_pause(self) -> None:
        """What was written so far may run out before more comes without that being a gap: a whole sentence was
        written (engine.pacing). A player waits for its pre-roll again before it goes on; other sinks ignore it."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class MonitoredSink(AudioSink, Protocol):
    """An AudioSink that reports its playback: where each utterance starts, when it became audible, how full its
    buffer is and how often it ran dry (what the TUI shows). Sinks that cannot tell report nothing buffered, no
    underruns and no onset."""

    @property
    def device_rate(self) -> int:
        """Frames per second of the buffer counted by `fill_frames` (the device's rate, which may differ from
        `sample_rate`)."""
        ...

    def mark_utterance_start(self) -> object:
        """Begin a new utterance at the current write position (its onset then shows in `last_onset_perf`)."""
        ...

    @property
    def last_onset_perf(self) -> float | None:
        """time.perf_counter() at which the current utterance became audible; None until then (or never)."""
        ...

    @property
    def fill_frames(self) -> int:
        """Frames buffered now."""
        ...

    @property
    def capacity_frames(self) -> int:
        """Buffer size in frames (0: no buffer to show)."""
        ...

    @property
    def underruns(self) -> int:
        """Times the buffer ran dry mid-utterance, since the sink opened."""
        ...
