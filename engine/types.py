"""Provides the audio chunk type every front end consumes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """A piece of synthesized audio, in playback order."""

    request_id: str
    samples: np.ndarray
    """float32, mono, shape (n,), in [-1, 1]."""
    sample_rate: int
    sentence_index: int
    chunk_index: int
    """Index within the request (0-based, consecutive)."""
    sentence_end: bool
    """True on the last chunk of a sentence."""
    pause: bool = False
    """True for the silence inserted between sentences."""
    planned_s: float | None = None
    """The most audio its sentence may make (engine.events.SentenceStarted), where known: for pacing."""
    made_at: float | None = None
    """When its audio was made (time.perf_counter), where that was before its turn: a sentence rendered ahead of
    it. Pacing measures the engine's speed by when audio was made, not by when its turn let it out in a burst.
    None: it was made as it was handed on."""

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate
