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

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate
