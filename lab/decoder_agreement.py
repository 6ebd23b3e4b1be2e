"""Provides the quality bound of a lower-precision BiCodec decoder: its audio against the fp32 decoder's.

Both decode the same random codes and speaker globals, one-shot and in the streaming windows the pipeline decodes
(engine.windowing), and the candidate's error is reported as a signal-to-noise ratio in dB: the reference's energy
over the energy of the difference, worst utterance first. Used by lab/cpu_decoder_probe.py (full-size checkpoint)
and tests/model/test_decoder_precision.py (tiny checkpoint).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.backends.base import DecodeItem

FULL_BOUND_DB = 30.0
"""What a CPU decoder in bf16 must keep on the full-size synthetic checkpoint (docs/cpu.md)."""
TINY_BOUND_DB = 30.0
"""The same on the tiny checkpoint (tests/model/test_decoder_precision.py)."""


@dataclass(frozen=True)
class Agreement:
    """SNRs of the candidate's audio against the reference's, dB (higher is closer)."""

    snr_db_min: float
    """The worst utterance."""
    snr_db_mean: float
    """Energy-weighted over all utterances: total reference energy over total error energy."""
    utterances: int

    def within(self, bound_db: float) -> bool:
        return self.snr_db_min >= bound_db


def snr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """10·log10(Σref² / Σ(candidate - ref)²); inf when they are equal."""
    error = float(np.sum((candidate.astype(np.float64) - reference) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return math.inf if error == 0 else 10 * math.log10(signal / error)


def random_items(count: int, codes: int, codebook: int, global_count: int, global_codebook: int,
                 seed: int = 0) -> list[DecodeItem]:
    """`count` utterances of `codes` random semantic codes, each with random speaker globals."""
    rng = np.random.default_rng(seed)
    return [DecodeItem(tuple(int(c) for c in rng.integers(0, codebook, codes)),
                       tuple(int(g) for g in rng.integers(0, global_codebook, global_count))) for _ in range(count)]


def compare(reference, candidate, items: Sequence[DecodeItem]) -> Agreement:
    """Decode `items` with both decoders (anything with `decode(items) -> list[np.ndarray]`) and compare."""
    refs, cands = reference.decode(list(items)), candidate.decode(list(items))
    snrs = [snr_db(r, c) for r, c in zip(refs, cands)]
    signal = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in refs)
    error = sum(float(np.sum((c.astype(np.float64) - r) ** 2)) for r, c in zip(refs, cands))
    mean = math.inf if error == 0 else 10 * math.log10(signal / error)
    return Agreement(min(snrs), mean, len(items))
