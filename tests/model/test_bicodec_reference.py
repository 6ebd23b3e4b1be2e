"""Our BiCodec vs the upstream reference (spark_tts_lib) on synthetic checkpoints: strict key parity, decode
equality in fp32, and equal speaker (global) tokens. See conftest.upstream_bicodec_class for how upstream is
imported without torchaudio."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.backends.base import DecodeItem
from engine.backends.bicodec import load_bicodec
from engine.backends.bicodec_modules import mel_spectrogram

REL_TOL = 1e-4


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / max(float(np.sqrt(np.mean(ref.astype(np.float64) ** 2))), 1e-8))


@pytest.fixture(scope="module")
def tiny_reference(tiny_bicodec_dir, load_upstream_bicodec):
    return load_upstream_bicodec(tiny_bicodec_dir)


@pytest.mark.parametrize("length", [1, 7, 50, 133])
def test_decode_matches_upstream(tiny_reference, tiny_decoder, length):
    rng = np.random.default_rng(length)
    semantic = rng.integers(0, 8192, (2, length))
    globals_ = rng.integers(0, 4096, (2, 32))
    with torch.inference_mode():
        ref = tiny_reference.detokenize(torch.from_numpy(semantic), torch.from_numpy(globals_)[:, None]).numpy()
    ours = tiny_decoder.decode([DecodeItem(tuple(s.tolist()), tuple(g.tolist())) for s, g in zip(semantic, globals_)])
    for row in range(2):
        assert ours[row].dtype == np.float32 and ours[row].shape == (length * 320,)
        assert rel_err(ours[row], ref[row, 0]) <= REL_TOL


def test_speaker_tokens_match_upstream(tiny_reference, tiny_decoder):
    rng = np.random.default_rng(1)
    wav = torch.from_numpy(rng.standard_normal((2, 96000)) * 0.1).float()
    mel = mel_spectrogram(wav)
    assert mel.shape == (2, 128, 301)
    with torch.inference_mode():
        ref = tiny_reference.speaker_encoder.tokenize(mel.transpose(1, 2))  # (B, 1, 32)
        ours = tiny_decoder.model.global_tokens(mel)
    assert ours.shape == (2, 32)
    assert torch.equal(ours, ref[:, 0].long())
    assert len(set(ours.flatten().tolist())) > 1  # not a degenerate constant


def test_extract_globals_runs_the_mel_path(tiny_decoder):
    rng = np.random.default_rng(2)
    short = rng.standard_normal(16000 * 2) * 0.05  # 2 s: tiled to 6 s
    tokens = tiny_decoder.extract_globals(short)
    assert len(tokens) == 32 and all(0 <= t < 4096 for t in tokens)
    assert tokens == tiny_decoder.extract_globals(short)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    """Slaney mel -> Hz, written out independently: 200/3 Hz per mel below 1 kHz, log step ln(6.4)/27 above."""
    return np.where(mel < 15.0, mel * 200.0 / 3.0, 1000.0 * np.exp((mel - 15.0) * math.log(6.4) / 27.0))


@pytest.mark.parametrize("f0", [300.0, 1000.0, 3100.0])
def test_mel_spectrogram_places_a_tone(f0):
    sr = 16000
    t = torch.arange(sr, dtype=torch.float64) / sr
    mel = mel_spectrogram(torch.sin(2 * math.pi * f0 * t).float()[None])[0]
    assert mel.shape == (128, 51)  # centred frames: N // hop + 1
    lo_mel = 10.0 * 3.0 / 200.0
    edges = _slaney_hz(np.linspace(lo_mel, 15.0 + math.log(8.0) / (math.log(6.4) / 27.0), 130))
    band = int(mel[:, 25].argmax())
    assert edges[band] < f0 < edges[band + 2]


def test_full_size_checkpoint_strict_keys_and_decode(tmp_path, load_upstream_bicodec):
    from engine.synthetic.bicodec import write_bicodec

    write_bicodec(tmp_path, "full", seed=0)
    folder = tmp_path / "BiCodec"
    reference = load_upstream_bicodec(folder)  # strict=True: every key and shape of upstream BiCodec
    elements = sum(t.numel() for t in reference.state_dict().values())
    assert abs(elements - 156.4e6) < 0.1e6

    ours = load_bicodec(folder)
    rng = np.random.default_rng(0)
    semantic = torch.from_numpy(rng.integers(0, 8192, (1, 20)))
    globals_ = torch.from_numpy(rng.integers(0, 4096, (1, 32)))
    with torch.inference_mode():
        ref = reference.detokenize(semantic, globals_[:, None])[0, 0].numpy()
        got = ours.decode(semantic, globals_)[0].numpy()
    assert rel_err(got, ref) <= REL_TOL
