"""Provides synthetic Orpheus checkpoints: random weights in the released layout, for tests and benchmarks.

`write_checkpoint(out_dir, size, seed)` writes the Orpheus LLM folder (`config.json` for LlamaForCausalLM,
bf16 safetensors with tied embeddings, sharded with an index for `full`, a Llama-3-style fast tokenizer and its
configs, `generation_config.json`) and `snac/` (SNAC's `config.json` + a `pytorch_model.bin` state dict holding
the encoder too, weight-normed convs as `parametrizations.weight.original0/1`, as current SNAC saves them).

`full` has Llama-3.2-3B's shapes and snac_24khz's; `tiny` keeps every id (the vocabulary stays 156 940 rows) and
SNAC's rates (so a frame is still 2048 samples) with small layers. The tokenizer's base vocabulary is the Spark
synthetic one's stand-in BPE (engine.synthetic.llm), cut to Llama's 128 000 entries; ids 128000..128255 are
Llama 3's specials and `<custom_token_N>` follows at 128256 + N, N up to 7 * 4096 + 10 as Orpheus added them.
Same seed, same bytes. Imports torch: not a pure module.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch

from engine.errors import OutputError
from engine.families.orpheus import grammar as g
from engine.families.orpheus.checkpoint import SNAC_CONFIG, SNAC_DIR, SNAC_WEIGHTS, read_snac_config
from engine.synthetic.llm import _numel, _tensor_seed, base_vocab, write_streamed_safetensors

SIZES = ("tiny", "full")

LLAMA: dict[str, dict[str, int]] = {
    "full": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                 head_dim=128, intermediate_size=8192),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128),
}
"""Llama shapes per size; `full` is Llama-3.2-3B's (Orpheus 3B's)."""

SNAC: dict[str, dict[str, Any]] = {
    "full": dict(encoder_dim=48, decoder_dim=1024),
    "tiny": dict(encoder_dim=2, decoder_dim=64),
}
"""SNAC widths per size; everything else is snac_24khz's config (SNAC_BASE)."""

SNAC_BASE: dict[str, Any] = {
    "sampling_rate": 24000, "encoder_rates": [2, 4, 8, 8], "decoder_rates": [8, 8, 4, 2], "attn_window_size": None,
    "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True,
}

LLAMA_SPECIALS = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
                  6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>",
                  10: "<|python_tag|>"}
"""Llama 3's named specials by offset from 128000; the other offsets up to 255 are reserved tokens."""

CUSTOM_COUNT = 7 * 4096 + 11
"""`<custom_token_0>` .. `<custom_token_28682>`: what Orpheus' pretraining added (the embedding has one spare
row beyond them)."""

PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Llama 3's pre-tokenizer split pattern (digits in groups of up to three)."""

INIT_STD = 0.02
"""Std of the random LLM matrices (Llama's initializer_range); norm weights are 1."""

OUTPUT_GAIN = 0.25
"""Scale on the SNAC's last conv gain: default-init weights put the audio near tanh's knee (RMS ~0.5); this
brings it to a speech-like level where seam errors are not squashed by the tanh."""
NOISE_GAIN = 0.1
"""Scale on the noise blocks' gains: at default init the noise term outweighs the codes' own signal; scaled, the
codes dominate as in a trained model, and the noise stays large enough to see in tests."""

CHUNK_ELEMENTS = 16 * 1024**2
"""Most LLM weight elements drawn at once while writing (64 MiB of fp32)."""

SHARD_BYTES = 5 * 1024**3
"""Largest shard of a `full` LLM (the hub's usual 5 GB cut)."""


