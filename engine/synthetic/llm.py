"""Provides the LLM half of a synthetic checkpoint: a random Qwen2 with the Spark-TTS tokenizer layout.

`write_llm(out_dir, size, seed)` writes `out_dir/LLM/` the way the real release stores it (format spec §1, §2):
`config.json` (Qwen2ForCausalLM), `model.safetensors` (F32, tied embeddings, no lm_head tensor) and a fast
tokenizer whose added tokens sit at the real ids. The base vocabulary is a stand-in for Qwen2.5's (which cannot
be fetched here): a byte-level BPE over the 256 GPT-2 byte symbols, a few hundred letter-pair merges and unused
filler entries up to id 151642, so any text encodes; ids 151643.. are Qwen's specials then Spark's 13 493
appended tokens, in the order Spark appended them, as ordinary (non-special) added tokens. Same seed, same bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

from engine.model import FAMILY_SIZES
from engine.tokens import GLOBAL_CODEBOOK, SEMANTIC_CODEBOOK, STRUCTURAL, tok

BASE_VOCAB = 151643
"""Qwen2.5's BPE vocabulary size: ids 0..151642 are BPE entries, 151643 is `<|endoftext|>`."""

QWEN_SPECIALS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
)
"""Qwen2.5's added tokens at ids 151643..151664 as (text, special); the last eight are not special upstream."""

SPARK_FAMILIES = (("bicodec_global", GLOBAL_CODEBOOK), ("bicodec_semantic", SEMANTIC_CODEBOOK), *FAMILY_SIZES.items())
"""Spark's appended token families `<|name_0|>..<|name_{n-1}|>` in append order (spec §2.2); STRUCTURAL follows."""

PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Qwen2's pre-tokenizer split pattern."""

SIZES: dict[str, dict[str, int]] = {
    "full": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, max_window_layers=21),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, max_window_layers=2),
}
"""Qwen2 shapes per synthetic size; `full` is the release's. Both keep vocab_size 166000 and the real ids."""

INIT_STD = 0.02
"""Std of the random linear/embedding weights and biases (Qwen2's initializer_range); norm weights are 1."""


def spark_added_tokens() -> list[str]:
    """Spark's 13 493 appended token texts in append order (first is id 151665)."""
    out = [tok(f"{name}_{i}") for name, count in SPARK_FAMILIES for i in range(count)]
    return out + [tok(name) for name in STRUCTURAL]


def llm_config(size: str) -> dict:
    """The `LLM/config.json` dict for `size` ("tiny" or "full"); `full` is the release's config verbatim."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "initializer_range": INIT_STD,
        "max_position_embeddings": 32768, "model_type": "qwen2", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 166000,
        **SIZES[size],
    }


def write_llm(out_dir: Path, size: str, seed: int) -> Path:
    """Write `out_dir/LLM/` (config, random F32 weights, tokenizer files); returns the LLM directory."""
    config = llm_config(size)
    llm = Path(out_dir) / "LLM"
    llm.mkdir(parents=True, exist_ok=True)
    _write_text(llm / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_weights(llm / "model.safetensors", config, seed)
    write_tokenizer(llm)
    return llm


# ---------------------------------------------------------------------------------------------------- weights

def weight_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen2ForCausalLM state-dict names and shapes, sorted by name (tied embeddings: no lm_head)."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    return sorted(shapes.items())


def _tensor_seed(seed: int, name: str) -> int:
    """Per-tensor generator seed, so each tensor depends only on (seed, name), not on generation order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def write_weights(path: Path, config: dict, seed: int) -> None:
    """Stream a random F32 safetensors file tensor by tensor (peak memory: the largest tensor)."""
    import torch

    def tensor(name: str, shape: tuple[int, ...]):
        if name.endswith("norm.weight"):
            yield torch.ones(shape, dtype=torch.float32)
        else:
            g = torch.Generator().manual_seed(_tensor_seed(seed, name))
            yield torch.randn(shape, generator=g, dtype=torch.float32).mul_(INIT_STD)

    write_streamed_safetensors(path, weight_shapes(config), "F32", tensor)


