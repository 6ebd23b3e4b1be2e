"""Provides the Snake activation (x + sin²(αx)/α) as one Triton kernel on CUDA: one read and one write of the
activation instead of the five elementwise passes eager PyTorch makes.

BiCodec's wave generator runs Snake twice per residual unit on tensors of channels × 320 samples per code, so
on the GPU these passes are memory traffic, not arithmetic. Used only for CUDA fp32/bf16 inference on contiguous
tensors; everything else (CPU, autograd) keeps the eager formula in bicodec_modules.Snake. Triton ships with
PyTorch's CUDA wheels; without it `available()` is False and nothing changes.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

BLOCK = 1024
"""Elements per program: a multiple of the warp size large enough to keep loads coalesced."""
MAX_ELEMENTS = 2**31 - BLOCK
"""The kernel indexes with int32 offsets (last block included); larger tensors stay eager (a batch of 64 windows of
15 s is ~1.5e9 elements at the widest layer, so only far larger batches get there)."""

@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    """The compiled kernel, or None when Triton (or its libdevice sin) is missing."""
    try:
        from engine.backends._snake_triton import snake_kernel
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return snake_kernel


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """CUDA and the kernel are both there (asked once per process: usable() runs for every eager Snake)."""
    return torch.cuda.is_available() and _kernel() is not None


def usable(x: torch.Tensor, alpha: torch.Tensor) -> bool:
    """True when `fused_snake` may replace the eager formula for this call."""
    return (x.is_cuda and x.dim() == 3 and x.is_contiguous() and x.dtype in (torch.float32,
            torch.float16, torch.bfloat16) and alpha.numel() == x.shape[1] and x.numel() < MAX_ELEMENTS
            and not torch.is_grad_enabled() and available())


def fused_snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """x + sin²(αx)/α for x of shape (B, C, T) and a per-channel α (C values), computed in fp32."""
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _kernel()[(-(-n // BLOCK),)](x, alpha.reshape(-1).contiguous(), out, n, x.shape[1], x.shape[2], block=BLOCK)
    return out
