"""The synthetic LLM half: transformers loads it, ids sit where the release has them, output is deterministic."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.synthetic.llm import (  # noqa: E402
    BASE_VOCAB, llm_config, spark_added_tokens, weight_shapes, write_llm, write_weights,
)
from engine.tokens import STRUCTURAL, TokenIds, tok  # noqa: E402

LLM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "added_tokens.json")

SPEC_TABLE = [  # family, count, first id, last id (format spec §2.2)
    ("bicodec_global", 4096, 151665, 155760), ("bicodec_semantic", 8192, 155761, 163952),
    ("pitch_value", 1001, 163953, 164953), ("pitch_var_value", 11, 164954, 164964),
    ("pitch_label", 5, 164965, 164969), ("pitch_var_label", 5, 164970, 164974), ("speed_value", 11, 164975, 164985),
    ("speed_label", 5, 164986, 164990), ("loudness_value", 31, 164991, 165021), ("loudness_label", 5, 165022, 165026),
    ("age", 5, 165027, 165031), ("gender", 3, 165032, 165034), ("emotion", 101, 165035, 165135),
]


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return write_llm(tmp_path_factory.mktemp("synth"), "tiny", seed=0)


@pytest.fixture(scope="module")
def tokenizer(llm_dir):
    return transformers.AutoTokenizer.from_pretrained(llm_dir)


def test_writes_the_release_file_set(llm_dir):
    assert sorted(p.name for p in llm_dir.iterdir()) == sorted(LLM_FILES)


def test_full_config_is_the_release_config():
    cfg = llm_config("full")
    expected = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896, num_hidden_layers=24,
                    num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=166000,
                    tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768,
                    bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16", hidden_act="silu",
                    max_window_layers=21, sliding_window=32768, use_sliding_window=False)
    assert {k: cfg[k] for k in expected} == expected
    assert len(json.dumps(cfg, indent=2, sort_keys=True).splitlines()) == 27  # the release file has 27 lines
    n_params = sum(torch.Size(shape).numel() for _, shape in weight_shapes(cfg))
    assert 506e6 < n_params < 508e6  # ≈507 M params, ≈2.03 GB in F32


def test_tiny_keeps_vocab_and_ids():
    tiny, full = llm_config("tiny"), llm_config("full")
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings", "architectures"):
        assert tiny[key] == full[key]
    assert tiny["hidden_size"] < full["hidden_size"]


def test_transformers_tokenizer_has_the_release_ids(tokenizer):
    assert len(tokenizer) == 165158
    ids = tokenizer.convert_tokens_to_ids
    assert ids("<|bicodec_global_0|>") == 151665
    assert ids("<|bicodec_semantic_0|>") == 155761
    assert ids("<|im_end|>") == 151645
    assert ids("<|endoftext|>") == 151643 and ids("<|im_start|>") == 151644
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    for family, count, first, last in SPEC_TABLE:
        assert ids(tok(f"{family}_0")) == first and ids(tok(f"{family}_{count - 1}")) == last, family
    assert [ids(tok(name)) for name in STRUCTURAL] == list(range(165136, 165158))


def test_spark_tokens_are_ordinary_added_tokens(llm_dir, tokenizer):
    data = json.loads((llm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t for t in data["added_tokens"]}
    assert len(data["model"]["vocab"]) == BASE_VOCAB
    assert added["<|im_end|>"]["special"] is True
    assert not any(added[t]["special"] for t in spark_added_tokens())
    assert len(spark_added_tokens()) == 13493
    semantic = [151665 + 4096 + i for i in range(3)]
    text = tokenizer.decode([151645, *semantic], skip_special_tokens=True)  # upstream regexes this text
    assert text == "<|bicodec_semantic_0|><|bicodec_semantic_1|><|bicodec_semantic_2|>"
    added_json = json.loads((llm_dir / "added_tokens.json").read_text(encoding="utf-8"))
    assert added_json["<|end_semantic_token|>"] == 165157 and len(added_json) == 165158 - BASE_VOCAB


def test_prompt_tokenizes_to_single_ids(tokenizer):
    ids = TokenIds()
    globals_ = [7, 0, 4095] + list(range(29))
    text = "Hello, world!"
    prompt = (tok("task_tts") + tok("start_content") + text + tok("end_content") + tok("start_global_token")
              + "".join(tok(f"bicodec_global_{g}") for g in globals_) + tok("end_global_token")
              + tok("start_semantic_token"))
    text_ids = tokenizer.encode(text, add_special_tokens=False)
    assert text_ids and all(i < BASE_VOCAB for i in text_ids)
    expected = ([ids.structural["task_tts"], ids.structural["start_content"], *text_ids,
                 ids.structural["end_content"], ids.structural["start_global_token"],
                 *[ids.global_base + g for g in globals_], ids.structural["end_global_token"],
                 ids.structural["start_semantic_token"]])
    assert tokenizer(prompt)["input_ids"] == expected  # no BOS, nothing between added tokens
    assert tokenizer.decode(expected) == prompt


@pytest.mark.parametrize("text", ["Hello, world!", "héllo wörld — ¿qué? 日本語 🎉 \x00\t\n  x", "it's 3.14 AM"])
def test_any_text_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tiny_model_loads_and_runs(llm_dir, tokenizer):
    model = transformers.AutoModelForCausalLM.from_pretrained(llm_dir, dtype=torch.float32)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    ids = tokenizer(tok("task_tts") + tok("start_content") + "Hi" + tok("end_content"), return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], 166000)
    assert torch.isfinite(logits).all()


def test_weights_match_config_and_scale(llm_dir):
    from safetensors import safe_open

    cfg = json.loads((llm_dir / "config.json").read_text(encoding="utf-8"))
    with safe_open(llm_dir / "model.safetensors", framework="pt") as f:
        assert sorted(f.keys()) == [name for name, _ in weight_shapes(cfg)]
        embed = f.get_tensor("model.embed_tokens.weight")
        assert embed.dtype == torch.float32 and tuple(embed.shape) == (166000, 64)
        assert 0.018 < embed.std().item() < 0.022
        assert torch.equal(f.get_tensor("model.norm.weight"), torch.ones(64))
        assert "lm_head.weight" not in f.keys()


def test_same_seed_same_bytes(llm_dir, tmp_path):
    again = write_llm(tmp_path, "tiny", seed=0)
    for name in LLM_FILES:
        assert (again / name).read_bytes() == (llm_dir / name).read_bytes(), name


def test_other_seed_other_weights(llm_dir, tmp_path):
    other = tmp_path / "model.safetensors"
    write_weights(other, llm_config("tiny"), seed=1)
    a, b = (llm_dir / "model.safetensors").read_bytes(), other.read_bytes()
    assert len(a) == len(b)
    header = 8 + int.from_bytes(a[:8], "little")
    assert a[:header] == b[:header] and a[header:] != b[header:]


# ------------------------------------------------------------------------------------- write_checkpoint (top level)

@pytest.fixture
def stub_halves(monkeypatch):
    """Replace the LLM and BiCodec writers with instant stubs: these tests are about the top level only."""
    import engine.synthetic.bicodec as bicodec
    import engine.synthetic.llm as llm

    calls = []

    def fake(name):
        def write(out_dir, size, seed):
            calls.append((name, size, seed))
            (out_dir / name).mkdir()
            (out_dir / name / "stub").write_text(f"{size} {seed}")
        return write

    monkeypatch.setattr(llm, "write_llm", fake("LLM"))
    monkeypatch.setattr(bicodec, "write_bicodec", fake("BiCodec"))
    return calls


def test_checkpoint_top_config_is_the_release_one(stub_halves, tmp_path):
    import yaml

    from engine.synthetic import write_checkpoint

    out = write_checkpoint(tmp_path / "ck", size="tiny", seed=5)
    assert stub_halves == [("LLM", "tiny", 5), ("BiCodec", "tiny", 5)]
    assert yaml.safe_load((out / "config.yaml").read_text()) == {
        "highpass_cutoff_freq": 40, "sample_rate": 16000, "segment_duration": 2.4, "max_val_duration": 12,
        "latent_hop_length": 320, "ref_segment_duration": 6, "volume_normalize": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_checkpoint_refuses_then_overwrites(stub_halves, tmp_path):
    from engine.errors import OutputError
    from engine.synthetic import write_checkpoint

    out = write_checkpoint(tmp_path / "ck", seed=1)
    with pytest.raises(OutputError, match="not empty"):
        write_checkpoint(out, seed=2)
    assert (out / "LLM" / "stub").read_text() == "tiny 1"
    write_checkpoint(out, seed=2, overwrite=True)
    assert (out / "LLM" / "stub").read_text() == "tiny 2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(OutputError, match="does not look like a checkpoint"):
        write_checkpoint(tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_crashed_checkpoint_never_looks_complete(stub_halves, monkeypatch, tmp_path):
    import engine.synthetic.bicodec as bicodec
    from engine.synthetic import write_checkpoint

    def boom(out_dir, size, seed):
        raise KeyboardInterrupt

    monkeypatch.setattr(bicodec, "write_bicodec", boom)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []  # neither the target nor the temp sibling
