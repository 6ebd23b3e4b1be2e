"""Provides our SNAC 24 kHz decoder: strict checkpoint loading, position-keyed noise, and a batched CodecDecoder.

Only the decode side is built: each level's codebook lookup and output projection, summed into one latent, then
the decoder's convolutions and upsampling blocks. Weight norm is folded into plain weights at load. SNAC's
decoder blocks add noise after each upsampling (`randn` in the reference); here that noise is a fixed function of
(seed, block, absolute sample position in the sentence), so a window decoded alone carries the very noise a
one-shot decode puts at the same place, and an export is the same bytes every run.
"""
from __future__ import annotations

import math
import pickle
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from engine.backends.base import DecodeItem
from engine.backends.cuda_graphs import capture_graph
from engine.batching import DECODE_BATCHES
from engine.errors import GenerationError, ModelFormatError
from engine.families.orpheus import grammar as g
from engine.families.orpheus.checkpoint import SNAC_CONFIG, SNAC_WEIGHTS, SnacConfig, read_snac_config
from engine.seams import seam_error_db

IGNORED_KEYS = re.compile(r"encoder\..*|quantizer\.quantizers\.\d+\.in_proj\..*")
"""Checkpoint tensors the decoder never uses, and the only ones it may leave unread: the encoder, and each
quantizer's input projection (audio -> code space, an encoding step)."""


# ------------------------------------------------------------------------------------------------ the network

def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The periodic activation: x + sin²(αx)/α, per channel (the 1e-9 keeps α = 0 finite, as the reference)."""
    return x + torch.sin(alpha * x).pow(2) * (alpha + 1e-9).reciprocal()


class Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha)


class Noise(nn.Module):
    """Adds noise(t) · (W x)(t) with one standard-normal value per time step, shared by all channels."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        return x if noise is None else x + noise * self.linear(x)


class Residual(nn.Module):
    """Snake, dilated k7 conv, snake, 1x1 conv, added to the input (lengths are kept by padding)."""

    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(Snake(dim), nn.Conv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation,
                                                         groups=groups), Snake(dim), nn.Conv1d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class UpBlock(nn.Module):
    """Snake, transposed conv upsampling by `stride` (exactly T·stride out), noise, three residual units."""

    def __init__(self, dim_in: int, dim_out: int, stride: int, noise: bool, depthwise: bool) -> None:
        super().__init__()
        groups = dim_out if depthwise else 1
        layers: list[nn.Module] = [
            Snake(dim_in),
            nn.ConvTranspose1d(dim_in, dim_out, 2 * stride, stride=stride, padding=math.ceil(stride / 2),
                               output_padding=stride % 2)]
        if noise:
            layers.append(Noise(dim_out))
        layers += [Residual(dim_out, d, groups) for d in (1, 3, 9)]
        self.block = nn.Sequential(*layers)
        self.stride = stride

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, noise) if isinstance(layer, Noise) else layer(x)
        return x


class Lookup(nn.Module):
    """One level's code -> latent: codebook row, 1x1 projection, repeated `stride` times in time."""

    def __init__(self, cfg: SnacConfig, stride: int) -> None:
        super().__init__()
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.latent_dim, 1)
        self.stride = stride

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.out_proj(self.codebook(codes).transpose(1, 2))
        return z.repeat_interleave(self.stride, dim=-1)


