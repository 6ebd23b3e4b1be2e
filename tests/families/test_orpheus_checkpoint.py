"""Synthetic Orpheus checkpoints: written in the released layout, detected, validated, loaded and run."""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from engine.errors import ModelFormatError, ModelNotFound, OutputError
from engine.families.orpheus import grammar as g
from engine.families.orpheus.checkpoint import read_orpheus
from engine.families.orpheus.snac import SnacDecoder, DecodeItem
from engine.families.orpheus.synthetic import (
    CUSTOM_COUNT, llm_config, llm_shapes, snac_config, snac_layout, write_checkpoint, write_llm_weights,
    _plan_shards,
)


@pytest.fixture(scope="module")
def tokenizer(orpheus_tiny):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(orpheus_tiny / "tokenizer.json"))


def test_the_tiny_checkpoint_reads_as_orpheus(orpheus_tiny):
    info = read_orpheus(orpheus_tiny)
    assert (info.sample_rate, info.llm_dtype, info.llm.vocab_size) == (24000, "BF16", 156940)
    assert (info.llm.hidden_size, info.llm.num_layers, info.llm.num_heads, info.llm.num_kv_heads,
            info.llm.head_dim) == (64, 2, 4, 2, 16)
    assert info.llm.tie_word_embeddings and info.llm.rope_scaling["rope_type"] == "llama3"
    assert info.llm_weights == (orpheus_tiny / "model.safetensors",)
    assert info.snac.samples_per_frame == 2048 and info.snac.vq_strides == (4, 2, 1)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "snac/config.json", "snac/pytorch_model.bin"):
        assert (orpheus_tiny / name).is_file(), name
    decoder = SnacDecoder(info.snac_dir)
    assert decoder.sample_rate == 24000 and decoder.samples_per_code == 2048


def test_the_tokenizer_has_llama_and_orpheus_ids(tokenizer):
    assert tokenizer.token_to_id("<|begin_of_text|>") == 128000 and tokenizer.token_to_id("<|eot_id|>") == 128009
    for n in (1, 2, 3, 4, 5, 10, 10 + 7 * 4096 - 1, CUSTOM_COUNT - 1):
        assert tokenizer.token_to_id(f"<custom_token_{n}>") == 128256 + n
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 128256 + CUSTOM_COUNT <= g.VOCAB_SIZE
    plain = tokenizer.encode("tara: Hello", add_special_tokens=False).ids
    assert plain and max(plain) < 128000
    assert tokenizer.encode("tara: Hello").ids == [128000, *plain]  # the default adds Llama's BOS


@pytest.mark.parametrize("voice", g.VOICES)
def test_prompt_ids_are_what_the_reference_feeds_its_model(tokenizer, voice):
    text = "Well <laugh> that's 42, isn't it?"
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    ours = g.build_prompt(text, voice, encode)
    # the reference: encode with defaults, wrap in the turn ids, decode to a string, which vLLM encodes again
    wrapped = [g.START_OF_HUMAN, *tokenizer.encode(f"{voice}: {text}").ids, 128009, 128260, 128261, 128257]
    fed = tokenizer.encode(tokenizer.decode(wrapped, skip_special_tokens=False)).ids
    assert list(ours.ids) == fed
    assert ours.ids[:3] == (128000, 128259, 128000) and ours.ids[-4:] == (128009, 128260, 128261, 128257)


def test_special_token_text_in_the_input_never_becomes_an_id(tokenizer):
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    assert 128261 in encode("<custom_token_5>")  # what the tokenizer alone would do
    prompt = g.build_prompt("a <custom_token_5> b <|eot_id|> c", "tara", encode)
    assert max(prompt.ids[3:-4]) < 128000


def test_the_synthetic_llm_runs_into_audible_frames(orpheus_tiny, snac_decoder):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(orpheus_tiny / "tokenizer.json"))
    model = transformers.LlamaForCausalLM.from_pretrained(orpheus_tiny, dtype=torch.float32).eval()
    prompt = g.build_prompt("Hello there.", "tara", lambda s: tk.encode(s, add_special_tokens=False).ids)
    allowed = torch.tensor(prompt.allowed_ids)
    gen = torch.Generator().manual_seed(0)
    ids, generated = torch.tensor([prompt.ids]), []
    with torch.inference_mode():
        for _ in range(2 * g.FRAME_TOKENS):  # no KV cache: 14 short steps of a 2-layer model
            logits = model(ids).logits[0, -1, allowed] / g.TEMPERATURE
            token = allowed[torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)]
            generated.append(int(token))
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
    frames, parser = g.parse_all(generated)
    assert len(frames) == 2 and parser.ignored == 0
    audio = snac_decoder.decode([DecodeItem(tuple(frames), ())])[0]
    assert audio.shape == (2 * 2048,) and float(np.sqrt(np.mean(audio ** 2))) > 0.01


# --------------------------------------------------------------------------------------------- full shapes

