"""Broken BiCodec folders fail with a one-line ModelFormatError that names the file (and the tensor)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.backends.bicodec import load_bicodec
from engine.errors import ModelFormatError


@pytest.fixture
def broken(tmp_path, tiny_bicodec_dir) -> Path:
    """A private copy of the tiny BiCodec folder to damage."""
    folder = tmp_path / "BiCodec"
    shutil.copytree(tiny_bicodec_dir, folder)
    return folder


def load_error(folder: Path, **kwargs) -> str:
    with pytest.raises(ModelFormatError) as info:
        load_bicodec(folder, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def rewrite(folder: Path, edit) -> None:
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, str(folder / "model.safetensors"))


def test_loads_cleanly(tiny_bicodec_dir):
    model = load_bicodec(tiny_bicodec_dir)
    assert not hasattr(model.speaker_encoder, "speaker_encoder")  # decode-only by default
    assert hasattr(load_bicodec(tiny_bicodec_dir, with_encoder=True).speaker_encoder, "perceiver_sampler")


def test_missing_weights_file(broken):
    (broken / "model.safetensors").unlink()
    assert str(broken / "model.safetensors") in load_error(broken)


def test_missing_config(broken):
    (broken / "config.yaml").unlink()
    assert str(broken / "config.yaml") in load_error(broken)


def test_config_without_section(broken):
    (broken / "config.yaml").write_text("audio_tokenizer:\n  mel_params: {sample_rate: 16000}\n")
    message = load_error(broken)
    assert "config.yaml" in message and "audio_tokenizer" in message


def test_wrong_shape(broken):
    rewrite(broken, lambda s: s.__setitem__("prenet.linear.weight", torch.zeros(3, 3)))
    message = load_error(broken)
    assert "model.safetensors" in message and "prenet.linear.weight" in message and "[3, 3]" in message
    assert "expected [64, 32]" in message


def test_missing_plain_key(broken):
    rewrite(broken, lambda s: s.pop("speaker_encoder.project.weight"))
    message = load_error(broken)
    assert "model.safetensors" in message and "speaker_encoder.project.weight" in message


def test_missing_weight_norm_half(broken):
    rewrite(broken, lambda s: s.pop("decoder.model.0.weight_g"))
    message = load_error(broken)
    assert "model.safetensors" in message and "decoder.model.0.weight_g" in message and "[64, 1, 1]" in message


def test_encoder_tensors_checked_only_when_asked(broken):
    rewrite(broken, lambda s: s.pop("speaker_encoder.perceiver_sampler.latents"))
    load_bicodec(broken)  # decode-only load never reads it
    assert "speaker_encoder.perceiver_sampler.latents" in load_error(broken, with_encoder=True)


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all, just text\n", b"\xff" * 64])
def test_garbage_weights_file(broken, content):
    (broken / "model.safetensors").write_bytes(content)
    assert str(broken / "model.safetensors") in load_error(broken)


def test_folded_weights_also_load(broken, tiny_bicodec_dir):
    """A checkpoint saved with plain (already folded) conv weights is accepted too."""
    reference = load_bicodec(tiny_bicodec_dir)
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(broken / "model.safetensors"))
    again = load_bicodec(broken)
    codes, glob = torch.randint(0, 8192, (1, 9)), torch.randint(0, 4096, (1, 32))
    with torch.inference_mode():
        assert torch.allclose(reference.decode(codes, glob), again.decode(codes, glob), rtol=0, atol=1e-6)
