"""Provides the graph lane's fused decode kernels: the small work around a decode step's GEMMs in fewer launches.

Why: a decode step of Spark's 0.5B LLM was hundreds of small kernels taking several times what reading its
weights at the memory's speed would. A step of a few rows is made of its kernels' count
and each one's floor (any GEMM reading from memory has one, cuBLAS's included), not of arithmetic. So:

- `rope_attend`: rotary embedding of queries and keys, the new keys and values written into the rows' cache, and
  grouped-query attention over each row's own length (online softmax: no span bucket to pad to), optionally in
  chunks of positions merged by the last program; `rope_store` + `attend` do it in two kernels;
- `matmul` / `add_matmul`: a residual add and rms_norm (prologue), a projection reading [K, N] or [N, K] weights,
  then bias, residual add or SwiGLU (epilogue); K optionally split over programs, the last of each output block
  summing the splits (no reduce kernel);
- on sm90+, each kernel is launched while the one before it runs (programmatic dependent launch).

`FusedPlan` picks among these; `PLAN` is the fastest, faster than the first fused step and than the compiled
tensor code.

Used on CUDA for decode steps of up to lane_runner.FUSE_ROWS rows, and by the unit tests under Triton's CPU
interpreter. Triton ships with PyTorch's CUDA wheels; without it `available()` is False and StaticQwen2 keeps its
plain tensor code.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch

MAX_ROWS = 16
"""Rows one `matmul` program covers (tl.dot's smallest tile); more rows take more programs, each reading the
weights again."""
ATTEND_BLOCK, ATTEND_WARPS, ATTEND_STAGES = 256, 4, 2
"""Cache positions per attention iteration, warps, pipelining depth: the fastest of those `lab/decode_kernels_probe.py`
tried, ahead of smaller blocks and of the tensor code's three kernels at short and long positions alike."""


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
           "head": Tiling(block_n=64, block_k=256),
           "o": Tiling(block_n=16, block_k=256), "o_split": Tiling(block_n=32, block_k=128),
           "down": Tiling(block_n=16, block_k=256), "down_split": Tiling(block_n=32, block_k=256)}
"""The fastest tiling for each projection (`lab/decode_kernels_probe.py --sweep`). q/k/v, gate/up and the head are
ours rather than cuBLAS's because one kernel with the norm in its prologue and the bias, SwiGLU or residual in its
epilogue beats cuBLAS's faster GEMM plus the small kernels around it. Long K runs (256) per iteration were the
best for every projection. The o and down projections stay cuBLAS GEMMs (alone, cuBLAS's are faster than ours)
whose residual add rides in the next kernel's prologue. Gate/up's 64 columns make fewer programs than a large GPU
has SMs; grids matched to the SMs (fewer columns a program, masked in the tile) are slower."""
PRELOAD_TILINGS = {"qkv": Tiling(block_n=16), "o": Tiling(block_n=16), "o_split": Tiling(block_n=16, block_k=128),
                   "gate_up": Tiling(block_n=16, warps=8), "down": Tiling(block_n=16, warps=8),
                   "down_split": Tiling(block_n=32, block_k=64, warps=8), "head": Tiling(block_n=32, warps=8)}
"""The tilings of a projection in `FusedPlan.preload` at up to PRELOAD_ROWS rows, whose programs hold their whole
weight slice in registers (narrow blocks; block_k only sets where K is split). q/k/v and o as tried in a two-row
lane (`lab/decode_kernels_probe.py --lanes`): 16 columns a program, faster than 32 columns or 8 warps, and for
q/k/v about as fast as 8."""


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


def _loaded() -> ModuleType:
    """The kernels' module, where `available` said yes."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("the Triton decode kernels are not available (decode_kernels.available() is False)")
    return kernels


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Triton is importable and there is a device it can run on (CUDA, or the CPU interpreter)."""
    return _kernels() is not None and (torch.cuda.is_available() or interpreting())


