"""Provides seam crossfading between overlapping decode windows and the fades at sentence edges. Pure numpy."""
from __future__ import annotations

import numpy as np


def fade_ramp(n: int) -> np.ndarray:
    """Raised-cosine ramp 0 -> 1 over n samples (exclusive of both ends), float32. fade_in + fade_out == 1."""
    if n <= 0:
        return np.zeros(0, np.float32)
    t = (np.arange(n, dtype=np.float64) + 0.5) / n
    return (0.5 - 0.5 * np.cos(np.pi * t)).astype(np.float32)


class Crossfader:
    """Joins window outputs: blends each window's head over the previous window's held-back tail.

    One instance per sentence. `push(pcm, head, tail)`: the first `head` samples of `pcm` overlap the held tail;
    the last `tail` samples are held back for the next push. Returns the samples that are now final.
    """

    def __init__(self) -> None:
        self._tail = np.zeros(0, np.float32)

    def push(self, pcm: np.ndarray, head: int, tail: int) -> np.ndarray:
        if head != len(self._tail):
            raise ValueError(f"window head {head} does not match held tail {len(self._tail)}")
        if head + tail > len(pcm):
            raise ValueError("window shorter than its head + tail")
        out = pcm[: len(pcm) - tail].astype(np.float32, copy=True)
        if head:
            ramp = fade_ramp(head)
            out[:head] = self._tail * (1.0 - ramp) + out[:head] * ramp
        self._tail = pcm[len(pcm) - tail:].astype(np.float32, copy=True)
        return out

    @property
    def held(self) -> int:
        return len(self._tail)


def fade_edges(pcm: np.ndarray, fade_in: int, fade_out: int) -> np.ndarray:
    """Apply short fades at a sentence's start and end so joins never click (in place on a copy)."""
    out = pcm.astype(np.float32, copy=True)
    n_in, n_out = min(fade_in, len(out)), min(fade_out, len(out))
    if n_in:
        out[:n_in] *= fade_ramp(n_in)
    if n_out:
        out[len(out) - n_out:] *= fade_ramp(n_out)[::-1]
    return out