def write_checkpoint(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a synthetic Orpheus folder to `out_dir` (must be absent or empty) and return it. Built in a hidden
    sibling and renamed into place, so an interrupted run never leaves a folder that looks complete."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"{out} exists and is not an empty directory")
    tmp = out.with_name(f".{out.name}.synth-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write_llm(tmp, size, seed)
        write_snac(tmp / SNAC_DIR, size, seed)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as err:
        raise OutputError(f"cannot write checkpoint to {out}: {err.strerror or err}") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------------------ LLM

def llm_config(size: str) -> dict[str, Any]:
    """`config.json` of the synthetic LLM: Llama-3.2's settings with Orpheus' vocabulary."""
    return {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": g.BEGIN_OF_TEXT, "eos_token_id": g.END_OF_TEXT, "hidden_act": "silu",
        "initializer_range": INIT_STD, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": g.VOCAB_SIZE, **LLAMA[size],
    }


def write_llm(root: Path, size: str, seed: int) -> None:
    """config.json, generation_config.json, weights and tokenizer files into `root`."""
    config = llm_config(size)
    _write_json(root / "config.json", config)
    _write_json(root / "generation_config.json", {
        "bos_token_id": g.BEGIN_OF_TEXT, "eos_token_id": g.END_OF_SPEECH, "do_sample": True,
        "temperature": g.TEMPERATURE, "top_p": g.TOP_P, "repetition_penalty": g.REPETITION_PENALTY})
    write_llm_weights(root, config, seed, SHARD_BYTES if size == "full" else None)
    write_tokenizer(root)


def llm_shapes(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """LlamaForCausalLM tensor names and shapes (tied embeddings: no lm_head), in layer order."""
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (config["vocab_size"], h))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (q, h)),
                   (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
                   (p + "self_attn.o_proj.weight", (h, q)), (p + "post_attention_layernorm.weight", (h,)),
                   (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                   (p + "mlp.down_proj.weight", (h, inter))]
    return shapes + [("model.norm.weight", (h,))]


def write_llm_weights(root: Path, config: dict[str, Any], seed: int, shard_bytes: int | None) -> None:
    """bf16 safetensors, one tensor in memory at a time; split into shards + index past `shard_bytes`."""
    shapes = llm_shapes(config)
    shards = _plan_shards(shapes, shard_bytes)
    if len(shards) == 1:
        write_streamed_safetensors(root / "model.safetensors", shards[0], "BF16", lambda n, sh: _llm_chunks(n, sh, seed))
        return
    weight_map = {}
    total = 0
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        write_streamed_safetensors(root / name, shard, "BF16", lambda n, sh: _llm_chunks(n, sh, seed))
        weight_map.update({n: name for n, _ in shard})
        total += sum(2 * _numel(s) for _, s in shard)
    _write_json(root / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def _plan_shards(shapes: list[tuple[str, tuple[int, ...]]], limit: int | None) -> list[list]:
    shards: list[list] = [[]]
    used = 0
    for name, shape in shapes:
        nbytes = 2 * _numel(shape)
        if limit is not None and shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append((name, shape))
        used += nbytes
    return shards


def _llm_chunks(name: str, shape: tuple[int, ...], seed: int) -> Iterator[torch.Tensor]:
    """The tensor's bf16 values in row blocks of at most CHUNK_ELEMENTS, drawn from its own seeded generator (the
    full model's 156 940 x 3072 embedding never sits in memory whole, nor in fp32)."""
    if name.endswith("norm.weight"):
        yield torch.ones(shape, dtype=torch.bfloat16)
        return
    gen = torch.Generator().manual_seed(_tensor_seed(seed, name))
    row = _numel(shape[1:])
    step = max(1, CHUNK_ELEMENTS // row)
    for at in range(0, shape[0], step):
        rows = min(step, shape[0] - at)
        yield torch.randn((rows, *shape[1:]), generator=gen).mul_(INIT_STD).to(torch.bfloat16)


def added_tokens() -> list[tuple[int, str, bool]]:
    """(id, text, special) of every token past the BPE vocabulary: Llama's 256 specials, then the custom tokens."""
    llama = [(g.BEGIN_OF_TEXT + i, LLAMA_SPECIALS.get(i, ""), True) for i in range(256)]
    reserved = iter(range(256))
    llama = [(i, text or f"<|reserved_special_token_{next(reserved)}|>", s) for i, text, s in llama]
    custom = [(g.CUSTOM_BASE + n, f"<custom_token_{n}>", False) for n in range(CUSTOM_COUNT)]
    return llama + custom


def build_tokenizer():
    """The synthetic Llama-3-style fast tokenizer (a `tokenizers.Tokenizer`): BOS added by its post-processor."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = base_vocab()
    vocab = {t: i for t, i in vocab.items() if i < g.BEGIN_OF_TEXT}  # merges only build low ids
    tk = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                       end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    bos = LLAMA_SPECIALS[0]
    tk.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                      special_tokens=[(bos, g.BEGIN_OF_TEXT)]),
    ])
    tk.decoder = decoders.ByteLevel()  # a decoder takes no options (tokenizers ignored the ones given here)
    specs = added_tokens()
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for _, t, s in specs if s])
    tk.add_tokens([AddedToken(t, normalized=True, special=False) for _, t, s in specs if not s])
    last_id, last_text, _ = specs[-1]
    if tk.token_to_id(last_text) != last_id or tk.token_to_id(LLAMA_SPECIALS[9]) != g.END_OF_TEXT:
        raise RuntimeError("synthetic tokenizer ids drifted from the Orpheus layout")
    return tk


def write_tokenizer(root: Path) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    tk = build_tokenizer()
    (root / "tokenizer.json").write_text(tk.to_str(pretty=False), encoding="utf-8", newline="\n")
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": not s, "rstrip": False, "single_word": False,
                        "special": s} for i, t, s in added_tokens()}
    _write_json(root / "tokenizer_config.json", {
        "added_tokens_decoder": decoder, "bos_token": LLAMA_SPECIALS[0], "clean_up_tokenization_spaces": False,
        "eos_token": LLAMA_SPECIALS[9], "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"})

    def special(text: str) -> dict[str, Any]:
        return {"content": text, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    _write_json(root / "special_tokens_map.json", {"bos_token": special(LLAMA_SPECIALS[0]),
                                                   "eos_token": special(LLAMA_SPECIALS[9])})


# ----------------------------------------------------------------------------------------------------- SNAC

def snac_config(size: str) -> dict[str, Any]:
    """SNAC's `config.json` for `size` (the keys the release's file has)."""
    return {"sampling_rate": SNAC_BASE["sampling_rate"], **SNAC[size],
            **{k: v for k, v in SNAC_BASE.items() if k != "sampling_rate"}}


def write_snac(snac_dir: Path, size: str, seed: int) -> None:
    """`snac/config.json` + `snac/pytorch_model.bin` (a plain state dict of fp32 tensors, encoder included)."""
    snac_dir.mkdir(parents=True, exist_ok=True)
    _write_json(snac_dir / SNAC_CONFIG, snac_config(size))
    cfg = read_snac_config(snac_dir / SNAC_CONFIG)
    state = dict(snac_tensors(cfg, seed))
    torch.save(state, snac_dir / SNAC_WEIGHTS)


def snac_tensors(cfg, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a SNAC state dict in the release's key names, drawn like torch's default init (conv
    weights and biases uniform ±1/√fan_in, codebooks N(0, 1), Snake α 1, weight-norm gain ‖v‖), except that
    gains and α are spread over ×0.5..1.5 so folding the norm and per-channel α are exercised, not identities,
    and the noise and output gains are scaled (NOISE_GAIN, OUTPUT_GAIN)."""
    layout = snac_layout(cfg)
    shapes = {name: (shape, kind) for name, shape, kind in layout}
    for name, shape, kind in layout:
        if kind == "gain":
            v_name = name[: -len("original0")] + "original1"
            v = _snac_draw(v_name, *shapes[v_name], seed)
            norm = v.flatten(1).norm(dim=1).reshape(shape)
            spread = 0.5 + torch.rand(shape, generator=_gen(seed, name))
            yield name, norm * spread * _gain_scale(name, cfg)
        else:
            yield name, _snac_draw(name, shape, kind, seed)


def _gain_scale(name: str, cfg) -> float:
    if ".linear." in name:
        return NOISE_GAIN
    if name.startswith(f"decoder.model.{len(cfg.decoder_rates) + (3 if cfg.depthwise else 2)}."):
        return OUTPUT_GAIN
    return 1.0


def _gen(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(_tensor_seed(seed, name))


def _snac_draw(name: str, shape: tuple[int, ...], kind: Any, seed: int) -> torch.Tensor:
    gen = _gen(seed, name)
    if kind == "codebook":
        return torch.randn(shape, generator=gen)
    if kind == "alpha":
        return 0.5 + torch.rand(shape, generator=gen)
    bound = 1.0 / math.sqrt(kind)  # a conv's v or bias: kind is its fan-in
    return (torch.rand(shape, generator=gen) * 2 - 1) * bound


def snac_layout(cfg) -> list[tuple[str, tuple[int, ...], Any]]:
    """(name, shape, kind) of every SNAC tensor, in state-dict order; kind is "codebook", "alpha", "gain" (a
    weight norm's g) or the fan-in (a conv's v or bias)."""
    out: list[tuple[str, tuple[int, ...], Any]] = []

    def conv(prefix: str, cin: int, cout: int, k: int, groups: int = 1, bias: bool = True,
             transpose: bool = False) -> None:
        v = (cin, cout // groups, k) if transpose else (cout, cin // groups, k)
        fan_in = (cout // groups if transpose else cin // groups) * k
        out.append((f"{prefix}.parametrizations.weight.original0", (v[0], 1, 1), "gain"))
        out.append((f"{prefix}.parametrizations.weight.original1", v, fan_in))
        if bias:
            out.append((f"{prefix}.bias", (cout,), fan_in))

    def alpha(prefix: str, ch: int) -> None:
        out.append((f"{prefix}.alpha", (1, ch, 1), "alpha"))

    def residual(prefix: str, dim: int, groups: int) -> None:
        alpha(f"{prefix}.block.0", dim)
        conv(f"{prefix}.block.1", dim, dim, 7, groups)
        alpha(f"{prefix}.block.2", dim)
        conv(f"{prefix}.block.3", dim, dim, 1)

    d = cfg.encoder_dim
    conv("encoder.block.0", 1, d, 7)
    for i, stride in enumerate(cfg.encoder_rates, 1):
        for j in range(3):
            residual(f"encoder.block.{i}.block.{j}", d, d if cfg.depthwise else 1)
        alpha(f"encoder.block.{i}.block.3", d)
        conv(f"encoder.block.{i}.block.4", d, 2 * d, 2 * stride)
        d *= 2
    conv(f"encoder.block.{len(cfg.encoder_rates) + 1}", d, d, 7, d if cfg.depthwise else 1)
    for i in range(len(cfg.vq_strides)):
        conv(f"quantizer.quantizers.{i}.in_proj", cfg.latent_dim, cfg.codebook_dim, 1)
        conv(f"quantizer.quantizers.{i}.out_proj", cfg.codebook_dim, cfg.latent_dim, 1)
        out.append((f"quantizer.quantizers.{i}.codebook.weight", (cfg.codebook_size, cfg.codebook_dim), "codebook"))
    lat, dim = cfg.latent_dim, cfg.decoder_dim
    if cfg.depthwise:
        conv("decoder.model.0", lat, lat, 7, lat)
        conv("decoder.model.1", lat, dim, 1)
    else:
        conv("decoder.model.0", lat, dim, 7)
    first = 2 if cfg.depthwise else 1
    for i, stride in enumerate(cfg.decoder_rates):
        p = f"decoder.model.{first + i}.block"
        cin, cout = dim >> i, dim >> (i + 1)
        alpha(f"{p}.0", cin)
        conv(f"{p}.1", cin, cout, 2 * stride, transpose=True)
        k = 2
        if cfg.noise:
            conv(f"{p}.2.linear", cout, cout, 1, bias=False)
            k = 3
        for j in range(3):
            residual(f"{p}.{k + j}", cout, cout if cfg.depthwise else 1)
    last = first + len(cfg.decoder_rates)
    alpha(f"decoder.model.{last}", dim >> len(cfg.decoder_rates))
    conv(f"decoder.model.{last + 1}", dim >> len(cfg.decoder_rates), 1, 7)
    return out


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8", newline="\n")
