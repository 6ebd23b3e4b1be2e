"""Provides synthetic BiCodec checkpoints: upstream layout and key names, random weights, deterministic bytes.

`write_bicodec(out_dir, size, seed)` writes `out_dir/BiCodec/config.yaml` and `model.safetensors` holding
every tensor a strict load into upstream BiCodec expects (torchaudio's mel buffers excepted), weight-normed
convs in the legacy `weight_g`/`weight_v` form. Weights are drawn the way upstream's constructors leave them
(so random-init audio is sane and windowed-decode seams decay as in the spec):
  * inside Vocos backbones: convs/linears (AdaLN's too) N(0, 0.02) (upstream's trunc-normal, whose ±2 bounds
    never bite), biases 0, layer scale 1/num_layers;
  * wave-generator convs: torch's default uniform ±1/sqrt(fan_in), conv biases 0 (transposed-conv biases
    keep the default uniform); Snake α = 1;
  * everything else: torch defaults (uniform ±1/sqrt(fan_in) weights and biases, N(0,1) codebook,
    BatchNorm 1/0 with running stats 0/1, perceiver latents N(0, 0.02), norms 1/0);
  * one deliberate change: the wave generator's final conv gets OUTPUT_GAIN, so random-init audio sits at a
    speech-like level (RMS ~0.03-0.1 instead of upstream-init's ~0.015); the decoder stays far from tanh
    saturation, so seam errors relative to RMS are unchanged.
`size="full"` uses the release's config (156.4 M elements); `size="tiny"` keeps the codes' meaning (rates,
codebooks, 32 globals, 16 kHz) with small channels. The ECAPA tower stays at 512 channels in both: upstream
hard-codes it.
"""
from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file
from torch import nn

from engine.backends.bicodec_modules import (
    BiCodecModel, ConvNeXtBlock, PerceiverResampler, RMSNorm, Snake, VocosBackbone, WaveGenerator,
    to_weight_norm_state_dict,
)

_MEL = {"sample_rate": 16000, "n_fft": 1024, "win_length": 640, "hop_length": 320, "mel_fmin": 10,
        "mel_fmax": None, "num_mels": 128}
_QUANTIZER = {"codebook_size": 8192, "codebook_dim": 8, "commitment": 0.25, "codebook_loss_weight": 2.0,
              "use_l2_normlize": True, "threshold_ema_dead_code": 0.2}
_RATES = {"rates": [8, 5, 4, 2], "kernel_sizes": [16, 11, 8, 4]}
_SPEAKER = {"input_dim": 128, "token_num": 32, "fsq_levels": [4, 4, 4, 4, 4, 4], "fsq_num_quantizers": 1}


OUTPUT_GAIN = 2.5
"""Scale on the final conv's `weight_g` (see module docstring)."""


def _vocos(cin: int, dim: int, inter: int, layers: int, cout: int, **extra: Any) -> dict[str, Any]:
    return {"input_channels": cin, "vocos_dim": dim, "vocos_intermediate_dim": inter,
            "vocos_num_layers": layers, "out_channels": cout, **extra}


_SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "mel_params": _MEL,
        "encoder": _vocos(1024, 384, 2048, 12, 1024, sample_ratios=[1, 1]),
        "decoder": {"input_channel": 1024, "channels": 1536, **_RATES},
        "quantizer": {"input_dim": 1024, **_QUANTIZER},
        "speaker_encoder": {**_SPEAKER, "out_dim": 1024, "latent_dim": 128},
        "prenet": _vocos(1024, 384, 2048, 12, 1024, condition_dim=1024, sample_ratios=[1, 1],
                         use_tanh_at_final=False),
        "postnet": _vocos(1024, 384, 2048, 6, 1024, use_tanh_at_final=False),
    },
    "tiny": {
        "mel_params": _MEL,
        "encoder": _vocos(1024, 32, 64, 2, 64, sample_ratios=[1, 1]),
        "decoder": {"input_channel": 64, "channels": 64, **_RATES},
        "quantizer": {"input_dim": 64, **_QUANTIZER},
        "speaker_encoder": {**_SPEAKER, "out_dim": 64, "latent_dim": 32},
        "prenet": _vocos(64, 32, 64, 2, 64, condition_dim=64, sample_ratios=[1, 1], use_tanh_at_final=False),
        "postnet": _vocos(64, 32, 64, 2, 1024, use_tanh_at_final=False),
    },
}


