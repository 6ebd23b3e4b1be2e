"""Windowed vs one-shot BiCodec decoding on the tiny synthetic checkpoint (CPU, fp32)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.backends.base import CodecDecoder, DecodeItem
from engine.backends.bicodec import context_windows, measure_context_table
from engine.seams import seam_error_db

EXACT_CONTEXT = 67  # prenet ±57 + wave generator ±10 semantic frames (format spec §3.3)


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(a - ref)) / max(float(np.sqrt(np.mean(ref.astype(np.float64) ** 2))), 1e-8))


def random_codes(seed: int, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, 8192, n).tolist()), tuple(rng.integers(0, 4096, 32).tolist())


def test_is_a_codec_decoder(tiny_decoder):
    assert isinstance(tiny_decoder, CodecDecoder)
    assert (tiny_decoder.sample_rate, tiny_decoder.samples_per_code) == (16000, 320)


@pytest.mark.parametrize("n, new", [(301, 25), (90, 12), (5, 12)])
def test_windowed_with_full_context_equals_one_shot(tiny_decoder, n, new):
    codes, glob = random_codes(n, n)
    full = tiny_decoder.decode([DecodeItem(codes, glob)])[0]
    windows = context_windows(codes, glob, new=new, context=EXACT_CONTEXT)
    assert windows[0].keep_start == 0 and windows[-1].keep_stop == len(windows[-1].codes)  # clamped edges
    pieces = tiny_decoder.decode(windows)
    for item, piece in zip(windows, pieces):
        assert piece.dtype == np.float32 and piece.shape == ((item.keep_stop - item.keep_start) * 320,)
    windowed = np.concatenate(pieces)
    assert windowed.shape == full.shape == (n * 320,)
    assert rel_err(windowed, full) <= 1e-5


def test_batch_equals_item_by_item(tiny_decoder):
    items = []
    for seed, (n, keep) in enumerate([(40, (0, 40)), (40, (5, 17)), (40, (39, 40)), (13, (0, 13)), (40, (0, 0))]):
        codes, glob = random_codes(100 + seed, n)
        items.append(DecodeItem(codes, glob, keep_start=keep[0], keep_stop=keep[1]))
    batched = tiny_decoder.decode(items)
    for item, got in zip(items, batched):
        alone = tiny_decoder.decode([item])[0]
        assert got.shape == alone.shape == ((item.keep_stop - item.keep_start) * 320,)
        if got.size:
            assert rel_err(got, alone) <= 1e-5


def test_seam_error_shrinks_with_context(tiny_decoder):
    codes, glob = random_codes(7, 120)
    table = measure_context_table(tiny_decoder, glob, codes, contexts=(0, 4, 8, 16, 24, EXACT_CONTEXT), new=12)
    assert table[0] > table[4] > table[8] > table[16] > table[24]
    assert table[8] > -40.0  # short context really is audibly wrong on this decoder
    assert table[EXACT_CONTEXT] < -90.0  # float32 round-off only


def test_random_init_audio_is_sane(tiny_decoder):
    codes, glob = random_codes(3, 200)
    audio = tiny_decoder.decode([DecodeItem(codes, glob)])[0]
    assert np.all(np.isfinite(audio))
    assert 0.02 <= float(np.sqrt(np.mean(audio**2))) <= 0.5
    assert float(np.mean(np.abs(audio) > 0.99)) < 0.01


def test_decode_validates_items(tiny_decoder):
    codes, glob = random_codes(5, 10)
    with pytest.raises(ValueError):
        tiny_decoder.decode([DecodeItem(codes, glob[:31])])
    with pytest.raises(ValueError):
        tiny_decoder.decode([DecodeItem(codes[:9] + (8192,), glob)])
    with pytest.raises(ValueError):
        tiny_decoder.decode([DecodeItem(codes, glob, keep_start=4, keep_stop=3)])


def test_seam_error_db():
    full = np.sin(np.linspace(0, 20, 1000))
    assert seam_error_db(full, full) == -math.inf
    off = full.copy()
    off[10] += 0.01 * np.sqrt(np.mean(full**2))
    assert seam_error_db(off, full) == pytest.approx(-40.0, abs=1e-9)
    with pytest.raises(ValueError):
        seam_error_db(full[:-1], full)


def test_a_short_last_window_padded_to_a_standard_length_keeps_its_audio(tiny_decoder):
    """A sentence shorter than the standard length of its last window is padded on the left with filler
    (widen_left), so that the window replays a captured graph; 16 codes of its own context keep the filler's
    effect on the kept audio below a seam's at that context (about -49 dB on this decoder)."""
    from engine.batching import lengths_for, widen_left
    from engine.windowing import WindowSchedule

    lengths = lengths_for(WindowSchedule())
    for seed, n in ((1, 33), (2, 49), (3, 68)):
        codes, globs = random_codes(seed, n)
        last = DecodeItem(codes, globs, 16, n, 0)  # the busy first window kept codes 0-15
        wide = widen_left(last, codes, 0, lengths, pad_after=16)
        assert len(wide.codes) in lengths and wide.start < 0
        padded, = tiny_decoder.decode([wide])
        one = tiny_decoder.decode([DecodeItem(codes, globs)])[0][16 * 320:]
        assert seam_error_db(padded, one) < -45, (n, seam_error_db(padded, one))