def write_streamed_safetensors(path: Path, shapes: list[tuple[str, tuple[int, ...]]], dtype: str,
                               blocks: Callable[[str, tuple[int, ...]], Iterable]) -> None:
    """A safetensors file written header first, then each tensor's bytes as `blocks(name, shape)` yields them
    (torch tensors of `dtype`, F32 or BF16, in order): peak memory is one block, not the file. Written beside
    `path` and renamed into place."""
    import torch

    if sys.byteorder != "little":  # safetensors is little-endian; we write raw buffers
        raise RuntimeError("synthetic checkpoints need a little-endian machine")
    size = {"F32": 4, "BF16": 2}[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        nbytes = size * _numel(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape in shapes:
            for block in blocks(name, shape):
                raw = block.view(torch.int16) if block.dtype == torch.bfloat16 else block  # numpy has no bf16
                f.write(raw.contiguous().numpy().data)
    os.replace(tmp, path)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -------------------------------------------------------------------------------------------------- tokenizer

def _byte_symbols() -> list[str]:
    """The 256 GPT-2 byte-level symbols in Qwen/GPT-2 vocabulary order (ids 0..255: "!" first)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in printable] + [mapping[b] for b in range(256) if b not in printable]


def base_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Stand-in BPE vocab (ids 0..151642) and merges: bytes, space+letter and letter-pair merges, fillers."""
    symbols = _byte_symbols()
    lower = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    letters = lower + [c.upper() for c in lower]
    merges = [("Ġ", c) for c in letters] + [(a, b) for a in lower for b in lower]
    vocab = {s: i for i, s in enumerate(symbols)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    filler = 0
    while len(vocab) < BASE_VOCAB:
        vocab[f"<|synthetic_unused_{filler}|>"] = len(vocab)  # never produced: no merge builds it
        filler += 1
    return vocab, merges


def added_token_specs() -> list[tuple[str, bool, bool]]:
    """Every added token from id 151643 on, as (text, special, normalized), in id order."""
    qwen = [(text, special, False) for text, special in QWEN_SPECIALS]
    return qwen + [(text, False, True) for text in spark_added_tokens()]


def build_tokenizer():
    """The synthetic fast tokenizer (a `tokenizers.Tokenizer`), built offline."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = base_vocab()
    tk = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                       end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()  # a decoder takes no options (tokenizers ignored the ones given here)
    specs = added_token_specs()
    # add in id order; consecutive runs of the same kind in one call (each call appends at the next free id)
    i = 0
    while i < len(specs):
        j = i
        while j < len(specs) and specs[j][1:] == specs[i][1:]:
            j += 1
        batch = [AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=n, special=s)
                 for t, s, n in specs[i:j]]
        (tk.add_special_tokens if specs[i][1] else tk.add_tokens)(batch)
        i = j
    expect = BASE_VOCAB + len(specs)
    if tk.get_vocab_size(with_added_tokens=True) != expect or tk.token_to_id(specs[-1][0]) != expect - 1:
        raise RuntimeError("synthetic tokenizer ids drifted from the Spark-TTS layout")
    return tk


def write_tokenizer(llm_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and added_tokens.json."""
    tk = build_tokenizer()
    _write_text(llm_dir / "tokenizer.json", tk.to_str(pretty=False))
    specs = added_token_specs()
    decoder = {str(BASE_VOCAB + i): {"content": t, "lstrip": False, "normalized": n, "rstrip": False,
                                     "single_word": False, "special": s} for i, (t, s, n) in enumerate(specs)}
    extra_specials = [t for t, s in QWEN_SPECIALS[1:] if s]
    tokenizer_config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": extra_specials, "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    _write_text(llm_dir / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")

    def special(text: str) -> dict:
        return {"content": text, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    special_map = {"additional_special_tokens": extra_specials, "eos_token": special("<|im_end|>"),
                   "pad_token": special("<|endoftext|>")}
    _write_text(llm_dir / "special_tokens_map.json", json.dumps(special_map, indent=2) + "\n")
    added = {t: BASE_VOCAB + i for i, (t, _, _) in enumerate(specs)}
    _write_text(llm_dir / "added_tokens.json", json.dumps(added, indent=2, sort_keys=True) + "\n")


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8", newline="\n")

