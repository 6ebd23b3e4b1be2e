"""Provides LoudnessMeter: ITU-R BS.1770-4 integrated loudness (LUFS) of a mono signal fed in pieces, for export's
--loudness. The K-weighting filters are pyloudnorm's; the filtering keeps its state between pieces and the gating
keeps one energy per 100 ms, so a chapter of hours is measured without holding it (pyloudnorm's own meter wants
the whole signal as float64). Imports scipy and pyloudnorm when a meter is made.
"""
from __future__ import annotations

import math

import numpy as np

BLOCK_S = 0.4
"""BS.1770's gating block."""
STEPS = 4
"""Blocks overlap by 75%: a block is four 100 ms steps."""
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0


class LoudnessMeter:
    """Feed 16-bit or float pieces in order with `add`; `lufs()` is the integrated loudness so far (-inf for
    silence or less than one block)."""

    def __init__(self, sample_rate: int) -> None:
        from pyloudnorm.iirfilter import IIRfilter
        from scipy.signal import lfilter, lfilter_zi

        # BS.1770's K-weighting: a high shelf (+4 dB above ~1.5 kHz), then a high pass (~38 Hz); pyloudnorm's
        # coefficients, computed for this rate
        stages = [IIRfilter(4.0, 1 / math.sqrt(2), 1500.0, sample_rate, "high_shelf"),
                  IIRfilter(0.0, 0.5, 38.0, sample_rate, "high_pass")]
        self._lfilter = lfilter
        self._stages = [(s.b, s.a, lfilter_zi(s.b, s.a) * 0.0) for s in stages]
        self.rate = sample_rate
        self.step = round(sample_rate * BLOCK_S / STEPS)
        self._energies: list[float] = []
        """Sum of squared K-weighted samples of each complete 100 ms step."""
        self._partial, self._partial_n = 0.0, 0

    def add(self, samples: np.ndarray, scale: float = 1.0) -> None:
        """The next piece: samples in [-1, 1] after multiplying by `scale` (1 / 32767 for 16-bit PCM)."""
        x = np.asarray(samples, dtype=np.float64) * scale
        for i, (b, a, zi) in enumerate(self._stages):
            x, zi = self._lfilter(b, a, x, zi=zi)
            self._stages[i] = (b, a, zi)
        squares = x * x
        at = 0
        if self._partial_n:
            take = min(self.step - self._partial_n, len(squares))
            self._partial += float(squares[:take].sum())
            self._partial_n += take
            at = take
            if self._partial_n == self.step:
                self._energies.append(self._partial)
                self._partial, self._partial_n = 0.0, 0
        whole = (len(squares) - at) // self.step
        if whole:
            sums = squares[at:at + whole * self.step].reshape(whole, self.step).sum(axis=1)
            self._energies.extend(float(v) for v in sums)
            at += whole * self.step
        if at < len(squares):
            self._partial += float(squares[at:].sum())
            self._partial_n += len(squares) - at

    def lufs(self) -> float:
        """Integrated loudness: the mean energy of the 400 ms blocks above -70 LUFS and above 10 LU under the mean
        of those, as LUFS."""
        e = np.asarray(self._energies)
        if len(e) < STEPS:
            return -math.inf
        blocks = np.convolve(e, np.ones(STEPS), "valid") / (self.step * STEPS)
        with np.errstate(divide="ignore"):
            loud = -0.691 + 10 * np.log10(blocks)
        kept = blocks[loud >= ABSOLUTE_GATE_LUFS]
        if not len(kept):
            return -math.inf
        gate = -0.691 + 10 * math.log10(kept.mean()) + RELATIVE_GATE_LU
        kept = blocks[(loud >= ABSOLUTE_GATE_LUFS) & (loud >= gate)]
        return -0.691 + 10 * math.log10(kept.mean())
