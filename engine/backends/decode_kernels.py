"""Provides the graph lane's fused decode kernels: the small work around a decode step's GEMMs in fewer launches.

Why: a decode step of Spark's 0.5B LLM on an H200 was 449 kernels taking 1.03 ms, of which reading the weights
would take ~0.2 ms at the memory's speed (docs/benchmarks.md, lane profile). A step of a few rows is made of
its kernels' count and each one's floor (~4 us for any GEMM reading from memory, cuBLAS's included), not of
arithmetic. So:

- `rope_store`: rotary embedding of queries and keys, keys and values written into the rows' cache (one kernel
  for three, and no copy-back of the cache);
- `attend`: grouped-query attention over each row's own length (online softmax, one pass: one kernel for three,
  and no span bucket to pad to);
- `matmul` / `add_matmul`: a residual add and rms_norm (prologue), a projection, then bias, residual add or
  SwiGLU (epilogue). Measured against cuBLAS on the H200 it wins only where it saves kernels (norm + q/k/v,
  norm + gate/up + SwiGLU, norm + head); the o and down projections stay with cuBLAS (docs/benchmarks.md, fused
  decode kernels).

Used on CUDA for decode steps of up to graph_gen.FUSE_ROWS rows, and by the unit tests under Triton's CPU
interpreter. Triton ships with PyTorch's CUDA wheels; without it `available()` is False and StaticQwen2 keeps its
plain tensor code.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

MAX_ROWS = 16
"""Rows one `matmul` program covers (tl.dot's smallest tile); more rows take more programs, each reading the
weights again."""
ATTEND_BLOCK, ATTEND_WARPS, ATTEND_STAGES = 256, 4, 2
"""Cache positions per attention iteration, warps, pipelining depth: the fastest of 24 (H200, one layer of one row
at position 250: 3.5 us against 4.4 for 64 positions and 11.7 for the tensor code's three kernels; at position
900: 8.8, 11.9 and 14.9 us; scripts/decode_kernels_probe.py)."""


@dataclass(frozen=True, slots=True)
class Tiling:
    """How `matmul` cuts one projection: BLOCK_N output columns per program, BLOCK_K of the reduction per
    iteration."""

    block_n: int = 64
    block_k: int = 256
    warps: int = 4
    stages: int = 3


DEFAULT_TILING = Tiling()
TILINGS = {"qkv": Tiling(block_n=16, block_k=256), "gate_up": Tiling(block_n=64, block_k=256),
           "head": Tiling(block_n=64, block_k=256)}
"""The fastest of 12 tilings for each (H200, one row, scripts/decode_kernels_probe.py --sweep), and why each
projection is ours rather than cuBLAS's: norm + q/k/v + bias 5.7 us against cuBLAS's GEMM 4.2 us plus a 2.4 us
norm kernel and the 0.8 us copy its residual addmm needs; norm + gate/up + SwiGLU 9.3 us against 7.3 us plus a
norm and a SwiGLU kernel; norm + head 8.1 us against 6.6 us plus a norm. Long K runs (256) per iteration were
the best for every projection. The o and down projections stay cuBLAS GEMMs (4.1 and 7.8 us, ours 4.6 and 8.7)
whose residual add rides in the next kernel's prologue."""


def interpreting() -> bool:
    """Whether Triton runs on its CPU interpreter (TRITON_INTERPRET=1: the unit tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=1)
def _kernels() -> ModuleType | None:
    try:
        from engine.backends import _decode_triton
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return _decode_triton


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Triton is importable and there is a device it can run on (CUDA, or the CPU interpreter)."""
    return _kernels() is not None and (torch.cuda.is_available() or interpreting())


def supports(head_dim: int) -> bool:
    """Whether the attention kernels take this head size (a power of two, at least tl.dot's 16)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def matmul(x: torch.Tensor, w: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 0.0,
           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, swiglu: bool = False,
           out_dtype: torch.dtype | None = None, tiling: Tiling = DEFAULT_TILING) -> torch.Tensor:
    """epilogue(rms_norm(x, norm) @ w) for x [M, K] and w [K, N] (contiguous): + bias [N], + residual [M, N], or
    with `swiglu` (w [K, 2N]: gate then up) silu(gate) * up. Output [M, N] in `out_dtype` (default x's)."""
    return _launch(x, None, w, norm=norm, eps=eps, bias=bias, residual=residual, swiglu=swiglu, out_dtype=out_dtype,
                   tiling=tiling)[0]


def add_matmul(x: torch.Tensor, add: torch.Tensor, w: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`matmul` of x + add (a residual add taken into the same kernel), and x + add itself (the residual stream
    from here on). Keywords as `matmul`'s (an unknown one is a TypeError)."""
    return _launch(x, add, w, **kw)


def _launch(x: torch.Tensor, add: torch.Tensor | None, w: torch.Tensor, *, norm: torch.Tensor | None = None,
            eps: float = 0.0, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
            swiglu: bool = False, out_dtype: torch.dtype | None = None,
            tiling: Tiling = DEFAULT_TILING) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    n = w.shape[1] // 2 if swiglu else w.shape[1]
    _need_unit_stride(w, norm, bias)
    x = x.contiguous()
    tiling = _for_width(tiling, w.element_size())
    out = torch.empty((m, n), device=x.device, dtype=out_dtype or x.dtype)
    total = torch.empty_like(x) if add is not None else x
    _kernels().matmul_kernel[(-(-n // tiling.block_n), -(-m // MAX_ROWS))](
        x, add.contiguous() if add is not None else x, total, w, out, norm if norm is not None else x,
        bias if bias is not None else x, residual.contiguous() if residual is not None else x, m, n, k, w.stride(0),
        eps, HAS_ADD=add is not None, HAS_NORM=norm is not None, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, SWIGLU=swiglu, UPCAST=interpreting(), BLOCK_M=MAX_ROWS,
        BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k, num_warps=tiling.warps, num_stages=tiling.stages)
    return out, total


def _need_unit_stride(*tensors: torch.Tensor | None) -> None:
    """The kernels step through a weight's columns, a vector or a table's rows one element at a time: a strided
    view would be read as garbage, so it is refused (host-side, before any launch or capture)."""
    for t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"decode kernels need contiguous tensors, got strides {t.stride()} for {tuple(t.shape)}")


def _for_width(tiling: Tiling, size: int) -> Tiling:
    """The tiling for weights of `size` bytes: the tables are for bf16; fp32 (tests) takes half the K run and two
    stages, or gate/up's tiles would need 346 kB of shared memory (an H200 has 227 kB)."""
    return tiling if size <= 2 else Tiling(tiling.block_n, tiling.block_k // 2, tiling.warps, min(tiling.stages, 2))


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int,
               head_dim: int) -> torch.Tensor:
    """Rotated queries [M, heads * D] from projections qkv [M, (heads + 2 kv) * D] (contiguous); each row's
    rotated key and its value go into k_cache / v_cache [rows >= M, kv, L, D] at positions[row]. `cos` and `sin`
    are [L, D] tables (sin with rotate-half's sign folded in)."""
    m = qkv.shape[0]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or k_cache.stride(-2) != head_dim:
        raise ValueError("keys and values need the same layout, positions of D contiguous values")
    _need_unit_stride(qkv, cos, sin, positions)
    q = torch.empty((m, heads * head_dim), device=qkv.device, dtype=qkv.dtype)
    _kernels().rope_store_kernel[(m, heads + 2 * kv_heads)](
        qkv, cos, sin, positions, q, k_cache, v_cache, qkv.stride(0), k_cache.stride(0), k_cache.stride(1),
        HEADS=heads, KV=kv_heads, D=head_dim, num_warps=1)
    return q


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, kv_heads: int,
           head_dim: int, block: int = ATTEND_BLOCK, warps: int = ATTEND_WARPS,
           stages: int = ATTEND_STAGES) -> torch.Tensor:
    """Attention output [M, heads * D] for queries q [M, heads * D] (query head h reads kv head h // G) over each
    row's cache positions <= positions[row]."""
    m, width = q.shape
    group = width // head_dim // kv_heads
    _need_unit_stride(q, positions)
    if k_cache.stride(-1) != 1 or k_cache.stride(-2) != head_dim or k_cache.stride() != v_cache.stride():
        raise ValueError("keys and values need the same layout, positions of D contiguous values")
    if q.element_size() > 2:  # fp32 (tests): half the positions per iteration, for shared memory (_for_width)
        block, stages = block // 2, min(stages, 2)
    out = torch.empty_like(q)
    _kernels().attend_kernel[(m, kv_heads)](
        q, k_cache, v_cache, positions, out, head_dim ** -0.5, k_cache.stride(0), k_cache.stride(1), G=group,
        BLOCK_G=max(16, 1 << (group - 1).bit_length()), D=head_dim, BLOCK_S=block, UPCAST=interpreting(),
        num_warps=warps, num_stages=stages)
    return out
