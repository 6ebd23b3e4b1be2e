"""Provides BiCodec's torch modules (our own code) with the upstream checkpoint's state-dict names and shapes.

Shapes and names follow docs in the Spark-TTS format spec (BiCodec, sections 3-4). Convolutions hold PLAIN
weights: the checkpoint's weight-normed convolutions (`WNConv1d`, `WNConvTranspose1d`, stored as
`weight_g`/`weight_v`) are folded at load time by `fold_weight_norm`; `to_weight_norm_state_dict` goes the
other way for synthetic checkpoints.

Tensor layouts in comments: B batch, T semantic frames (50 Hz), C channels, N samples.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.backends import snake_fused

# ----------------------------------------------------------------------------------------------------------
# Weight norm: plain convs in memory, legacy g/v pairs on disk.


class WNConv1d(nn.Conv1d):
    """A plain Conv1d whose weight the checkpoint stores weight-normed (`weight_g` [out,1,1], `weight_v`)."""


class WNConvTranspose1d(nn.ConvTranspose1d):
    """A plain ConvTranspose1d stored weight-normed; `weight_g` is per INPUT channel ([in,1,1])."""


WEIGHT_NORMED = (WNConv1d, WNConvTranspose1d)


def fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """Effective weight g * v / ||v||, the norm taken over every dim but 0 (legacy `weight_norm(dim=0)`)."""
    norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    return v * (g / norm)


def split_weight_norm(w: Tensor) -> tuple[Tensor, Tensor]:
    """(g, v) with g = ||w|| per dim-0 slice and v = w: what `weight_norm` sets when it wraps a conv."""
    g = w.flatten(1).norm(dim=1).view(-1, *([1] * (w.dim() - 1)))
    return g, w.clone()


def weight_normed_keys(model: nn.Module) -> set[str]:
    """State-dict keys of `model` (plain form, `...weight`) that checkpoints store as `weight_g`/`weight_v`."""
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, WEIGHT_NORMED)}


def to_weight_norm_state_dict(model: nn.Module, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rewrite a plain state dict of `model` into the upstream on-disk form (legacy weight-norm names)."""
    wn = weight_normed_keys(model)
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key in wn:
            g, v = split_weight_norm(tensor)
            out[key[: -len("weight")] + "weight_g"] = g
            out[key[: -len("weight")] + "weight_v"] = v
        else:
            out[key] = tensor
    return out


# ----------------------------------------------------------------------------------------------------------
# Vocos backbone (encoder, prenet, postnet)


class AdaLayerNorm(nn.Module):
    """LayerNorm without affine, then `* scale(c) + shift(c)` with per-utterance condition c."""

    def __init__(self, condition_dim: int, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Linear(condition_dim, dim)
        self.shift = nn.Linear(condition_dim, dim)

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:  # x (B,T,C), cond (B,Cc)
        x = F.layer_norm(x, (self.scale.out_features,), eps=self.eps)  # a constant shape: exportable to ONNX
        return x * self.scale(cond)[:, None] + self.shift(cond)[:, None]


def _norm(dim: int, condition_dim: int | None) -> nn.Module:
    return AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=1e-6)


def _apply_norm(norm: nn.Module, x: Tensor, cond: Tensor | None) -> Tensor:
    return norm(x, cond) if isinstance(norm, AdaLayerNorm) else norm(x)


class ConvNeXtBlock(nn.Module):
    """x + gamma * pw2(gelu(pw1(norm(depthwise_conv7(x))))); operates on (B,C,T)."""

    def __init__(self, dim: int, intermediate_dim: int, num_layers: int, condition_dim: int | None) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = _norm(dim, condition_dim)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.layer_scale_init = 1.0 / num_layers
        self.gamma = nn.Parameter(torch.full((dim,), self.layer_scale_init))

    def forward(self, x: Tensor, cond: Tensor | None) -> Tensor:
        y = self.dwconv(x).transpose(1, 2)
        y = self.pwconv2(F.gelu(self.pwconv1(_apply_norm(self.norm, y, cond))))
        return x + (self.gamma * y).transpose(1, 2)