def supports(head_dim: int) -> bool:
    """Whether the attention kernels take this head size (a power of two, at least tl.dot's 16)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


FUSED_MAX_HIDDEN = 1024
"""Largest hidden size whose decode steps run the fused kernels by default. A small model's step is made of its
kernels' count and floors, which the fusion removes; a large model's is made of reading its weights, which cuBLAS
does faster than `matmul` (Llama-3B's step ran faster as tensor code at every row count; docs/orpheus.md)."""


def pays_for(hidden: int) -> bool:
    """Whether the fused step is the faster default for a model of this hidden size (FUSED_MAX_HIDDEN)."""
    return hidden <= FUSED_MAX_HIDDEN


@dataclass(frozen=True, slots=True)
class FusedPlan:
    """Which variant of the fused decode step runs (`lab/decode_kernels_probe.py --plans` times each against the
    others in one process)."""

    pdl: bool = False
    """Programmatic dependent launch between our kernels (sm90+): each is launched while the one before it runs,
    and waits for it on the GPU."""
    k_major: bool = False
    """Our projections read weights stored [N, K] (each program's output columns are whole rows of K contiguous
    values) rather than [K, N] (rows of BLOCK_N values, N apart)."""
    rope_in_attention: bool = False
    """The rotary embedding and the cache write in the attention kernel (`rope_attend`: no `rope_store`)."""
    attend_chunk: int = 0
    """Cache positions per attention program (0: one program per row and kv head), merged by the last
    (`attend`)."""
    o_split: int = 0
    """The o projection: 0 for cuBLAS, n >= 1 for `matmul` with K split n ways (summed by each output block's
    last program: no reduce kernel)."""
    down_split: int = 0
    """The down projection, likewise."""
    one_sample: bool = False
    """The lane's sampling and bookkeeping after the head in one kernel (`sample`) instead of ~20 small ones."""
    sample_topk: bool = False
    """`sample` selects with Triton's bitonic top-k instead of full sorts (where this Triton has `tl.topk`)."""
    preload: tuple[str, ...] = ()
    """Projections ("qkv", "o", "gate_up", "down", "head") whose programs read their whole weight slice before
    they wait for the kernel before them, at up to PRELOAD_ROWS rows (with `pdl`, that read overlaps the previous
    kernel; PRELOAD_TILINGS)."""
    attend_preload: bool = False
    """The attention kernel (rope_in_attention, attend_chunk) reads its chunk of the cache before it waits for the
    q/k/v projection, so that the read overlaps it; the new key and value take their place in the tile. It
    shortens attention's share of the step's critical path and so the lane's step, with the same logits."""
    late_sum: bool = False
    """The split-K down projection leaves its fp32 partials to the next layer's q/k/v kernel where that preloads
    (`preloads`) at up to LATE_SUM_ROWS rows, which sums them in its prologue while it adds the residual, in split
    order as the last program of each output block would have: the same values, without two dependent memory
    round trips (the counter, then the partials). Not the o projection (gate/up's looped tiles with four fp32
    partials need 281 kB of shared memory at three stages, and at two stages gate/up is slower by more than the
    sum saves), nor the looped q/k/v (265 kB of shared memory for seven fp32 partials) or the head (296 kB):
    their partials are summed in place. (Gate/up's programs summing o's partials once into rows of their own, then
    looping over those, is bit-exact but no faster.)"""

    def __post_init__(self) -> None:
        if self.attend_preload and not (self.rope_in_attention and self.attend_chunk):
            raise ValueError("FusedPlan.attend_preload needs rope_in_attention and attend_chunk")

    def preload_tiling(self, name: str) -> Tiling | None:
        """The preloading tiling of projection `name` (a TILINGS key: "down_split" is a "down"), or None where this
        plan does not preload it."""
        return PRELOAD_TILINGS[name] if name.removesuffix("_split") in self.preload else None


PLAN = FusedPlan(pdl=True, k_major=True, rope_in_attention=True, attend_chunk=256, o_split=4, down_split=8,
                 one_sample=True, sample_topk=True, preload=("qkv", "o"), late_sum=True, attend_preload=True)
"""The variant the graph lane runs where it can (`plan_for`): the fastest of those timed in one process, each
choice faster than going without it: o and down split over programs, 256-position
attention chunks (which count at long positions) and the rotary embedding in the attention kernel. The q/k/v and o
projections read their weights before they wait (`preload`); preloading gate/up, down and the head too was
slower: their slices are large, so fewer programs fit beside the kernel they overlap. Costs a second, [N, K] copy
of the layers' projections (0.7 GB for Spark's LLM): the tensor code keeps reading [K, N]. The down projection's
partials are summed by the next layer's q/k/v (`late_sum`; splitting down 4 or 16 ways was no better than 8), and
the attention reads its chunk of the cache before it waits (`attend_preload`)."""


def plan_for(plan: FusedPlan = PLAN) -> FusedPlan:
    """`plan` less what this GPU cannot run: programmatic dependent launch needs sm90+."""
    return plan if pdl_supported() else replace(plan, pdl=False)


def pdl_supported() -> bool:
    """Programmatic dependent launch is there: a Hopper-or-later GPU (not the interpreter) and a Triton with grid
    dependency control."""
    if interpreting() or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    import triton.language.extra.cuda as tl_cuda

    return hasattr(tl_cuda, "gdc_wait")


def matmul(x: torch.Tensor, w: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 0.0,
           bias: torch.Tensor | None = None, swiglu: bool = False, out_dtype: torch.dtype | None = None,
           tiling: Tiling = DEFAULT_TILING, split_k: int = 1, counts: torch.Tensor | None = None, pdl: bool = False,
           preload: Tiling | None = None, reduce: bool = True) -> torch.Tensor:
    """epilogue(rms_norm(x, norm) @ w) for x [M, K] and w [K, N] (row-major, or the transposed view of an [N, K]
    weight): + bias [N], or with `swiglu` (w [K, 2N]: gate then up) silu(gate) * up. Output
    [M, N] in `out_dtype` (default x's). split_k > 1 (no norm or SwiGLU) cuts K into that many runs of whole
    BLOCK_Ks, each its own program; the last program of each output block sums them, counting in `counts`
    (int32 zeros, one per output block, left zero). `preload`: at up to PRELOAD_ROWS rows, this tiling's programs
    each read their weights in one tile before they wait for the previous kernel (FusedPlan.preload; bf16
    weights, or any under the interpreter). `reduce=False` (split K, no bias): the programs leave their fp32
    partials, returned as [splits, M, N], for the next kernel to sum as its `add` (`add_matmul`); no counts are
    needed. Where K makes one split only, the usual [M, N] comes back. (A residual is added by the next kernel's
    `add`, not in this one's epilogue.)"""
    return _launch(x, None, w, norm=norm, eps=eps, bias=bias, swiglu=swiglu, out_dtype=out_dtype, tiling=tiling,
                   split_k=split_k, counts=counts, pdl=pdl, preload=preload, reduce=reduce)[0]


def add_matmul(x: torch.Tensor, add: torch.Tensor, w: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`matmul` of x + add (a residual add taken into the same kernel), and x + add itself (the residual stream
    from here on). `add` is [M, K] in x's dtype or, where this projection preloads, the fp32 partials [splits, M,
    K] of a `matmul(reduce=False)`, summed here as that kernel would have. Keywords as `matmul`'s (an unknown one
    is a TypeError)."""
    return _launch(x, add, w, **kw)


def _launch(x: torch.Tensor, add: torch.Tensor | None, w: torch.Tensor, *, norm: torch.Tensor | None = None,
            eps: float = 0.0, bias: torch.Tensor | None = None, swiglu: bool = False, out_dtype: torch.dtype | None = None, tiling: Tiling = DEFAULT_TILING,
            split_k: int = 1, counts: torch.Tensor | None = None, pdl: bool = False,
            preload: Tiling | None = None, reduce: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    add_parts = _add_parts(add, x)
    n = w.shape[1] // 2 if swiglu else w.shape[1]
    _need_unit_stride(norm, bias)
    _need_weight_layout(w)
    x = x.contiguous()
    preloading = preloads(preload, w, m)
    if add_parts and not preloading:
        raise ValueError("only a preloading projection sums an add of partials (a looped one's tiles of them would "
                         "not fit in shared memory)")
    tiling = preload if preload is not None and preloading else _for_width(tiling, w.element_size())
    k_split, splits = _split(k, split_k, tiling.block_k)
    grid = (-(-n // tiling.block_n), -(-m // MAX_ROWS), splits)
    if splits > 1:
        if add is not None or norm is not None or swiglu:
            raise ValueError("a split-K matmul takes no residual add, norm or SwiGLU")
        if not reduce and bias is not None:
            raise ValueError("a split-K matmul leaving its partials takes no bias")
        if reduce and (counts is None or counts.dtype != torch.int32 or counts.numel() < grid[0] * grid[1]):
            raise ValueError(f"a split-K matmul needs int32 counts for {grid[0] * grid[1]} output blocks")
    part = torch.empty((splits, m, n), device=x.device, dtype=torch.float32) if splits > 1 else x
    out = part if splits > 1 and not reduce else torch.empty((m, n), device=x.device, dtype=out_dtype or x.dtype)
    total = torch.empty_like(x) if add is not None else x
    _loaded().matmul_kernel[grid](
        x, add.contiguous() if add is not None else x, total, w, out, part,
        counts if splits > 1 and reduce else x,
        norm if norm is not None else x, bias if bias is not None else x, m, n, k, k_split, w.stride(0), w.stride(1),
        eps, HAS_ADD=add is not None, HAS_NORM=norm is not None, HAS_BIAS=bias is not None, SWIGLU=swiglu, SPLIT_K=splits, REDUCE=reduce, ADD_PARTS=add_parts, **_common(tiling, pdl),
        **_preload(preloading, k_split, m))
    return out, total


def _add_parts(add: torch.Tensor | None, x: torch.Tensor) -> int:
    """How many split-K partials `add` holds (0: it is a plain [M, K] tensor of x's dtype); a partials tensor of
    another shape or dtype is refused."""
    if add is None or add.dim() == 2:
        return 0
    if add.dim() != 3 or add.shape[1:] != x.shape or add.dtype != torch.float32:
        raise ValueError(f"an add of partials must be fp32 [splits, {x.shape[0]}, {x.shape[1]}], got {add.dtype} "
                         f"{tuple(add.shape)}")
    return add.shape[0]


PRELOAD_ROWS = 4
"""Up to this many rows a `preload` projection sums each row's products with its tile itself; more rows take the
looped tensor-core kernel (its tile of 16 rows costs the same for any few)."""
LATE_SUM_ROWS = 2
"""Up to this many rows the down projection's partials are summed by the next q/k/v kernel (FusedPlan.late_sum):
at four rows its preloading programs, holding seven partials of each row, make the lane's step slower, at one or
two faster."""


def preloads(preload: Tiling | None, w: torch.Tensor, rows: int) -> bool:
    """Whether a projection preloads: asked to, at up to PRELOAD_ROWS rows, on `_preloadable` weights."""
    return preload is not None and rows <= PRELOAD_ROWS and _preloadable(w)


def _preloadable(t: torch.Tensor) -> bool:
    """Whether a kernel may hold tiles of `t` in registers: bf16 (an fp32 model, the GPU tests', keeps the loops:
    its tiles would be twice as large and spill), or any under the interpreter."""
    return t.element_size() <= 2 or interpreting()


def _preload(preloading: bool, k_split: int, rows: int) -> dict[str, Any]:
    """PRELOAD, its tile height SPAN (rows of w per program, a power of two) and ROWS (a power of two >= rows: one
    compile per lane row bucket)."""
    if not preloading:
        return {}
    return {"PRELOAD": True, "SPAN": max(16, 1 << (k_split - 1).bit_length()), "ROWS": 1 << (rows - 1).bit_length()}


def _split(k: int, split_k: int, block_k: int) -> tuple[int, int]:
    """Rows of w per split (whole BLOCK_K runs) and the number of splits that makes."""
    runs = -(-k // block_k)
    per = -(-runs // max(1, split_k)) * block_k
    return per, -(-k // per)


def _common(tiling: Tiling, pdl: bool) -> dict[str, Any]:
    """The launch keywords every projection kernel shares."""
    return dict(UPCAST=interpreting(), PDL=pdl, BLOCK_M=MAX_ROWS, BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
                num_warps=tiling.warps, num_stages=tiling.stages, **_pdl_launch(pdl))


def _pdl_launch(pdl: bool) -> dict[str, Any]:
    return {"launch_pdl": True} if pdl else {}


def _need_unit_stride(*tensors: torch.Tensor | None) -> None:
    """The kernels step through a weight's columns, a vector or a table's rows one element at a time: a strided
    view would be read as garbage, so it is refused (host-side, before any launch or capture)."""
    for t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"decode kernels need contiguous tensors, got strides {t.stride()} for {tuple(t.shape)}")


def _need_weight_layout(w: torch.Tensor) -> None:
    """A weight [K, N] is read row-major or as the transposed view of an [N, K] weight; any other view is refused."""
    if w.dim() != 2 or 1 not in w.stride() or w.stride(0) * w.stride(1) not in (w.shape[0], w.shape[1]):
        raise ValueError(f"decode kernels need a contiguous weight or its transpose, got strides {w.stride()} for "
                         f"{tuple(w.shape)}")


def _need_cache_layout(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> None:
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or k_cache.stride(-2) != head_dim:
        raise ValueError("keys and values need the same layout, positions of D contiguous values")


def _for_width(tiling: Tiling, size: int) -> Tiling:
    """The tiling for weights of `size` bytes: the tables are for bf16; fp32 (tests) takes half the K run and two
    stages, or gate/up's tiles would need 346 kB of shared memory (sm90 has 227 kB a block)."""
    return tiling if size <= 2 else Tiling(tiling.block_n, tiling.block_k // 2, tiling.warps, min(tiling.stages, 2))


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int, head_dim: int, *,
               pdl: bool = False) -> torch.Tensor:
    """Rotated queries [M, heads * D] from projections qkv [M, (heads + 2 kv) * D] (contiguous); each row's
    rotated key and its value go into k_cache / v_cache [rows >= M, kv, L, D] at positions[row]. `cos` and `sin`
    are [L, D] tables (sin with rotate-half's sign folded in)."""
    m = qkv.shape[0]
    _need_cache_layout(k_cache, v_cache, head_dim)
    _need_unit_stride(qkv, cos, sin, positions)
    q = torch.empty((m, heads * head_dim), device=qkv.device, dtype=qkv.dtype)
    _loaded().rope_store_kernel[(m, heads + 2 * kv_heads)](
        qkv, cos, sin, positions, q, k_cache, v_cache, qkv.stride(0), k_cache.stride(0), k_cache.stride(1),
        HEADS=heads, KV=kv_heads, D=head_dim, PDL=pdl, num_warps=1, **_pdl_launch(pdl))
    return q


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, kv_heads: int,
           head_dim: int, block: int = ATTEND_BLOCK, warps: int = ATTEND_WARPS, stages: int = ATTEND_STAGES, *,
           pdl: bool = False, chunk: int = 0, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output [M, heads * D] for queries q [M, heads * D] (query head h reads kv head h // G) over each
    row's cache positions <= positions[row]. chunk > 0: a program per `chunk` positions, merged by the last to
    finish (`attend_split_kernel`), which needs `counts`, int32 zeros [>= M * kv_heads] that it leaves zero."""
    _need_unit_stride(q)
    return _attend(q, q.shape[1] // head_dim, None, None, k_cache, v_cache, positions, kv_heads, head_dim, block,
                   warps, stages, pdl, chunk, counts)


def rope_attend(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int, head_dim: int, *,
                pdl: bool = False, chunk: int = 0, counts: torch.Tensor | None = None,
                preload: bool = False) -> torch.Tensor:
    """`rope_store` then `attend` in one kernel: from the q/k/v projection qkv [M, (heads + 2 kv) * D], each
    program rotates its queries and, for the row's position, writes its key (rotated) and value into the cache
    before it reads it. Returns the attention output [M, heads * D]. `preload` (with `chunk`): each program reads
    its chunk of the cache before it waits for the previous kernel (FusedPlan.attend_preload; bf16 caches, or any
    under the interpreter)."""
    _need_unit_stride(qkv, cos, sin)
    if preload and not chunk:
        raise ValueError("a preloading attention reads chunks: give it `chunk`")
    preload = preload and _preloadable(qkv)
    return _attend(qkv, heads, cos, sin, k_cache, v_cache, positions, kv_heads, head_dim, ATTEND_BLOCK,
                   ATTEND_WARPS, ATTEND_STAGES, pdl, chunk, counts, preload)


def _attend(q: torch.Tensor, heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None, k_cache: torch.Tensor,
            v_cache: torch.Tensor, positions: torch.Tensor, kv_heads: int, head_dim: int, block: int, warps: int,
            stages: int, pdl: bool, chunk: int, counts: torch.Tensor | None, preload: bool = False) -> torch.Tensor:
    m = q.shape[0]
    group = heads // kv_heads
    _need_unit_stride(positions)
    _need_cache_layout(k_cache, v_cache, head_dim)
    if q.element_size() > 2:  # fp32 (tests): half the positions per iteration, for shared memory (_for_width)
        block, stages = block // 2, min(stages, 2)
    out = torch.empty((m, heads * head_dim), device=q.device, dtype=q.dtype)
    block_g = max(16, 1 << (group - 1).bit_length())
    rope = cos is not None
    tables = (cos, sin) if rope else (q, q)
    common = dict(G=group, BLOCK_G=block_g, D=head_dim, ROPE=rope, UPCAST=interpreting(), PDL=pdl, num_warps=warps,
                  num_stages=stages, **_pdl_launch(pdl))
    strides = (head_dim ** -0.5, q.stride(0), k_cache.stride(0), k_cache.stride(1))
    if chunk:
        if counts is None or counts.dtype != torch.int32 or counts.numel() < m * kv_heads:
            raise ValueError(f"split attention needs int32 counts for {m * kv_heads} (row, kv head) pairs")
        splits = -(-k_cache.shape[-2] // chunk)
        part = torch.empty((m, kv_heads, splits, block_g, head_dim + 2), device=q.device, dtype=torch.float32)
        _loaded().attend_split_kernel[(m, kv_heads, splits)](
            q, k_cache, v_cache, positions, out, *tables, part, counts, *strides, CHUNK=chunk, SPLITS=splits,
            PRELOAD=preload, **common)
    else:
        _loaded().attend_kernel[(m, kv_heads)](q, k_cache, v_cache, positions, out, *tables, *strides,
                                                BLOCK_S=block, **common)
    return out


@dataclass(frozen=True, slots=True)
class StepState:
    """The graph lane's per-row sampling and bookkeeping buffers that `sample` reads and moves on."""

    temperature: torch.Tensor
    """[rows] fp32."""
    top_k: torch.Tensor
    """[rows] int64, each <= the candidates."""
    top_p: torch.Tensor
    """[rows] fp32."""
    noise: torch.Tensor
    """[rows, steps + 1, candidates] fp32 Gumbel noise, read at each row's step."""
    allowed: torch.Tensor
    """[width] int64: the vocabulary id of each logit column."""
    tokens: torch.Tensor
    """[rows] int64: each row's next input (written)."""
    steps: torch.Tensor
    """[rows] int64: tokens sampled per row (moved on, at most max_len)."""
    positions: torch.Tensor
    """[rows] int64: each row's position (moved on, at most max_len - 1)."""
    ring: torch.Tensor
    """[RING, rows] int64: every launch's tokens, ring[launch % RING]."""
    launch: torch.Tensor
    """[1] int64: launches so far (moved on)."""
    max_len: int


SAMPLE_CHUNKS = 16
"""Slices of a row's logits sorted side by side by `sample`'s programs (the last merges their top candidates)."""


def has_topk() -> bool:
    """This Triton has the bitonic `tl.topk` (3.4 and later)."""
    import triton.language as tl

    return hasattr(tl, "topk")


def can_sample(width: int, candidates: int) -> bool:
    """Whether `sample` takes logits this wide: SAMPLE_CHUNKS slices of at least `candidates` (a power of two)."""
    return width % SAMPLE_CHUNKS == 0 and width // SAMPLE_CHUNKS >= candidates and candidates & (candidates - 1) == 0


def sample(logits: torch.Tensor, state: StepState, candidates: int, counts: torch.Tensor, *,
           pdl: bool = False, topk: bool = False) -> None:
    """lane_runner.pick's draw for rows [0, M) of logits [M, width] fp32, then the step's bookkeeping, in one kernel
    (`sample_kernel`): each row's token (allowed[pick]) into tokens and ring[launch % RING], step and position
    moved on, launch moved on. `counts`: int32 zeros [>= M + 1], left zero. Replaces ~20 small kernels, a visible
    share of a step. `topk`: select with `tl.topk` (ignored where Triton lacks
    it); the same keys come out."""
    rows, width = logits.shape
    _need_unit_stride(logits, state.allowed, state.tokens, state.steps, state.positions, state.ring)
    if not can_sample(width, candidates):
        raise ValueError(f"sample needs a width of {SAMPLE_CHUNKS} slices of at least {candidates} logits "
                         f"(a power of two), got {width}")
    if counts.dtype != torch.int32 or counts.numel() < rows + 1:
        raise ValueError(f"sample needs int32 counts for {rows + 1} counters")
    noise = state.noise
    keys = torch.empty((rows, SAMPLE_CHUNKS, candidates), device=logits.device, dtype=torch.int64)
    _loaded().sample_kernel[(SAMPLE_CHUNKS, rows)](
        logits, state.temperature, state.top_k, state.top_p, noise, state.allowed, state.tokens, state.steps,
        state.positions, state.ring, state.launch, keys, counts, width, noise.stride(0), noise.stride(1),
        state.max_len, state.ring.shape[0], state.ring.stride(0), CHUNKS=SAMPLE_CHUNKS,
        SLICE=max(candidates, 1 << (width // SAMPLE_CHUNKS - 1).bit_length()), CANDIDATES=candidates, PDL=pdl,
        TOPK=topk and has_topk(), num_warps=4, **_pdl_launch(pdl))
