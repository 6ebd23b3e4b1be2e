"""Provides LoudnessMeter: ITU-R BS.1770-4 integrated loudness (LUFS) of a mono signal fed in pieces, for export's
--loudness. The K-weighting filters are pyloudnorm's (the same coefficients, computed here with numpy alone, so the
install needs neither pyloudnorm nor scipy); the filtering keeps its state between pieces and the gating keeps one
energy per 100 ms, so a chapter of hours is measured without holding it (pyloudnorm's own meter wants the whole
signal as float64).
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
FILTER_BLOCK = 4096
"""Samples filtered per FFT convolution: a piece is filtered in blocks of at most this many."""


def shelf_coefficients(gain_db: float, q: float, fc: float, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(b, a) of RBJ's high shelf (the Audio EQ Cookbook), normalised to a[0] = 1: pyloudnorm's "high_shelf"."""
    big_a, w0 = 10 ** (gain_db / 40), 2 * math.pi * fc / rate
    alpha, cos, root = math.sin(w0) / (2 * q), math.cos(w0), math.sqrt(10 ** (gain_db / 40))
    b = [big_a * ((big_a + 1) + (big_a - 1) * cos + 2 * root * alpha),
         -2 * big_a * ((big_a - 1) + (big_a + 1) * cos),
         big_a * ((big_a + 1) + (big_a - 1) * cos - 2 * root * alpha)]
    a = [(big_a + 1) - (big_a - 1) * cos + 2 * root * alpha,
         2 * ((big_a - 1) - (big_a + 1) * cos),
         (big_a + 1) - (big_a - 1) * cos - 2 * root * alpha]
    return np.array(b) / a[0], np.array(a) / a[0]


def high_pass_coefficients(q: float, fc: float, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(b, a) of RBJ's high pass, normalised to a[0] = 1: pyloudnorm's "high_pass"."""
    w0 = 2 * math.pi * fc / rate
    alpha, cos = math.sin(w0) / (2 * q), math.cos(w0)
    b = [(1 + cos) / 2, -(1 + cos), (1 + cos) / 2]
    a = [1 + alpha, -2 * cos, 1 - alpha]
    return np.array(b) / a[0], np.array(a) / a[0]


class Biquad:
    """A second-order IIR filter (b, a with a[0] = 1) over pieces of a signal, its state kept between them: the
    same outputs as scipy's lfilter over the whole signal, to rounding. The recursion is a convolution with the
    filter's impulse response, exact over a block of FILTER_BLOCK samples (it is computed that long), done by FFT;
    the state a block starts from enters as the input it adds to the block's first two samples."""

    def __init__(self, b: np.ndarray, a: np.ndarray) -> None:
        self.b, self.a = np.asarray(b, np.float64), np.asarray(a, np.float64)
        h = np.zeros(FILTER_BLOCK)
        for n in range(FILTER_BLOCK):  # 1 / A(z)'s impulse response, by its own recursion
            h[n] = (1.0 if n == 0 else 0.0) - self.a[1] * (h[n - 1] if n >= 1 else 0.0) \
                - self.a[2] * (h[n - 2] if n >= 2 else 0.0)
        self._impulse = h
        self._spectra: dict[int, np.ndarray] = {}
        """The impulse response's spectrum, by FFT size."""
        self._x = np.zeros(2)
        """The last two inputs (oldest first)."""
        self._y = np.zeros(2)
        """The last two outputs (oldest first)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The next piece, filtered."""
        x = np.asarray(x, np.float64)
        return np.concatenate([self._block(x[at:at + FILTER_BLOCK]) for at in range(0, len(x), FILTER_BLOCK)]) \
            if len(x) else x

    def _block(self, x: np.ndarray) -> np.ndarray:
        n = len(x)
        w = np.convolve(np.concatenate([self._x, x]), self.b, "valid")  # b's side: b0 x[k] + b1 x[k-1] + b2 x[k-2]
        y1, y2 = self._y[1], self._y[0]
        w[0] -= self.a[1] * y1 + self.a[2] * y2  # the outputs before the block, carried in
        if n > 1:
            w[1] -= self.a[2] * y1
        size = 1 << (2 * n - 1).bit_length()  # >= 2n: the first n samples of the circular convolution do not wrap
        y = np.fft.irfft(np.fft.rfft(w, size) * self._spectrum(size), size)[:n]
        self._x = np.concatenate([self._x, x])[-2:]
        self._y = np.concatenate([self._y, y])[-2:]
        return y

    def _spectrum(self, size: int) -> np.ndarray:
        """rfft of the impulse response's first size / 2 samples (at least a block's length, and with the block
        shorter than size - size / 2 + 1)."""
        if size not in self._spectra:
            self._spectra[size] = np.fft.rfft(self._impulse[:size // 2], size)
        return self._spectra[size]


class LoudnessMeter:
    """Feed 16-bit or float pieces in order with `add`; `lufs()` is the integrated loudness so far (-inf for
    silence or less than one block)."""

    def __init__(self, sample_rate: int) -> None:
        # BS.1770's K-weighting: a high shelf (+4 dB above ~1.5 kHz), then a high pass (~38 Hz); pyloudnorm's
        # coefficients, computed for this rate
        self._stages = [Biquad(*shelf_coefficients(4.0, 1 / math.sqrt(2), 1500.0, sample_rate)),
                        Biquad(*high_pass_coefficients(0.5, 38.0, sample_rate))]
        self.rate = sample_rate
        self.step = round(sample_rate * BLOCK_S / STEPS)
        self._energies: list[float] = []
        """Sum of squared K-weighted samples of each complete 100 ms step."""
        self._partial, self._partial_n = 0.0, 0

    def add(self, samples: np.ndarray, scale: float = 1.0) -> None:
        """The next piece: samples in [-1, 1] after multiplying by `scale` (1 / 32767 for 16-bit PCM)."""
        x = np.asarray(samples, dtype=np.float64) * scale
        for stage in self._stages:
            x = stage(x)
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