class VocosBackbone(nn.Module):
    """embed conv7 -> (Ada)LayerNorm -> N ConvNeXt blocks -> LayerNorm. (B,C_in,T) -> (B,T,dim)."""

    def __init__(
        self, input_channels: int, dim: int, intermediate_dim: int, num_layers: int,
        condition_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, kernel_size=7, padding=3)
        self.norm = _norm(dim, condition_dim)
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(dim, intermediate_dim, num_layers, condition_dim) for _ in range(num_layers))
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        x = _apply_norm(self.norm, self.embed(x).transpose(1, 2), cond).transpose(1, 2)
        for block in self.convnext:
            x = block(x, cond)
        return self.final_layer_norm(x.transpose(1, 2))


class TripleResample(nn.Module):
    """Upstream's SamplingBlock at ratio 1: its three branches all reduce to x, so it returns 3·x.

    Takes (B,T,C), returns (B,C,T). Holds no parameters (the stage's weights live under `.1.`).
    """

    def forward(self, x: Tensor) -> Tensor:
        return 3.0 * x.transpose(1, 2)


def pairs(stages: nn.ModuleList) -> Iterator[tuple[nn.Module, nn.Module]]:
    """The two modules of each stage: a ModuleList of two each, as the checkpoint's keys (`.0`, `.1`) are laid out."""
    for stage in stages:
        first, second = cast(nn.ModuleList, stage)
        yield first, second


def _resample_stages(dim: int, intermediate_dim: int, ratios: Sequence[int]) -> nn.ModuleList:
    if any(r != 1 for r in ratios):
        raise ValueError(f"only sample_ratios of 1 are supported (BiCodec release), got {list(ratios)}")
    return nn.ModuleList(
        nn.ModuleList([TripleResample(), VocosBackbone(dim, dim, intermediate_dim, 2)]) for _ in ratios)


class FeatureDecoder(nn.Module):
    """`prenet` (conditioned on the d-vector) and `postnet`: (B,C_in,T) -> (B,C_out,T)."""

    def __init__(
        self, input_channels: int, vocos_dim: int, vocos_intermediate_dim: int, vocos_num_layers: int,
        out_channels: int, condition_dim: int | None = None, sample_ratios: Sequence[int] = (1, 1),
        use_tanh_at_final: bool = False, **_: Any,
    ) -> None:
        super().__init__()
        self.linear_pre = nn.Linear(input_channels, vocos_dim)
        self.downsample = _resample_stages(vocos_dim, vocos_intermediate_dim, sample_ratios)
        self.vocos_backbone = VocosBackbone(
            vocos_dim, vocos_dim, vocos_intermediate_dim, vocos_num_layers, condition_dim)
        self.linear = nn.Linear(vocos_dim, out_channels)
        self.use_tanh_at_final = use_tanh_at_final

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        x = self.linear_pre(x.transpose(1, 2))  # (B,T,D)
        for resample, backbone in pairs(self.downsample):
            x = backbone(resample(x))
        x = self.linear(self.vocos_backbone(x.transpose(1, 2), cond)).transpose(1, 2)
        return torch.tanh(x) if self.use_tanh_at_final else x


class FeatureEncoder(nn.Module):
    """`encoder`: wav2vec2 features (B,1024,T) -> latents (B,C_out,T) for semantic tokenization."""

    def __init__(
        self, input_channels: int, vocos_dim: int, vocos_intermediate_dim: int, vocos_num_layers: int,
        out_channels: int, sample_ratios: Sequence[int] = (1, 1), **_: Any,
    ) -> None:
        super().__init__()
        self.encoder = VocosBackbone(input_channels, vocos_dim, vocos_intermediate_dim, vocos_num_layers)
        self.downsample = _resample_stages(vocos_dim, vocos_intermediate_dim, sample_ratios)
        self.project = nn.Linear(vocos_dim, out_channels)

    def forward(self, x: Tensor) -> Tensor:
        x = self.encoder(x)  # (B,T,D)
        for resample, backbone in pairs(self.downsample):
            x = backbone(resample(x))
        return self.project(x).transpose(1, 2)


# ----------------------------------------------------------------------------------------------------------
# Wave generator (DAC-style)