def bicodec_size_config(size: str) -> dict[str, Any]:
    """The `audio_tokenizer` mapping for a synthetic size ("full" = the release's values, or "tiny")."""
    if size not in _SIZES:
        raise ValueError(f"unknown BiCodec size {size!r}; choose one of {sorted(_SIZES)}")
    return copy.deepcopy(_SIZES[size])


def bicodec_state_dict(size: str, seed: int) -> dict[str, torch.Tensor]:
    """Random weights in the on-disk form (legacy weight-norm names), same (size, seed) -> same values."""
    cfg = bicodec_size_config(size)
    with torch.device("meta"):
        model = BiCodecModel(cfg, complete=True)
    gen = torch.Generator().manual_seed(seed)
    init = _init_rules(model)
    plain = {key: init[key](tuple(ref.shape), ref.dtype, gen) for key, ref in sorted(model.state_dict().items())}
    state = to_weight_norm_state_dict(model, plain)
    last_conv = f"decoder.model.{len(model.decoder.model) - 2}.weight_g"
    state[last_conv] = state[last_conv] * OUTPUT_GAIN
    return state


def write_bicodec(out_dir: Path, size: str, seed: int) -> None:
    """Write `out_dir/BiCodec/{config.yaml,model.safetensors}`; byte-identical for the same (size, seed)."""
    folder = Path(out_dir) / "BiCodec"
    folder.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_dump({"audio_tokenizer": bicodec_size_config(size)}, sort_keys=False,
                            default_flow_style=None)
    _atomic_write(folder / "config.yaml", lambda p: p.write_text(config, encoding="utf-8"))
    state = bicodec_state_dict(size, seed)
    _atomic_write(folder / "model.safetensors", lambda p: save_file(state, str(p), metadata={"format": "pt"}))


def _atomic_write(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# Init rules, mirroring what upstream's constructors leave in each tensor


def _const(value: float):
    return lambda shape, dtype, gen: torch.full(shape, value, dtype=dtype)


def _normal(std: float):
    return lambda shape, dtype, gen: (torch.randn(shape, generator=gen) * std).to(dtype)


def _uniform(bound: float):
    return lambda shape, dtype, gen: ((torch.rand(shape, generator=gen) * 2 - 1) * bound).to(dtype)


def _fan_in(weight: torch.Tensor) -> int:
    """torch's fan-in: size(1) × kernel elements (for ConvTranspose that is the OUTPUT channels)."""
    return weight.shape[1] * math.prod(weight.shape[2:])


def _init_rules(model: BiCodecModel) -> dict[str, Any]:
    vocos = [name + "." for name, m in model.named_modules() if isinstance(m, VocosBackbone)]
    wavegen = [name + "." for name, m in model.named_modules() if isinstance(m, WaveGenerator)]
    rules: dict[str, Any] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        in_vocos = any(prefix.startswith(v) for v in vocos)
        in_wavegen = any(prefix.startswith(w) for w in wavegen)
        own = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
        for pname, tensor in own.items():
            rules[prefix + pname] = _rule(module, pname, tensor, in_vocos, in_wavegen)
    return rules


def _rule(module: nn.Module, pname: str, t: torch.Tensor, in_vocos: bool, in_wavegen: bool):
    if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)):
        if in_vocos:
            return _normal(0.02) if pname == "weight" else _const(0.0)
        bound = 1.0 / math.sqrt(_fan_in(module.weight))
        if pname == "bias" and in_wavegen and isinstance(module, nn.Conv1d):
            return _const(0.0)
        return _uniform(bound)
    if isinstance(module, ConvNeXtBlock) and pname == "gamma":
        return _const(module.layer_scale_init)
    if isinstance(module, (nn.LayerNorm, nn.BatchNorm1d)):
        return {"weight": _const(1.0), "running_var": _const(1.0)}.get(pname, _const(0.0))
    if isinstance(module, (Snake, RMSNorm)):
        return _const(1.0)
    if isinstance(module, nn.Embedding):
        return _normal(1.0)
    if isinstance(module, PerceiverResampler) and pname == "latents":
        return _normal(0.02)
    if pname == "cluster_size":
        return _const(0.0)
    raise ValueError(f"no init rule for {type(module).__name__}.{pname}")
