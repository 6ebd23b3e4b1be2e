"""Provides the seam-error metric for windowed decoding: how far stitched windows are from a one-shot decode."""
from __future__ import annotations

import math

import numpy as np


def seam_error_db(windowed: np.ndarray, full: np.ndarray) -> float:
    """20·log10(max|windowed - full| / rms(full)); -inf when identical, +inf when `full` is silent but differs.

    Both arrays must have the same shape. Computed in float64.
    """
    w = np.asarray(windowed, dtype=np.float64)
    f = np.asarray(full, dtype=np.float64)
    if w.shape != f.shape:
        raise ValueError(f"shape mismatch: windowed {w.shape} vs full {f.shape}")
    if w.size == 0:
        return -math.inf
    peak = float(np.max(np.abs(w - f)))
    if peak == 0.0:
        return -math.inf
    rms = float(np.sqrt(np.mean(f * f)))
    if rms == 0.0:
        return math.inf
    return 20.0 * math.log10(peak / rms)