class _Quantizer(nn.Module):
    def __init__(self, cfg: SnacConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(Lookup(cfg, s) for s in cfg.vq_strides)


class _Decoder(nn.Module):
    def __init__(self, cfg: SnacConfig) -> None:
        super().__init__()
        lat, dim = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [nn.Conv1d(lat, lat, 7, padding=3, groups=lat), nn.Conv1d(lat, dim, 1)]
        else:
            layers = [nn.Conv1d(lat, dim, 7, padding=3)]
        for i, stride in enumerate(cfg.decoder_rates):
            layers.append(UpBlock(dim >> i, dim >> (i + 1), stride, cfg.noise, cfg.depthwise))
        out = dim >> len(cfg.decoder_rates)
        layers += [Snake(out), nn.Conv1d(out, 1, 7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)


class SnacNet(nn.Module):
    """SNAC's decode path, with submodule names that match the checkpoint's (weight norm folded)."""

    def __init__(self, cfg: SnacConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = _Quantizer(cfg)
        self.decoder = _Decoder(cfg)

    def latent(self, levels: Sequence[torch.Tensor]) -> torch.Tensor:
        """Code rows (B, n), (B, 2n), (B, 4n) -> their levels' latents summed, (B, latent_dim, 4n)."""
        return sum(q(c) for q, c in zip(self.quantizer.quantizers, levels))

    def forward(self, levels: Sequence[torch.Tensor], starts: torch.Tensor, seed: int | None) -> torch.Tensor:
        """Code rows (B, n), (B, 2n), (B, 4n) + each row's first frame in the sentence -> (B, n·2048) audio.
        `seed` None: no noise (the decoder as if built with noise=False)."""
        x = self.latent(levels)
        pos = starts.to(x.device) * self.cfg.vq_strides[0]  # latent steps before each window
        for block_index, layer in enumerate(self.decoder.model):
            if isinstance(layer, UpBlock):
                pos = pos * layer.stride
                steps = x.shape[-1] * layer.stride
                noise = None if seed is None else position_noise(seed, block_index, pos, steps, x.dtype)
                x = layer(x, noise)
            else:
                x = layer(x)
        return x[:, 0]


# --------------------------------------------------------------------------------------------- position noise

_MASK = 0xFFFFFFFF
_MIX = 0x45D9F3B
"""Multiplier of a well-mixing 32-bit integer hash; below 2**31, so products of 32-bit values stay in int64."""


def _mix32_int(x: int) -> int:
    """_mix32 of one Python int (a key computed on the host: no tensor, so graph capture copies nothing)."""
    x &= _MASK
    x = (((x >> 16) ^ x) * _MIX) & _MASK
    x = (((x >> 16) ^ x) * _MIX) & _MASK
    return (x >> 16) ^ x


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanche hash of int64 tensors holding 32-bit values (no overflow: every product is < 2**59)."""
    x = x & _MASK
    x = (((x >> 16) ^ x) * _MIX) & _MASK
    x = (((x >> 16) ^ x) * _MIX) & _MASK
    return (x >> 16) ^ x


def position_noise(seed: int, block: int, starts: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """Standard-normal noise (B, 1, steps) for time steps starts[b] .. starts[b] + steps - 1 of decoder layer
    `block`: a pure function of (seed, block, absolute step), drawn by hashing and Box-Muller."""
    pos = starts.reshape(-1, 1).long() + torch.arange(steps, device=starts.device)
    key = _mix32_int((seed * 0x9E3779B1 + block * 0x85EBCA77) & _MASK)
    h = _mix32(pos ^ key)
    # two independent 24-bit uniforms in (0, 1) from one hash chain: exact in float32
    u1 = ((h >> 8).float() + 0.5) * 2.0 ** -24
    u2 = ((_mix32(h ^ 0x68E31DA4) >> 8).float() + 0.5) * 2.0 ** -24
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.to(dtype).unsqueeze(1)


# ---------------------------------------------------------------------------------------------------- loading

def load_snac(snac_dir: str | Path, *, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> SnacNet:
    """Our SnacNet from `snac_dir` (config.json + pytorch_model.bin), strictly: every decoder tensor must be in
    the file with its shape, and the file may hold nothing else but IGNORED_KEYS. Eval mode, no gradients."""
    snac_dir = Path(snac_dir)
    cfg = read_snac_config(snac_dir / SNAC_CONFIG)
    with torch.device("meta"):
        net = SnacNet(cfg)
    state = read_state(snac_dir / SNAC_WEIGHTS, net)
    net.load_state_dict(state, strict=True, assign=True)
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


def read_state(path: Path, net: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors for every key of `net` from a plain-tensor pickle, weight norm folded (fp32).

    Weight-normed convolutions may be stored as `parametrizations.weight.original0/1` (current torch, and the
    release) or the legacy `weight_g`/`weight_v`. ModelFormatError (one line) for a file that is not a plain tensor
    pickle, a missing tensor, a wrong shape, or any tensor the decoder does not use outside IGNORED_KEYS.
    """
    raw = _load_tensors(path)
    used: set[str] = set()
    state: dict[str, torch.Tensor] = {}
    for key, ref in net.state_dict().items():
        shape = tuple(ref.shape)
        stem = key[: -len("weight")] if key.endswith("weight") else None
        pair = _weight_norm_pair(stem, raw) if stem is not None else None
        if pair is not None:
            g_key, v_key = pair
            v = _take(path, raw, v_key, shape)
            gain = _take(path, raw, g_key, (shape[0],) + (1,) * (len(shape) - 1))
            state[key] = fold_weight_norm(gain, v)
            used.update(pair)
        else:
            state[key] = _take(path, raw, key, shape).float()
            used.add(key)
    extra = sorted(k for k in raw if k not in used and not IGNORED_KEYS.fullmatch(k))
    if extra:
        raise ModelFormatError(f"{path}: unexpected tensor {extra[0]} ({len(extra)} unused outside the encoder); "
                               f"the file does not match its config.json")
    return state


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelFormatError(f"{path}: missing (expected the SNAC weights)")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # the weights-only loader met something other than plain tensors
        found = re.search(r"WeightsUnpickler error:\s*(.+)", str(err))
        reason = found.group(1).strip() if found else (str(err).strip().splitlines() or ["?"])[0]
        raise ModelFormatError(f"{path}: refused, not a plain tensor file (the weights-only loader stopped at: "
                               f"{reason[:160]}); only a saved state dict of tensors loads") from None
    except Exception as err:  # zip framing and I/O errors come in several types
        first = (str(err).strip().splitlines() or [""])[0]
        raise ModelFormatError(f"{path}: not a readable torch weights file ({type(err).__name__}: "
                               f"{first[:160]})") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in raw.items()):
        raise ModelFormatError(f"{path}: expected a state dict of name -> tensor, found {type(raw).__name__}")
    return raw


def _weight_norm_pair(stem: str, raw: dict[str, torch.Tensor]) -> tuple[str, str] | None:
    for g_key, v_key in ((f"{stem}parametrizations.weight.original0", f"{stem}parametrizations.weight.original1"),
                         (f"{stem}weight_g", f"{stem}weight_v")):
        if g_key in raw or v_key in raw:
            return g_key, v_key
    return None


def _take(path: Path, raw: dict[str, torch.Tensor], key: str, shape: tuple[int, ...]) -> torch.Tensor:
    if key not in raw:
        raise ModelFormatError(f"{path}: missing tensor {key} (expected shape {list(shape)})")
    if tuple(raw[key].shape) != shape:
        raise ModelFormatError(f"{path}: tensor {key} has shape {list(raw[key].shape)}, expected {list(shape)}")
    return raw[key]


def fold_weight_norm(gain: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """gain · v / ‖v‖, the norm over every dim but the first (weight norm's default), in fp32."""
    v = v.float()
    norm = v.flatten(1).norm(dim=1).reshape((-1,) + (1,) * (v.dim() - 1))
    return gain.float() * v / norm


# ----------------------------------------------------------------------------------------------- the decoder


class SnacDecoder:
    """CodecDecoder over our SNAC: one "code" is one 7-token frame (2048 samples at 24 kHz).

    Items of equal length decode in one batch. An item's `start` (its place in the sentence) keys the
    noise, so windows of one sentence agree with its one-shot decode; `seed` picks the noise, `noise=False`
    leaves it out. `global_tokens` is ignored (Orpheus has no speaker codes).
    """

    def __init__(self, snac_dir: str | Path, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0, noise: bool = True, max_batch: int = 16) -> None:
        self.net = load_snac(snac_dir, device=device, dtype=dtype)
        self.weights_path = Path(snac_dir) / SNAC_WEIGHTS
        """The weights decoded with, named when they turn out broken (non-finite audio)."""
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed if noise and self.net.cfg.noise else None
        """The noise seed, or None when no noise is added."""
        self.sample_rate: int = self.net.cfg.sample_rate
        self.samples_per_code: int = self.net.cfg.samples_per_frame
        self.max_batch = max(max_batch, max(DECODE_BATCHES)) if self.device.type == "cuda" else max_batch
        self.batch_limit = max(DECODE_BATCHES) if self.device.type == "cuda" else 16
        """Most windows worth handing over in one decode() call."""
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        """On a GPU the decoder's own stream: the legacy default stream would wait for (and hold up) the LLM's."""
        self.graphs: dict[tuple[int, int], tuple[Any, list[torch.Tensor], torch.Tensor, torch.Tensor]] = {}
        """CUDA graphs by (batch, frames): the window's codes and start in static inputs, its audio out."""
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.aside: Any = None
        """The stream background captures run on (engine.backends.cuda_graphs; created by the first)."""
        self.fixed_shapes = self.device.type == "cuda"
        """On a GPU windows are widened to the schedule's standard lengths and replay a captured graph (eager SNAC
        is hundreds of small kernels a window, launched from Python beside the LLM's thread)."""

    def decode(self, items: Sequence[DecodeItem]) -> list[np.ndarray]:
        """Audio of each item's kept frames: float32, (keep_stop - keep_start) · 2048 samples."""
        spans = [self._check(item) for item in items]
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(items)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            if spans[i][1] > spans[i][0]:
                groups[len(item.codes)].append(i)
        spf = self.samples_per_code
        with torch.inference_mode():
            for group in groups.values():
                for at in range(0, len(group), self.max_batch):
                    batch = group[at: at + self.max_batch]
                    audio = self._require_finite(self._forward([items[i] for i in batch]))
                    for row, i in enumerate(batch):
                        start, stop = spans[i]
                        out[i] = np.ascontiguousarray(audio[row, start * spf: stop * spf])
        return out

    def warmup(self, lengths: Sequence[int], batches: Sequence[int] = (), background: bool = False) -> float:
        """Capture a graph for each window length and batch (GPU only; each batch rounded up to DECODE_BATCHES).
        `background`: from a serving engine's tuning thread (engine.backends.cuda_graphs). Returns the seconds it
        took."""
        if self.stream is None:
            return 0.0
        t0 = time.perf_counter()
        for batch in sorted({next((b for b in DECODE_BATCHES if b >= n), DECODE_BATCHES[-1]) for n in batches} or
                            {DECODE_BATCHES[0]}):
            for length in lengths:
                self._capture(batch, length, background)
        return time.perf_counter() - t0

    def _capture(self, batch: int, length: int, background: bool) -> None:
        if (batch, length) in self.graphs:
            return
        if self.stream is None:
            raise RuntimeError("CUDA graphs are captured on a GPU only")
        if background and self.aside is None:
            self.aside = torch.cuda.Stream(self.device)
        sizes = [length * k for k in (1, 2, 4)]  # frames' codes at levels 0, 1, 2
        levels = [torch.zeros((batch, n), dtype=torch.long, device=self.device) for n in sizes]
        starts = torch.zeros(batch, dtype=torch.long, device=self.device)
        graph, out = capture_graph(lambda: self.net(levels, starts, self.seed), pool=self.pool,
                                   stream=self.aside if background else self.stream, background=background)
        self.graphs[(batch, length)] = (graph, levels, starts, out)

    def _forward(self, items: Sequence[DecodeItem]) -> np.ndarray:
        rows = [g.split_levels(item.codes) for item in items]
        levels = [torch.tensor([r[level] for r in rows], dtype=torch.long) for level in range(3)]
        starts = torch.tensor([item.start for item in items], dtype=torch.long)
        if self.stream is None:
            return self.net(levels, starts, self.seed).float().numpy()
        with torch.cuda.stream(self.stream):
            out = self._replay(levels, starts)
            if out is None:
                out = self.net([x.to(self.device, non_blocking=True) for x in levels],
                               starts.to(self.device, non_blocking=True), self.seed)
            audio = out.float().cpu()  # waits for this stream only
        return audio.numpy()

    def _replay(self, levels: list[torch.Tensor], starts: torch.Tensor) -> torch.Tensor | None:
        """The captured graph for this batch (rounded up) and length, its inputs filled; None where none fits.
        Rows past the batch hold stale codes: rows are independent, and their audio is cut off."""
        b, n = levels[0].shape
        bucket = next((x for x in DECODE_BATCHES if x >= b and (x, n) in self.graphs), None)
        if bucket is None:
            return None
        graph, level_in, starts_in, out = self.graphs[(bucket, n)]
        for dst, src in zip(level_in, levels):
            dst[:b].copy_(src, non_blocking=True)
        starts_in[:b].copy_(starts, non_blocking=True)
        graph.replay()
        return out[:b]

    def _require_finite(self, audio: np.ndarray) -> np.ndarray:
        if not np.isfinite(audio).all():
            raise GenerationError(f"the SNAC decoder produced non-finite audio (NaN/inf): the weights in "
                                  f"{self.weights_path} are broken; download the checkpoint again")
        return audio

    def _check(self, item: DecodeItem) -> tuple[int, int]:
        n = len(item.codes)
        stop = n if item.keep_stop is None else item.keep_stop
        if not 0 <= item.keep_start <= stop <= n:
            raise ValueError(f"keep range [{item.keep_start}, {item.keep_stop}) outside {n} frames")
        for frame in item.codes:
            if len(frame) != g.FRAME_TOKENS or not all(0 <= c < g.CODEBOOK for c in frame):
                raise ValueError(f"each frame must be {g.FRAME_TOKENS} codes in 0..{g.CODEBOOK - 1}, got {frame!r}")
        if item.start + item.keep_start < 0:
            raise ValueError(f"a window cannot keep frames before the sentence (start {item.start})")
        return item.keep_start, stop


# --------------------------------------------------------------------------------------- receptive field

def context_windows(frames: Sequence[Sequence[int]], *, new: int, left: int, right: int) -> list[DecodeItem]:
    """`frames` cut into windows of `new` kept frames with up to `left`/`right` frames of context (clamped at the
    ends), each knowing its start. Hard cuts, no crossfade: the seam error then measures the receptive field."""
    frames = tuple(tuple(f) for f in frames)
    n = len(frames)
    items = []
    for start in range(0, n, new):
        lo, hi = max(0, start - left), min(n, start + new + right)
        items.append(DecodeItem(frames[lo:hi], (), keep_start=start - lo, keep_stop=min(start + new, n) - lo,
                              start=lo))
    return items


def measure_context_table(decoder: SnacDecoder, frames: Sequence[Sequence[int]], contexts: Sequence[int],
                          new: int = 4, side: str = "both", other: int = 8) -> dict[int, float]:
    """Seam error (dB, engine.seams) of window-by-window vs one-shot decoding, per context in frames. `side`:
    "both" varies left and right together; "left"/"right" varies one while the other stays at `other`."""
    full = decoder.decode([DecodeItem(tuple(tuple(f) for f in frames), ())])[0]
    table = {}
    for ctx in contexts:
        left = ctx if side in ("both", "left") else other
        right = ctx if side in ("both", "right") else other
        pieces = decoder.decode(context_windows(frames, new=new, left=left, right=right))
        table[ctx] = seam_error_db(np.concatenate(pieces), full)
    return table


def fewest_context(table: dict[int, float], target_db: float = -40.0, side: str = "") -> int:
    """The fewest frames of context from which every larger one in `table` stays below `target_db`."""
    need = None
    for ctx in sorted(table, reverse=True):
        if table[ctx] >= target_db:
            break
        need = ctx
    if need is None:
        raise ValueError(f"no {side} context in {sorted(table)} frames reaches {target_db} dB: {table}")
    return need
