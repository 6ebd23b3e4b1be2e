"""Provides Qwen2Weights: a Qwen2 (or Llama) LLM's config and tensors for StaticQwen2, read straight from a
checkpoint's config.json and safetensors files, or taken from a loaded transformers model; and the rotary
frequencies both share.

A Llama is a Qwen2 without q/k/v biases and, from Llama 3.1 on, with "llama3" rotary scaling: one code path serves
both (zero biases where a checkpoint has none).

Reading the files directly keeps transformers out of a process that only needs the weights: importing it is the
largest single cost of a fresh engine's start-up (docs/benchmarks/startup.json).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from engine.errors import ModelFormatError, ModelNotFound


@dataclass(frozen=True, slots=True)
class Qwen2Config:
    """The fields of a transformers Qwen2 config that StaticQwen2 and the graph lane read (same names)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    head_dim: int | None = None
    """None: hidden_size // num_attention_heads."""
    model_type: str = "qwen2"
    rope_scaling: dict[str, Any] | None = None
    use_sliding_window: bool = False
    attention_bias: bool = True
    """q/k/v projections have biases (Qwen2); Llama's have none."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Qwen2Config":
        """From config.json's object; KeyError/TypeError/ValueError on a missing or malformed field."""
        rope = raw.get("rope_parameters") or {}
        theta = raw.get("rope_theta", rope.get("rope_theta") if isinstance(rope, dict) else None)
        if theta is None:
            raise KeyError("rope_theta")
        names = set(cls.__dataclass_fields__) - {"rope_theta"}
        known = {k: raw[k] for k in names if k in raw}
        scaled = isinstance(rope, dict) and rope.get("rope_type", "default") != "default"
        if known.get("rope_scaling") is None and scaled:
            known["rope_scaling"] = rope
        if "attention_bias" not in raw:
            known["attention_bias"] = raw.get("model_type", "qwen2") == "qwen2"
        config = cls(rope_theta=float(theta), **known)
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                     "intermediate_size", "vocab_size"):
            if not isinstance(getattr(config, name), int) or getattr(config, name) < 1:
                raise ValueError(f"{name} must be a positive integer")
        return config


class Qwen2Weights:
    """A Qwen2 model's config and its tensors by their transformers names (`model.layers.3.mlp.up_proj.weight`)."""

    def __init__(self, config: Any, tensor: Callable[[str], torch.Tensor], tied: bool,
                 release: Callable[[int], None] = lambda layer: None) -> None:
        self.config = config
        """A Qwen2Config, or the transformers config of `from_module`."""
        self.tensor = tensor
        """Name -> tensor (on whatever device it was stored or loaded on)."""
        self.tied = tied
        """The output embedding is the input embedding (no `lm_head.weight` of its own)."""
        self.release = release
        """Free one layer's source tensors once converted (a transformers model on the CPU: one copy, not two)."""

    @classmethod
    def from_checkpoint(cls, llm_dir: str | Path) -> "Qwen2Weights":
        """The LLM folder's config.json and model.safetensors (or its shards, through the index file). Tensors are
        read from the files when asked for. ModelNotFound / ModelFormatError with one-line messages."""
        from safetensors import safe_open

        root = Path(llm_dir)
        config = read_config(root)
        files = _weight_files(root)
        where: dict[str, Any] = {}
        try:
            for path in files:
                handle = safe_open(str(path), framework="pt")
                where.update((name, handle) for name in handle.keys())
        except Exception as err:  # noqa: BLE001 - truncated or foreign files: one user-facing line
            raise ModelFormatError(f"cannot read the LLM weights in {root}: {err}") from err

        def tensor(name: str) -> torch.Tensor:
            if name not in where:
                raise ModelFormatError(f"the LLM weights in {root} have no tensor {name}")
            return where[name].get_tensor(name)

        return cls(config, tensor, tied=config.tie_word_embeddings or "lm_head.weight" not in where)

    @classmethod
    def from_module(cls, model: Any) -> "Qwen2Weights":  # duck-typed: any module of that layout
        """A loaded transformers Qwen2ForCausalLM (or a model of its layout)."""
        params = dict(model.named_parameters(remove_duplicate=False))
        tied = model.get_output_embeddings().weight is model.model.embed_tokens.weight

        def release(layer: int) -> None:
            for param in model.model.layers[layer].parameters():
                param.data = torch.empty(0, dtype=param.dtype)

        return cls(model.config, params.__getitem__, tied, release)


ARCHITECTURES = ("qwen2", "llama")
"""model_type values the static forward, the int8 path and the graph lane implement."""


def rope_kind(cfg: Any) -> str:
    """The rotary scaling a config asks for: "default", "llama3", or another name (not implemented)."""
    rope = _rope(cfg)
    return str(rope.get("rope_type", rope.get("type", "default")))


def _rope(cfg: Any) -> dict[str, Any]:
    """A config's rotary settings (`rope_scaling`, or `rope_parameters` in newer transformers); {} for none."""
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    return rope if isinstance(rope, dict) else {}


def rope_inv_freq(cfg: Any, head_dim: int) -> torch.Tensor:
    """fp32 inverse frequencies [head_dim / 2] of the rotary embedding, with Llama 3's scaling where the config has
    it: wavelengths beyond the original context are stretched by `factor`, those below `original / high_freq_factor`
    kept, and the band between blended smoothly (transformers' "llama3" rope type; its attention factor is 1)."""
    theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {})["rope_theta"]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = rope_kind(cfg)
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"rotary scaling {kind!r} is not implemented (plain and llama3 are)")
    rope = _rope(cfg)
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def read_config(llm_dir: Path) -> Qwen2Config:
    """config.json of an LLM folder; ModelNotFound when absent, ModelFormatError when unreadable."""
    path = llm_dir / "config.json"
    if not path.is_file():
        raise ModelNotFound(f"no LLM checkpoint (config.json) in {llm_dir}; download the model first")
    try:
        return Qwen2Config.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelFormatError(f"cannot read {path}: {type(err).__name__}: {err}") from err


def _weight_files(root: Path) -> list[Path]:
    """model.safetensors, or the shards its index names."""
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    index = root / "model.safetensors.index.json"
    if not index.is_file():
        raise ModelNotFound(f"no LLM weights (model.safetensors) in {root}; download the model first")
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelFormatError(f"cannot read {index}: {err}") from err
    return [root / name for name in shards]