def test_full_llm_has_llama_3_2_3b_shapes():
    config = llm_config("full")
    assert {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "head_dim", "intermediate_size", "vocab_size", "rope_theta")} == {
        "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 8192, "vocab_size": 156940, "rope_theta": 500000.0}
    assert config["rope_scaling"] == {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    shapes = llm_shapes(config)
    params = sum(math.prod(s) for _, s in shapes)
    assert params == 156940 * 3072 + 28 * (2 * 3072 + 2 * 3072 * 3072 + 2 * 1024 * 3072 + 3 * 3072 * 8192) + 3072
    shards = _plan_shards(shapes, 5 * 1024**3)
    assert len(shards) == 2 and all(sum(2 * math.prod(s) for _, s in sh) <= 5 * 1024**3 for sh in shards)


def test_full_snac_layout_is_exactly_the_packages(tmp_path):
    snac = pytest.importorskip("snac")
    config = snac_config("full")
    assert (config["encoder_dim"], config["decoder_dim"], config["decoder_rates"]) == (48, 1024, [8, 8, 4, 2])
    (tmp_path / "config.json").write_text(json.dumps(config))
    from engine.families.orpheus.checkpoint import read_snac_config

    with torch.device("meta"):
        ref = snac.SNAC(**config)
    expected = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    ours = {name: shape for name, shape, _ in snac_layout(read_snac_config(tmp_path / "config.json"))}
    assert ours == expected


def test_a_sharded_llm_reads_the_same(orpheus_tiny, tmp_path):
    copy = tmp_path / "sharded"
    shutil.copytree(orpheus_tiny, copy)
    (copy / "model.safetensors").unlink()
    # 8 MB shards: the 20 MB embedding alone, then everything else
    write_llm_weights(copy, llm_config("tiny"), seed=0, shard_bytes=8 * 1024**2)
    info = read_orpheus(copy)
    assert len(info.llm_weights) == 2 and (copy / "model.safetensors.index.json").is_file()
    from safetensors import safe_open

    with safe_open(str(orpheus_tiny / "model.safetensors"), "pt") as one, \
            safe_open(str(info.llm_weights[1]), "pt") as shard:
        name = next(iter(shard.keys()))
        assert torch.equal(one.get_tensor(name), shard.get_tensor(name))


def test_same_seed_same_bytes_and_no_overwrite(orpheus_tiny, tmp_path):
    again = write_checkpoint(tmp_path / "again", "tiny", seed=0)
    for name in ("model.safetensors", "snac/pytorch_model.bin", "tokenizer.json"):
        assert _digest(again / name) == _digest(orpheus_tiny / name), name
    with pytest.raises(OutputError, match="not an empty directory"):
        write_checkpoint(again, "tiny", seed=0)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------- errors

@pytest.fixture
def folder(orpheus_tiny, tmp_path):
    """A copy of the tiny checkpoint's small files (the weights are linked, not copied)."""
    def copy(src: str, dst: str) -> None:
        if src.endswith((".safetensors", ".bin")):
            os.symlink(src, dst)
        else:
            shutil.copy(src, dst)

    out = tmp_path / "m"
    shutil.copytree(orpheus_tiny, out, copy_function=copy)
    return out


def refused(path) -> str:
    with pytest.raises(ModelFormatError) as err:
        read_orpheus(path)
    assert "\n" not in str(err.value)
    return str(err.value)


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_llama_without_snac_is_refused(folder):
    shutil.rmtree(folder / "snac")
    assert "snac: missing" in refused(folder)


def test_snac_beside_a_qwen2_llm_is_a_mix(folder):
    edit_json(folder / "config.json", lambda c: c.update(architectures=["Qwen2ForCausalLM"]))
    assert "a mix" in refused(folder)


def test_snac_added_to_a_spark_folder_is_a_mix(tmp_path):
    (tmp_path / "LLM").mkdir()
    (tmp_path / "LLM" / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (tmp_path / "snac").mkdir()
    message = refused(tmp_path)
    assert "a mix" in message and "LLM/config.json" in message


def test_a_snac_with_attention_or_another_rate_is_refused(folder):
    edit_json(folder / "snac" / "config.json", lambda c: c.update(attn_window_size=32))
    assert "attn_window_size 32" in refused(folder)
    edit_json(folder / "snac" / "config.json", lambda c: c.update(attn_window_size=None, sampling_rate=32000))
    assert "expected sampling_rate" in refused(folder)


def test_a_tokenizer_without_the_audio_tokens_is_refused(folder):
    def drop(data):
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<custom_token_300>"]

    edit_json(folder / "tokenizer.json", drop)
    assert "<custom_token_300> at id 128556" in refused(folder)


def test_a_vocabulary_without_room_for_audio_is_refused(folder):
    edit_json(folder / "config.json", lambda c: c.update(vocab_size=128256))
    assert "no room for the audio ids" in refused(folder)


def test_missing_weights_and_folders(folder, tmp_path):
    (folder / "snac" / "pytorch_model.bin").unlink()
    assert "pytorch_model.bin: missing" in refused(folder)
    (folder / "model.safetensors").unlink()
    assert "model.safetensors: missing" in refused(folder)
    with pytest.raises(ModelNotFound):
        read_orpheus(tmp_path / "nowhere")


def test_weights_are_drawn_in_bounded_blocks(tmp_path, monkeypatch):
    from safetensors import safe_open

    from engine.families.orpheus import synthetic

    monkeypatch.setattr(synthetic, "CHUNK_ELEMENTS", 1000)  # the tiny embedding then takes 157 blocks
    config = llm_config("tiny")
    write_llm_weights(tmp_path, config, seed=0, shard_bytes=None)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
        assert embed.dtype == torch.bfloat16 and tuple(embed.shape) == (156940, 64)
        assert abs(float(embed.float().std()) - 0.02) < 1e-3 and torch.equal(
            f.get_tensor("model.norm.weight"), torch.ones(64, dtype=torch.bfloat16))
        assert set(f.keys()) == {name for name, _ in llm_shapes(config)}
