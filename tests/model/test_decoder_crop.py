"""Cropped decoding (BiCodecModel.decode_kept): the kept span of a window equals the full window's decode, the
margins are what makes it so (smaller ones do not), and the CPU decoder crops every window it is given."""
import numpy as np
import pytest
import torch
from torch import nn

from engine.backends.base import DecodeItem
from engine.backends.bicodec import BiCodecDecoder
from engine.backends.bicodec_modules import reach

SPANS = [(44, 16, 28), (44, 16, 30), (20, 0, 6), (82, 16, 66), (40, 16, 40), (60, 0, 60), (28, 13, 15)]
"""(window codes, kept start, kept stop): streaming windows with left and right context, a first window, a last
one, a whole sentence and a span shorter than any margin."""


@pytest.fixture(scope="module")
def decoder(tiny_bicodec_dir):
    return BiCodecDecoder(tiny_bicodec_dir, device="cpu", num_threads=2)


def windows(decoder, seed=0):
    g = torch.Generator().manual_seed(seed)
    for n, start, stop in SPANS:
        codes = torch.randint(0, decoder.codebook_size, (2, n), generator=g)
        globs = torch.randint(0, decoder.global_codebook, (2, decoder.global_count), generator=g)
        yield codes, globs, start, stop


def worst_error(decoder) -> float:
    """Largest |cropped - full| over all SPANS, relative to the full decode's RMS."""
    model, spc, worst = decoder.model, decoder.samples_per_code, 0.0
    with torch.inference_mode():
        for codes, globs, start, stop in windows(decoder):
            full = model.decode(codes, globs)[:, start * spc: stop * spc]
            kept = model.decode_kept(codes, globs, start, stop)
            assert kept.shape == full.shape
            worst = max(worst, float((kept - full).abs().max() / full.square().mean().sqrt()))
    return worst


def test_the_kept_span_equals_the_full_decode(decoder):
    assert worst_error(decoder) < 1e-5  # float rounding only (fp32)


def test_smaller_margins_change_the_audio(decoder, monkeypatch):
    generator = decoder.model.decoder
    monkeypatch.setattr(generator, "crops", {i: max(0, m - 3) for i, m in generator.crops.items()})
    assert worst_error(decoder) > 1e-3


def test_margins_shrink_towards_the_output(decoder):
    margins = list(decoder.model.decoder.crops.values())
    assert margins == sorted(margins, reverse=True) and margins[-1] >= 1


def test_reach_of_single_layers():
    assert reach(nn.Conv1d(4, 4, 7, dilation=3, padding=9)) == 9
    assert reach(nn.Conv1d(4, 4, 1)) == 0
    assert reach(nn.ConvTranspose1d(4, 4, 16, stride=8, padding=4), frames=6) == 3  # ceil((6 + 16) / 8)
    assert reach(nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.Tanh(), nn.Conv1d(4, 4, 3, padding=1))) == 2
    with pytest.raises(ValueError):
        reach(nn.Conv1d(4, 4, 3, stride=2))


def test_the_cpu_decoder_crops_and_returns_the_same_audio(tiny_bicodec_dir, decoder, monkeypatch):
    assert decoder.crops
    g = tuple(range(decoder.global_count))
    items = [DecodeItem(tuple(range(i, i + 44)), g, 16, 28 + i % 2) for i in range(4)]
    items.append(DecodeItem(tuple(range(20)), g, 0, 20))
    cropped = decoder.decode(items)
    monkeypatch.setattr(decoder, "crops", False)
    whole = decoder.decode(items)
    for a, b in zip(cropped, whole):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5 * float(np.sqrt(np.mean(b ** 2))))
