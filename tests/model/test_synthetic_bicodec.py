"""Synthetic BiCodec checkpoints are deterministic and follow the requested size."""
from __future__ import annotations

import pytest
import yaml

from engine.synthetic.bicodec import bicodec_size_config, write_bicodec


def files(root):
    folder = root / "BiCodec"
    return {name: (folder / name).read_bytes() for name in ("config.yaml", "model.safetensors")}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_bicodec_dir):
    write_bicodec(tmp_path / "a", "tiny", seed=0)
    write_bicodec(tmp_path / "b", "tiny", seed=1)
    a, b = files(tmp_path / "a"), files(tmp_path / "b")
    assert a == files(tiny_bicodec_dir.parent)  # the session fixture also used seed 0
    assert a["config.yaml"] == b["config.yaml"]
    assert a["model.safetensors"] != b["model.safetensors"]
    assert not list((tmp_path / "a" / "BiCodec").glob("*.tmp"))


def test_sizes_keep_the_code_meaning():
    full, tiny = bicodec_size_config("full"), bicodec_size_config("tiny")
    for cfg in (full, tiny):
        assert cfg["decoder"]["rates"] == [8, 5, 4, 2]
        assert (cfg["quantizer"]["codebook_size"], cfg["quantizer"]["codebook_dim"]) == (8192, 8)
        assert cfg["speaker_encoder"]["fsq_levels"] == [4] * 6 and cfg["speaker_encoder"]["token_num"] == 32
        assert cfg["mel_params"]["sample_rate"] == 16000
    assert full["decoder"]["channels"] == 1536 and full["prenet"]["vocos_num_layers"] == 12
    with pytest.raises(ValueError):
        bicodec_size_config("huge")


def test_config_is_the_release_layout(tiny_bicodec_dir):
    doc = yaml.safe_load((tiny_bicodec_dir / "config.yaml").read_text())
    assert set(doc) == {"audio_tokenizer"}
    assert set(doc["audio_tokenizer"]) == {"mel_params", "encoder", "decoder", "quantizer", "speaker_encoder",
                                           "prenet", "postnet"}
