"""Crossfade: exact joins of identical overlaps, complementary ramps, edge fades."""
import numpy as np
import pytest

from engine.crossfade import Crossfader, fade_edges, fade_ramp


def test_ramps_are_complementary_and_monotonic():
    r = fade_ramp(64)
    assert np.all(np.diff(r) > 0) and 0 < r[0] < 0.01 and 0.99 < r[-1] < 1
    np.testing.assert_allclose(r + r[::-1], 1.0, atol=1e-6)


def test_overlapping_windows_of_one_signal_rejoin_exactly():
    rng = np.random.default_rng(0)
    signal = rng.standard_normal(5000).astype(np.float32)
    fader, out = Crossfader(), []
    cuts = [(0, 1200, 0, 100), (1100, 3000, 100, 150), (2850, 5000, 150, 0)]
    for start, stop, head, tail in cuts:
        out.append(fader.push(signal[start:stop], head, tail))
    np.testing.assert_allclose(np.concatenate(out), signal, atol=1e-6)


def test_seam_blends_from_old_to_new():
    fader = Crossfader()
    fader.push(np.ones(200, np.float32), 0, 100)
    out = fader.push(np.zeros(300, np.float32), 100, 0)
    assert out[0] > 0.99 and out[99] < 0.01 and np.all(np.diff(out[:100]) < 0)


def test_head_must_match_held_tail():
    fader = Crossfader()
    fader.push(np.ones(200, np.float32), 0, 50)
    with pytest.raises(ValueError):
        fader.push(np.ones(200, np.float32), 40, 0)


def test_fade_edges_start_and_end_near_zero_without_touching_the_middle():
    pcm = np.ones(1000, np.float32)
    out = fade_edges(pcm, 64, 64)
    assert abs(out[0]) < 0.01 and abs(out[-1]) < 0.01 and np.all(out[64:-64] == 1)
    assert np.all(pcm == 1)