class Snake(nn.Module):
    """x + sin²(αx)/α with a learned per-channel α (shape [1,C,1])."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        self.fused = True
        """Whether a call snake_fused can take runs its Triton kernel; False keeps the eager formula (the fused
        kernel's A/B, engine.bench.decoder_snake: set before a decoder's warm-up, which a CUDA graph keeps)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.fused and snake_fused.usable(x, self.alpha):
            return snake_fused.fused_snake(x, self.alpha)
        inv_alpha = (self.alpha + 1e-9).reciprocal()
        if torch.is_grad_enabled():
            return x + torch.sin(self.alpha * x).square() * inv_alpha
        # inference: in place on one fresh tensor. At 16 kHz these activations are tens of MB and every extra
        # temporary costs page faults; this halves CPU time of long decodes (same ops, same rounding).
        return (self.alpha * x).sin_().square_().mul_(inv_alpha).add_(x)


class ResidualUnit(nn.Module):
    """x + conv1(snake(conv7_dilated(snake(x)))), length-preserving."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake(dim),
            WNConv1d(dim, dim, kernel_size=7, dilation=dilation, padding=3 * dilation),
            Snake(dim),
            WNConv1d(dim, dim, kernel_size=1),
        )

    def forward(self, x: Tensor) -> Tensor:
        y = self.block(x)
        return x + y if torch.is_grad_enabled() else y.add_(x)


class UpsampleBlock(nn.Module):
    """snake -> transposed conv (length × stride exactly) -> residual units with dilation 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        up = WNConvTranspose1d(in_dim, out_dim, kernel_size, stride=stride, padding=(kernel_size - stride) // 2)
        self.stride = stride
        self.block = nn.Sequential(
            Snake(in_dim), up, ResidualUnit(out_dim, 1), ResidualUnit(out_dim, 3), ResidualUnit(out_dim, 9))

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class WaveGenerator(nn.Module):
    """`decoder`: (B,C,T) features -> (B,1,T·prod(rates)) audio in [-1,1]."""

    def __init__(
        self, input_channel: int, channels: int, rates: Sequence[int], kernel_sizes: Sequence[int], **_: Any,
    ) -> None:
        super().__init__()
        if len(rates) != len(kernel_sizes):
            raise ValueError("decoder rates and kernel_sizes differ in length")
        for k, s in zip(kernel_sizes, rates):
            if (k - s) % 2:
                raise ValueError(f"decoder kernel {k} / rate {s}: output length would not be T·rate")
        layers: list[nn.Module] = [WNConv1d(input_channel, channels, kernel_size=7, padding=3)]
        dims = [channels // 2**i for i in range(len(rates) + 1)]
        layers += [UpsampleBlock(dims[i], dims[i + 1], k, s) for i, (k, s) in enumerate(zip(kernel_sizes, rates))]
        layers += [Snake(dims[-1]), WNConv1d(dims[-1], 1, kernel_size=7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)
        self.crops = crop_margins(self.model)
        """Layer index -> codes of context the rest of the generator still needs on each side of a kept span."""

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def kept(self, x: Tensor, start: int, stop: int) -> Tensor:
        """The audio of codes [start, stop) only: (B,C,T) features -> (B,1,(stop-start)·prod(rates)).

        Equal to `forward(x)[..., start·spc: stop·spc]` up to float rounding, at a fraction of its cost for a
        streaming window: before each upsampling block the activations are cropped to the kept codes plus the
        context the remaining layers can still see (`crops`), so the expensive high-rate layers skip most of the
        window's left and right context, which only the early layers need."""
        codes, first, per_code = x.shape[-1], 0, 1
        for i, layer in enumerate(self.model):
            if i in self.crops:
                lo, hi = max(first, start - self.crops[i]), min(codes, stop + self.crops[i])
                x = x[..., (lo - first) * per_code: (hi - first) * per_code]
                first = lo
            x = layer(x)
            if isinstance(layer, UpsampleBlock):
                per_code *= layer.stride
        return x[..., (start - first) * per_code: (stop - first) * per_code]


CROP_SAFETY = 1
"""Codes of context kept beyond the computed reach: the reach is rounded up already, this covers nothing known."""


def reach(module: nn.Module, frames: int = 0) -> int:
    """Frames at `module`'s input that one output frame depends on, on each side, plus `frames` of reach already
    needed at its output. Children are assumed to run in order (every block here is Sequential-shaped); pointwise
    layers reach nothing and residual skips reach less than their branch."""
    if isinstance(module, nn.ConvTranspose1d):
        # output o = i·stride - padding + t (t < kernel): widening the output by r frames widens the input by
        # at most ceil((r + kernel) / stride)
        return -(-(frames + module.kernel_size[0]) // module.stride[0])
    if isinstance(module, nn.Conv1d):
        if module.stride[0] != 1:
            raise ValueError("strided convolutions are not cropped")
        if isinstance(module.padding, str):
            raise ValueError("convolutions padded by name are not cropped")
        span, pad = module.dilation[0] * (module.kernel_size[0] - 1), module.padding[0]
        return frames + max(pad, span - pad)
    for child in reversed(list(module.children())):
        frames = reach(child, frames)
    return frames


def crop_margins(layers: nn.Sequential) -> dict[int, int]:
    """For the input of the first layer and of each UpsampleBlock: codes of context the layers from there on
    need around a kept span (`reach` in that point's frames, rounded up to codes, + CROP_SAFETY)."""
    margins, per_code = {}, 1
    for i, layer in enumerate(layers):
        if i == 0 or isinstance(layer, UpsampleBlock):
            margins[i] = -(-reach(layers[i:]) // per_code) + CROP_SAFETY
        if isinstance(layer, UpsampleBlock):
            per_code *= layer.stride
    return margins


# ----------------------------------------------------------------------------------------------------------
# Semantic quantizer


class FactorizedVQ(nn.Module):
    """`quantizer`: 8192 × 8 codebook with 1×1 projections to/from the 1024-d latent space."""

    def __init__(
        self, input_dim: int, codebook_size: int, codebook_dim: int, *, encode: bool = True,
        training_state: bool = False, **_: Any,
    ) -> None:
        super().__init__()
        if encode:
            self.in_project = WNConv1d(input_dim, codebook_dim, kernel_size=1)
        self.out_project = WNConv1d(codebook_dim, input_dim, kernel_size=1)
        # given weights: no random init, whose ref on the meta device imports torch._dynamo (seconds at start-up)
        self.codebook = nn.Embedding(codebook_size, codebook_dim, _weight=torch.empty(codebook_size, codebook_dim))
        if training_state:  # persistent in the checkpoint, unused by inference
            self.register_buffer("cluster_size", torch.zeros(codebook_size))

    def dequantize(self, indices: Tensor) -> Tensor:
        """(B,T) codes -> (B,C,T): raw codebook rows (no L2 norm), then out_project."""
        return self.out_project(self.codebook(indices).transpose(1, 2))

    def tokenize(self, z: Tensor) -> Tensor:
        """(B,C,T) latents -> (B,T) codes, nearest codebook row by cosine similarity."""
        e = F.normalize(self.in_project(z).transpose(1, 2), dim=-1)
        return (e @ F.normalize(self.codebook.weight, dim=-1).t()).argmax(-1)


# ----------------------------------------------------------------------------------------------------------
# Speaker encoder: ECAPA-TDNN (c512) -> perceiver resampler -> FSQ, and FSQ codes -> d-vector


class ConvReluBN(nn.Module):
    """bn(relu(conv(x)))."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int = 1, padding: int = 0, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel_size, padding=padding, dilation=dilation)
        self.bn = nn.BatchNorm1d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2ConvReluBN(nn.Module):
    """Res2Net: split channels into `scale` groups; each but the last passes conv-relu-bn fed by the previous."""

    def __init__(self, channels: int, kernel_size: int, dilation: int, scale: int) -> None:
        super().__init__()
        self.width = channels // scale
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, kernel_size, padding=dilation, dilation=dilation)
            for _ in range(scale - 1))
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        groups = torch.split(x, self.width, dim=1)
        outs, y = [], None
        for g, conv, bn in zip(groups, self.convs, self.bns):
            y = bn(F.relu(conv(g if y is None else y + g)))
            outs.append(y)
        outs.append(groups[-1])
        return torch.cat(outs, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int = 128) -> None:
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: Tensor) -> Tensor:
        w = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * w[:, :, None]


class SERes2Block(nn.Module):
    def __init__(self, channels: int, dilation: int, scale: int = 8) -> None:
        super().__init__()
        self.se_res2block = nn.Sequential(
            ConvReluBN(channels, channels),
            Res2ConvReluBN(channels, 3, dilation, scale),
            ConvReluBN(channels, channels),
            SqueezeExcite(channels),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_res2block(x)


class AttentiveStatsPool(nn.Module):
    """ECAPA's x-vector pooling head; only present for key parity (speaker tokens do not use it)."""

    def __init__(self, in_dim: int, bottleneck: int = 128) -> None:
        super().__init__()
        self.linear1 = nn.Conv1d(in_dim * 3, bottleneck, kernel_size=1)
        self.linear2 = nn.Conv1d(bottleneck, in_dim, kernel_size=1)


class ECAPATDNN(nn.Module):
    """ECAPA-TDNN-GLOB-c512; `latent(mel)` is the frame-level output the speaker tokens are built from."""

    LATENT = 1536  # upstream fixes the output conv at 512·3 whatever `channels` is

    def __init__(self, feat_dim: int, embed_dim: int, channels: int = 512, *, xvector_head: bool = False) -> None:
        super().__init__()
        self.layer1 = ConvReluBN(feat_dim, channels, kernel_size=5, padding=2)
        self.layer2 = SERes2Block(channels, dilation=2)
        self.layer3 = SERes2Block(channels, dilation=3)
        self.layer4 = SERes2Block(channels, dilation=4)
        self.conv = nn.Conv1d(channels * 3, self.LATENT, kernel_size=1)
        if xvector_head:  # pool/bn/linear: the x-vector branch, used only in training
            self.pool = AttentiveStatsPool(self.LATENT)
            self.bn = nn.BatchNorm1d(self.LATENT * 2)
            self.linear = nn.Linear(self.LATENT * 2, embed_dim)

    def latent(self, mel: Tensor) -> Tensor:
        """(B,n_mels,T) -> (B,1536,T)."""
        h1 = self.layer1(mel)
        h2 = self.layer2(h1)
        h3 = self.layer3(h2)
        h4 = self.layer4(h3)
        return F.relu(self.conv(torch.cat([h2, h3, h4], dim=1)))


class CrossAttention(nn.Module):
    """Latents attend over concat(latents, context); 8 heads × 64, no biases."""

    def __init__(self, dim: int, heads: int = 8, dim_head: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, heads * dim_head, bias=False)
        self.to_kv = nn.Linear(dim, 2 * heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim, bias=False)

    def forward(self, latents: Tensor, context: Tensor) -> Tensor:
        def split_heads(t: Tensor) -> Tensor:  # (B,N,H·D) -> (B,H,N,D)
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        q = split_heads(self.to_q(latents))
        k, v = map(split_heads, self.to_kv(torch.cat([latents, context], dim=1)).chunk(2, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).flatten(2))


class GEGLU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        a, gate = x.chunk(2, dim=-1)
        return a * F.gelu(gate)


def geglu_feed_forward(dim: int, inner: int) -> nn.Sequential:
    """Linear(dim, 2·inner) -> GEGLU -> Linear(inner, dim); keys `.0` and `.2`."""
    return nn.Sequential(nn.Linear(dim, 2 * inner), GEGLU(), nn.Linear(inner, dim))


class PerceiverResampler(nn.Module):
    """Context (B,T,1536) -> 32 latent tokens (B,32,dim), RMS-normalised."""

    def __init__(self, dim: int, dim_context: int, num_latents: int, depth: int = 2, ff_mult: int = 4) -> None:
        super().__init__()
        inner = int(dim * ff_mult * 2 / 3)
        self.proj_context = nn.Linear(dim_context, dim)
        self.latents = nn.Parameter(torch.zeros(num_latents, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([CrossAttention(dim), geglu_feed_forward(dim, inner)]) for _ in range(depth))
        self.norm = RMSNorm(dim)

    def forward(self, context: Tensor) -> Tensor:
        context = self.proj_context(context)
        x = self.latents.expand(context.shape[0], -1, -1)
        for attn, ff in pairs(self.layers):
            x = x + attn(x, context)
            x = x + ff(x)
        return self.norm(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) * math.sqrt(x.shape[-1]) * self.gamma


class FSQProjection(nn.Module):
    """ResidualFSQ with one quantizer: project_in (dim -> len(levels)), FSQ, project_out back."""

    def __init__(self, levels: Sequence[int], dim: int, *, encode: bool = True) -> None:
        super().__init__()
        self.levels = list(levels)
        basis = [1]
        for lv in self.levels[:-1]:
            basis.append(basis[-1] * lv)
        self.basis = basis
        if encode:
            self.project_in = nn.Linear(dim, len(levels))
        self.project_out = nn.Linear(len(levels), dim)

    def _consts(self, like: Tensor) -> tuple[Tensor, Tensor]:
        # Cached per device: a CUDA graph capture must not copy from the host, and replays reuse these tensors.
        cache = self.__dict__.setdefault("_const_cache", {})
        if like.device not in cache:
            cache[like.device] = (torch.tensor(self.levels, device=like.device),
                                  torch.tensor(self.basis, device=like.device))
        return cache[like.device]

    def codes_from_indices(self, indices: Tensor) -> Tensor:
        """(...) ints -> (..., len(levels)) codes in [-1, 1): digit d -> (d - L//2) / (L//2)."""
        levels, basis = self._consts(indices)
        digits = (indices[..., None] // basis) % levels
        half = levels // 2
        return (digits - half).float() / half

    def indices_from_vectors(self, x: Tensor) -> Tensor:
        """(..., dim) -> (...) ints: project_in, bound with tanh, round to the level grid."""
        z = self.project_in(x).float()
        levels, basis = self._consts(z)
        half_l = (levels - 1) * (1 + 1e-3) / 2
        offset = torch.where(levels % 2 == 0, 0.5, 0.0)
        bounded = torch.tanh(z + torch.atanh(offset / half_l)) * half_l - offset
        digits = torch.round(bounded) + levels // 2
        return (digits * basis).sum(-1).long()

    def vectors_from_indices(self, indices: Tensor) -> Tensor:
        codes = self.codes_from_indices(indices).to(self.project_out.weight.dtype)
        return self.project_out(codes)


class SpeakerEncoder(nn.Module):
    """`speaker_encoder`: mel -> 32 global tokens (needs `encode`), and 32 tokens -> d-vector (B,out_dim)."""

    def __init__(
        self, input_dim: int, out_dim: int, latent_dim: int, token_num: int, fsq_levels: Sequence[int],
        fsq_num_quantizers: int = 1, *, encode: bool = True, xvector_head: bool = False, **_: Any,
    ) -> None:
        super().__init__()
        if fsq_num_quantizers != 1:
            raise ValueError(f"only fsq_num_quantizers 1 is supported, got {fsq_num_quantizers}")
        self.token_num = token_num
        if encode:
            self.speaker_encoder = ECAPATDNN(input_dim, out_dim, xvector_head=xvector_head)
            self.perceiver_sampler = PerceiverResampler(latent_dim, ECAPATDNN.LATENT, token_num)
        self.quantizer = FSQProjection(fsq_levels, latent_dim, encode=encode)
        self.project = nn.Linear(latent_dim * token_num, out_dim)

    def tokenize(self, mel: Tensor) -> Tensor:
        """(B,n_mels,T) magnitude mel -> (B,token_num) ints."""
        latents = self.perceiver_sampler(self.speaker_encoder.latent(mel).transpose(1, 2))
        return self.quantizer.indices_from_vectors(latents)

    def detokenize(self, indices: Tensor) -> Tensor:
        """(B,token_num) ints -> (B,out_dim); flattened channel-major (all tokens of channel 0 first)."""
        v = self.quantizer.vectors_from_indices(indices)  # (B,N,latent)
        return self.project(v.transpose(1, 2).flatten(1))


# ----------------------------------------------------------------------------------------------------------
# Whole codec


class BiCodecModel(nn.Module):
    """The BiCodec modules a task needs, with upstream names.

    decode always; `with_encoder` adds the speaker tower (ECAPA, perceiver, FSQ project_in) and the
    quantizer's in_project; `complete` adds everything else the checkpoint holds (feature encoder, postnet,
    x-vector head, quantizer statistics) so the key set equals upstream's.
    """

    def __init__(self, cfg: Mapping[str, Any], *, with_encoder: bool = False, complete: bool = False) -> None:
        super().__init__()
        encode = with_encoder or complete
        self.config = dict(cfg)
        self.samples_per_code = math.prod(cfg["decoder"]["rates"])
        self.quantizer = FactorizedVQ(**cfg["quantizer"], encode=encode, training_state=complete)
        self.speaker_encoder = SpeakerEncoder(**cfg["speaker_encoder"], encode=encode, xvector_head=complete)
        self.prenet = FeatureDecoder(**cfg["prenet"])
        self.decoder = WaveGenerator(**cfg["decoder"])
        if complete:
            self.encoder = FeatureEncoder(**cfg["encoder"])
            self.postnet = FeatureDecoder(**cfg["postnet"])

    def decode(self, semantic: Tensor, global_tokens: Tensor) -> Tensor:
        """(B,T) semantic codes + (B,32) global codes -> (B, T·samples_per_code) audio."""
        return self.decoder(self._features(semantic, global_tokens))[:, 0]

    def decode_kept(self, semantic: Tensor, global_tokens: Tensor, start: int, stop: int) -> Tensor:
        """`decode(...)[:, start·spc: stop·spc]` without computing the rest at the full sample rate
        (WaveGenerator.kept): what a streaming window keeps."""
        return self.decoder.kept(self._features(semantic, global_tokens), start, stop)[:, 0]

    def _features(self, semantic: Tensor, global_tokens: Tensor) -> Tensor:
        z = self.quantizer.dequantize(semantic)
        d = self.speaker_encoder.detokenize(global_tokens)
        return self.prenet(z, d) + d[:, :, None]

    def global_tokens(self, mel: Tensor) -> Tensor:
        """(B,n_mels,T) -> (B,32) speaker tokens."""
        return self.speaker_encoder.tokenize(mel)


# ----------------------------------------------------------------------------------------------------------
# Mel spectrogram (torchaudio-compatible settings, plain torch)


def _hz_to_mel_slaney(f: Tensor) -> Tensor:
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    lin = f / f_sp
    return torch.where(f >= min_log_hz, min_log_hz / f_sp + torch.log(f / min_log_hz) / logstep, lin)


def _mel_to_hz_slaney(m: Tensor) -> Tensor:
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return torch.where(m >= min_log_mel, min_log_hz * torch.exp(logstep * (m - min_log_mel)), f_sp * m)


def slaney_mel_filterbank(n_freqs: int, sample_rate: int, n_mels: int, f_min: float, f_max: float) -> Tensor:
    """(n_freqs, n_mels) triangular filters on the Slaney mel scale, area-normalised (norm="slaney")."""
    freqs = torch.linspace(0, sample_rate // 2, n_freqs, dtype=torch.float64)
    edges = torch.tensor([f_min, f_max], dtype=torch.float64)
    m_lo, m_hi = _hz_to_mel_slaney(edges).tolist()
    f_pts = _mel_to_hz_slaney(torch.linspace(m_lo, m_hi, n_mels + 2, dtype=torch.float64))
    width = f_pts[1:] - f_pts[:-1]
    dist = f_pts[None, :] - freqs[:, None]  # (n_freqs, n_mels+2)
    rising = -dist[:, :-2] / width[:-1]
    falling = dist[:, 2:] / width[1:]
    fb = torch.clamp(torch.minimum(rising, falling), min=0.0)
    fb = fb * (2.0 / (f_pts[2:] - f_pts[:-2]))
    return fb.float()


def mel_spectrogram(
    wav: Tensor, *, sample_rate: int = 16000, n_fft: int = 1024, win_length: int = 640, hop_length: int = 320,
    n_mels: int = 128, f_min: float = 10.0, f_max: float | None = None,
) -> Tensor:
    """(B,N) or (N,) float audio -> (B,n_mels,frames) linear-magnitude mel (periodic Hann, centred, reflect).

    frames = N // hop_length + 1 (301 for 6 s at 16 kHz).
    """
    batched = wav.dim() == 2
    wav = wav if batched else wav[None]
    window = torch.hann_window(win_length, periodic=True, dtype=wav.dtype, device=wav.device)
    spec = torch.stft(
        wav, n_fft, hop_length=hop_length, win_length=win_length, window=window, center=True,
        pad_mode="reflect", normalized=False, onesided=True, return_complex=True).abs()
    fb = slaney_mel_filterbank(n_fft // 2 + 1, sample_rate, n_mels, f_min, f_max or sample_rate / 2)
    mel = torch.matmul(spec.transpose(1, 2), fb.to(spec)).transpose(1, 2)
    return mel if batched else mel[0]
