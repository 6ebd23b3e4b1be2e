"""Provides GraphLane (up to 8 streams stepped together, each step one CUDA-graph launch) and LaneRouter.

Why: at one stream vLLM took 42-57 ms to its 20th token (first audio needs ~20) at 1.45 ms per greedy step and
1.74 with top-k/top-p (docs/lab/run-log.md). The lane runs the LLM in this process (engine.backends.qwen2_static)
with everything for a step (forward, logits over the allowed ids only, top-k/top-p sampling) captured once per
shape as a CUDA graph, so a step is one launch and the GPU never waits for Python (1.21 ms per token, 20th token at
26 ms on an H200). The host launches a few steps ahead and reads tokens back in small bursts.

Sampling is Gumbel-max over the top-k candidates: argmax(logits / T + G) with G = -log(E), E ~ Exp(1), is an
exact draw from softmax(logits / T) restricted to the candidates top-k and top-p keep; the noise comes from the
request's seeded generator before the first step, so the graph holds no RNG state and a seed gives the same
tokens on every run (alone on the lane: rows of a batch may round differently). Greedy (temperature 0) is top-1
with no noise.

Without CUDA the same code runs eagerly (the CPU tests use that); the router only builds a lane on a GPU.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

import torch

from engine.backends import decode_kernels
from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.backends.qwen2_static import StaticQwen2
from engine.config import SamplingOptions, request_of
from engine.errors import GenerationError
from engine.events import EventSink, Notice, ignore_events
from engine.prompt import Prompt

CANDIDATES = 64
"""Top-k candidates the graph keeps. Requests with top_k 0 (off) or above this go to vLLM (Spark's default is 50)."""
TOPK_CHUNKS = 16
"""The candidates are found in two rounds: top-k of each of this many slices of the logits, then of their union
(the same values as one top-k). torch.topk over 8,195 logits is one thread block per row: 52 us of a 1.08 ms
step on an H200 (docs/lab/run-log.md, lane profile). The head's width is padded to a multiple of this."""
PREFILL_BUCKETS = (32, 64, 128, 256, 512)
"""Prompt lengths are padded up to one of these (one graph each); longer prompts go to vLLM. A sentence prompt
is ~40 ids plus its text tokens."""
SPAN_BUCKETS = (128, 256, 512, 1024, 2048, 4096)
"""Attention spans (one decode graph each): a step attends over the smallest span holding its position, so short
sentences do not pay for the longest one."""
BURST = 2
"""Steps per read-back: tokens reach the caller at most BURST - 1 steps late (~1 ms); a read costs ~20 us."""
CROWD_BURSTS = ((8, BURST), (None, 8))
"""Steps per read-back by rows running (up to 8, more): each read hands every stream its tokens through the event
loop, so a crowd gets fewer, larger deliveries (a first window needs ~20 tokens either way). Bursts of 4 from 9
rows, with every new request admitted at once (one prompt per prefill then), measured TTFA p95 at 32 streams
192 ms against 149 (one run each, no_lane 147 and 192 in the same runs: docs/lab/run-log.md)."""
AHEAD = 2
"""Bursts in flight while the host reads one: the GPU never idles on Python."""
ROWS = 8
"""Streams the lane steps at once, by default (the factory sizes it to the GPU: `rows_for`). Steps over 1, 2, 4
and 8 rows took 1.07, 1.03, 1.06 and 1.10 ms on an H200 (lab/lane_profile.py): the weights are read once
whatever the rows."""
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
"""Batch sizes with a decode graph each: a step runs the smallest holding the highest busy row."""
FUSE_ROWS = 16
"""Decode steps of up to this many rows run the fused kernels (engine.backends.decode_kernels). Measured in one
process on an H200 (lab/decode_kernels_probe.py, ms per step, run 21's fused step vs compiled tensor code):
0.91 vs 1.19 at 1 row, 0.99 vs 1.23 at 16, 1.26 vs 1.28 at 32, 1.58 vs 1.39 at 64, 2.34 vs 1.67 at 128 (run 22's
plan: 0.77 at 1 row, 0.85 at 16). The fused projections' programs cover 16 rows each and read the weights again
for every 16 rows; cuBLAS's batched GEMMs read them once."""
ADMIT = 8
"""Later sentences (of requests that already have a row) prefilled between two bursts: they are not waited on."""
ADMIT_NEW = 32
"""Requests with no row yet prefilled between two bursts: each is a listener waiting for first sound, and eight
prompts cost one launch of ~2.5 ms, so a crowd of 32 gets its rows in ~10 ms instead of over four rounds of
bursts."""
PREFILL_BATCHES = (1, 2, 4, 8)
"""Prompts one prefill graph runs side by side (an admitted group is split into these: 7 = 4 + 2 + 1). One prefill
reads every weight once however many prompts it holds: eight prompts of 128 positions took 2.5 ms in one launch
and 10.4 ms one at a time, time the other rows wait (H200, lab/lane_profile.py)."""
ROW_MEMORY_SHARE = 0.10
"""Share of the GPU's memory the rows' KV cache may take (50 MB a row for Spark's LLM at 4,096 positions)."""
RING = 512
"""Launches whose tokens the ring keeps: more than are ever in flight ((AHEAD + 1) bursts of 8 steps and one
admission's prefills, at most (ADMIT_NEW + ADMIT) / 8 + 3)."""
LANE_STREAM_PRIORITY = -1
"""CUDA stream priority of the lane (lower is higher; torch's streams default to 0, as the decoder's does)."""
OTHERS_LIMIT = 1
"""The lane takes a stream only while vLLM runs fewer than this many (1: only when vLLM is idle)."""
HANDOFF_AT = 2
"""A small lane's stream moves to vLLM once vLLM runs this many: a crowd has arrived and joins one batch there."""
CROWD_ROWS = 32
"""A lane of this many rows or more keeps its streams and takes new ones while it has rows (see LaneRouter)."""
FIXED_SHAPES = "docs/lab/2026-11-25-h200-lane-invariance.json"
"""Why `GraphLane(fixed_shapes=True)` is batch invariant: on the plain tensor code, a decode row's hidden state was
bitwise the same whatever the other rows held, how many rows ran and in which order, but not over every span, and
a prompt prefilled alone differed from the same prompt packed with others (lab/lane_invariance_probe.py). So a
fixed-shape lane runs one span, one row count and one prompt per prefill; the per-request Gumbel noise already
made the draws independent of the row."""
FIXED_LANES = ((1024, 256), (2048, 64))
"""(positions, most rows) of each fixed-shape lane of a deterministic engine, shortest first: a sentence runs on the
first whose positions hold its prompt and token budget. Every step attends over all of a lane's positions and runs
all its rows, so most sentences take the short lane and the long ones (up to the longest sentence the pipeline
cuts, JoinConfig.max_sentence_chars) the other; what fits neither runs on the router's last generator, whose
arithmetic is per request too. More rows cost a step less than they add
(docs/lab/2026-11-25-h200-fixed-lane-steps.json); ROW_MEMORY_SHARE caps each lane on smaller GPUs."""


def gumbel(steps: int, candidates: int, seed: int | None, device: torch.device) -> torch.Tensor:
    """[steps, candidates] Gumbel noise from a generator seeded with `seed` (fresh entropy when None)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    expo = torch.empty((steps, candidates), device=device).exponential_(generator=gen)
    # the CPU kernel can return 0 (the CUDA one does not): +inf noise would then beat a masked -inf candidate
    return -torch.log(expo.clamp_min_(torch.finfo(expo.dtype).tiny))


def pick(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
         noise: torch.Tensor) -> torch.Tensor:
    """Per row of `logits` [B, A], an index [B] drawn by Gumbel-max among the top CANDIDATES after temperature,
    top-k ([B], each <= CANDIDATES) and top-p (keep while the mass of strictly more likely candidates is below
    top_p, so the most likely always stays); `noise` [B, CANDIDATES] is Gumbel noise (zeros: the most likely).
    Fixed shapes, no host sync: it runs inside the captured step."""
    values, index = top_candidates(logits)
    rank = torch.arange(CANDIDATES, device=logits.device)
    values = (values / temperature[:, None]).masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(values, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    values = values.masked_fill(before >= top_p[:, None], float("-inf"))
    return index.gather(1, torch.argmax(values + noise, dim=-1, keepdim=True)).view(-1)


def top_candidates(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(logits, CANDIDATES) for logits [B, A] (values sorted, largest first), in two rounds when A
    splits into TOPK_CHUNKS slices of at least CANDIDATES each."""
    b, width = logits.shape
    size = width // TOPK_CHUNKS
    if width % TOPK_CHUNKS or size < CANDIDATES:
        return torch.topk(logits, CANDIDATES, dim=-1)
    values, index = torch.topk(logits.view(b, TOPK_CHUNKS, size), CANDIDATES, dim=-1)
    index = index + torch.arange(0, width, size, device=logits.device)[:, None]
    values, best = torch.topk(values.view(b, -1), CANDIDATES, dim=-1)
    return values, index.view(b, -1).gather(1, best)


def bucket(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest size >= n (None when n exceeds them all)."""
    return next((s for s in sizes if s >= n), None)


def row_bytes(cfg: Any, max_len: int = SPAN_BUCKETS[-1], dtype_bytes: int = 2) -> int:
    """One row's KV cache: keys and values of every layer over `max_len` positions."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * max_len * head_dim * dtype_bytes


def fixed_rows_for(gpu_bytes: int, row_bytes: int, most: int) -> int:
    """Rows of a fixed-shape lane: `most` where ROW_MEMORY_SHARE of the GPU holds their KV cache, else as many as it
    holds (at least 1)."""
    return max(1, min(most, int(ROW_MEMORY_SHARE * gpu_bytes // row_bytes)))


def rows_for(gpu_bytes: int, row_bytes: int, most: int | None = None) -> int:
    """The largest row bucket (at most `most`) whose KV cache fits ROW_MEMORY_SHARE of a GPU of `gpu_bytes`
    (at least 1)."""
    fits = [rows for rows in ROW_BUCKETS
            if rows * row_bytes <= ROW_MEMORY_SHARE * gpu_bytes and (most is None or rows <= most)]
    return fits[-1] if fits else 1


@dataclass(slots=True, eq=False)
class _Job:
    """One request on the lane: what to run, where its tokens go, and how far the worker has got with it."""

    ids: tuple[int, ...]
    opts: SamplingOptions
    allowed: tuple[int, ...]
    deliver: Callable[..., None]
    request_id: str
    group: str
    aborted: threading.Event = field(default_factory=threading.Event)
    row: int = -1
    """Its row of the batch (and of the KV cache) once admitted."""
    launched: int = 0
    """Tokens whose step has been launched (the prefill's first token included)."""
    delivered: int = 0
    stopped: bool = False
    """No more steps for it: a stop id came back, or it was aborted."""
    ended: bool = False

    def wants_steps(self) -> bool:
        return not self.stopped and self.launched < self.opts.max_tokens and not self.aborted.is_set()


@dataclass(slots=True)
class _Read:
    """Launches [start, stop) (counted since the lane began) on their way to the host."""

    event: Any
    start: int
    stop: int
    entries: list[list[tuple[_Job, int]]]
    """Per launch: the jobs it stepped, with their row."""
    began: Any = None
    """A timing event recorded before the first of these launches (`event` is after the last), on CUDA."""


class GraphLane:
    """Token generator for up to `rows` streams at once whose prefill and decode steps are CUDA graphs (eager on
    the CPU). A step runs every admitted stream as one row of a batch: rows cost little more than one
    (weights are read once per step: 1.03 ms for 1 row, 1.04 for 8 on an H200), so a request's sentences, or a
    few requests, run side by side at the lone stream's speed. Streams beyond `rows` wait for a free row."""

    def __init__(self, model: torch.nn.Module | Qwen2Weights, token_ids: Any, allowed: tuple[int, ...], *,
                 device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 max_len: int = SPAN_BUCKETS[-1], rows: int = ROWS, compile_layers: bool = False,
                 capture: bool | None = None, fused: bool | None = None, fuse_rows: int = FUSE_ROWS,
                 plan: decode_kernels.FusedPlan | None = None, compile_prefill: bool | None = None,
                 capture_mode: str = "global", fixed_shapes: bool = False) -> None:
        """`fused`: decode steps of up to `fuse_rows` rows run the fused kernels (default: on CUDA when Triton is
        there); more rows, prefills and `fused=False` run StaticQwen2's tensor code. `plan`: which variant of the
        fused step (default decode_kernels.PLAN, less what this GPU cannot run). `compile_prefill` (with
        `compile_layers`): Inductor compiles the prefills too; default only where some decode steps run the
        tensor code (a lane whose every step is fused would compile just its prefills, once per shape).
        `fixed_shapes`: every decode step runs all `rows` over a span of `max_len`, and every prefill holds one
        prompt, so a row's arithmetic never depends on what else the lane runs (see FIXED_SHAPES)."""
        if fixed_shapes and (fused or compile_layers):
            raise ValueError("fixed shapes run the plain tensor code: no fused kernels, no compiled layers")
        self.device = torch.device(device)
        self.token_ids = token_ids
        self._stop_ids = frozenset(token_ids.stop_ids)
        self.max_len, self.rows = max_len, rows
        self.spans = tuple(s for s in SPAN_BUCKETS if s < max_len) + (max_len,)
        self.prefills = tuple(p for p in PREFILL_BUCKETS if p <= max_len)
        self.prefill_batches = tuple(b for b in PREFILL_BATCHES if b <= rows)
        self.row_buckets = tuple(b for b in ROW_BUCKETS if b < rows) + (rows,)
        self.fixed_shapes = fixed_shapes
        if fixed_shapes:
            self.spans, self.prefill_batches, self.row_buckets = (max_len,), (1,), (rows,)
            fused = False
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.capture_mode = capture_mode
        """torch.cuda.graph's capture_error_mode: thread_local for a lane built while other threads use the GPU."""
        if fused and not decode_kernels.available():
            raise ValueError("fused decode kernels need Triton and a CUDA GPU (or Triton's CPU interpreter)")
        self.fuse_rows = fuse_rows
        # High priority: the decoder's windows (its own stream, default priority) run beside the steps, and a step's
        # small kernels should get the SMs first as they free up; a graph replays at its stream's priority.
        self.cuda_stream = (torch.cuda.Stream(self.device, priority=LANE_STREAM_PRIORITY)
                            if self.device.type == "cuda" else None)
        with self._on_stream():
            self.model = StaticQwen2(model, max_len, self.device, dtype, own_cache=False)
            wanted = self.device.type == "cuda" and decode_kernels.available() if fused is None else fused
            self.fused = wanted and decode_kernels.supports(self.model.head_dim)
            tensor_steps = not self.fused or rows > fuse_rows
            compiled_prefill = compile_prefill is True or (compile_prefill is None and tensor_steps)
            if compile_layers and (tensor_steps or compiled_prefill):
                # a lane whose every step is fused and whose prefills are plain compiles nothing: not even
                # importing the compiler, which a fresh process would pay for before its first word
                self.model.compile_layers(prefill=compiled_prefill)
            self.plan = plan if plan is not None else decode_kernels.plan_for()
            self._buffers(-(-len(allowed) // TOPK_CHUNKS) * TOPK_CHUNKS)
        self.allowed_now: tuple[int, ...] = ()
        self._set_allowed(allowed)
        self._graphs: dict[tuple[str, int, int], torch.cuda.CUDAGraph] = {}
        self.capture_s = self._capture_all() if self.capture else 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graph-lane")
        self._jobs: deque[_Job] = deque()
        """Jobs waiting, running or draining, oldest first (the router reads their groups)."""
        self._waiting: deque[_Job] = deque()
        self._in_rows: list[_Job | None] = [None] * rows
        """The job each row steps (None: free; a freed row keeps computing, nobody reads it)."""
        self._launches = 0
        """Launches so far (the device's `launch` counter, mirrored)."""
        self._vocab_checked: tuple[int, ...] | None = None
        """The last allowed set found inside the vocabulary."""
        self.served = 0
        self.bursts = CROWD_BURSTS
        """Steps per read-back by rows running (the bench swaps it to measure other bursts)."""
        self.busy_ms = 0.0
        """GPU time of the launches read back so far (first launch's start to last launch's end, per read)."""
        self.idle_ms = 0.0
        """GPU time the lane's stream sat empty between two reads of one run of the worker: the host was late
        with the next launch (Python, the GIL), not the GPU slow with the last."""
        self._began = None
        self._last_end = None

    # ---- static state ----------------------------------------------------------------------------------------

    def _buffers(self, width: int) -> None:
        dev, rows = self.device, self.rows
        long = dict(device=dev, dtype=torch.long)
        most = self.prefill_batches[-1]
        self.prompts = torch.zeros(most, self.prefills[-1], **long)
        """A prefill's prompts, right-padded to its bucket."""
        self.lengths = torch.ones(most, **long)
        """Their real lengths (the prefill graph samples after position length - 1 of each)."""
        self.admit_rows = torch.zeros(most, **long)
        """The row each prompt of a prefill fills."""
        self.staging = self.model.new_rows_cache(most, self.prefills[-1])
        """A prefill's keys and values, copied into its rows' caches by the same graph."""
        self.k_rows, self.v_rows = self.model.new_rows_cache(rows, self.max_len)
        self.tokens = torch.zeros(rows, **long)
        """Each row's last token (the next step's input)."""
        self.positions = torch.zeros(rows, **long)
        self.steps = torch.zeros(rows, **long)
        """Tokens sampled per row so far (the row's index into its noise)."""
        self.noise = torch.zeros(rows, self.max_len + 1, CANDIDATES, device=dev)
        self.temperature = torch.ones(rows, device=dev)
        self.top_k = torch.ones(rows, **long)
        self.top_p = torch.ones(rows, device=dev)
        self.launch = torch.zeros(1, **long)
        self.ring = torch.zeros(RING, rows, **long)
        """Every launch writes all rows' tokens into ring[launch % RING]; the host reads the rows back."""
        self.host = torch.zeros(RING, rows, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.allowed = torch.zeros(width, **long)
        self.head = torch.zeros(width, self.model.hidden, device=dev, dtype=self.model.dtype)
        self.head_t = (torch.zeros(self.model.hidden, width, device=dev, dtype=self.model.dtype)
                       if self.fused and not self.plan.k_major else None)
        """The head transposed, for fused kernels reading W [K, N] row-major."""
        self.head_bias = torch.zeros(width, device=dev)
        self.step_state = decode_kernels.StepState(self.temperature, self.top_k, self.top_p, self.noise, self.allowed,
                                                   self.tokens, self.steps, self.positions, self.ring, self.launch,
                                                   self.max_len)
        """The buffers a fused step's `decode_kernels.sample` reads and moves on."""

    def _set_allowed(self, allowed: tuple[int, ...]) -> None:
        """Point the head at these vocabulary ids (padding rows get -inf logits); every row shares them."""
        if self._is_current(allowed):
            return
        width = self.allowed.numel()
        ids = torch.tensor(list(allowed) + [allowed[0]] * (width - len(allowed)), dtype=torch.long)
        with self._on_stream():
            self.allowed.copy_(ids)
            self.head.copy_(self.model.head_rows(self.allowed))
            if self.head_t is not None:
                self.head_t.copy_(self.head.t())
            self.head_bias.zero_()
            self.head_bias[len(allowed):] = float("-inf")
        self.allowed_now = allowed

    def _is_current(self, allowed: tuple[int, ...]) -> bool:
        """Whether the head points at these ids now (identity first: every sentence shares one 8,195-id tuple)."""
        return allowed is self.allowed_now or allowed == self.allowed_now

    def _on_stream(self):
        return torch.cuda.stream(self.cuda_stream) if self.cuda_stream is not None else contextlib.nullcontext()

    # ---- the captured steps ----------------------------------------------------------------------------------

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, A] float logits over the allowed ids for hidden states [B, H]."""
        return torch.mm(hidden, self.head.t()).float() + self.head_bias

    def _record(self) -> None:
        """Every row's token into this launch's ring row; the launch counter moves on."""
        self.ring.index_copy_(0, torch.remainder(self.launch, RING), self.tokens.view(1, -1))
        self.launch.add_(1)

    def _prefill(self, batch: int, size: int) -> None:
        """Prompts [0, batch) into their rows (`admit_rows`): each row's cache, first token, position and step."""
        staging = tuple(staged[:, :batch, :, :size] for staged in self.staging)
        hidden = self.model.prefill_rows(self.prompts[:batch, :size], staging)
        rows, lengths = self.admit_rows[:batch], self.lengths[:batch]
        last = torch.arange(batch, device=self.device) * size + lengths - 1
        first = pick(self._logits(hidden.index_select(0, last)), self.temperature.index_select(0, rows),
                     self.top_k.index_select(0, rows), self.top_p.index_select(0, rows),
                     self.noise[:, 0].index_select(0, rows))
        self.tokens.index_copy_(0, rows, self.allowed.index_select(0, first))
        self.positions.index_copy_(0, rows, lengths)
        self.steps.index_fill_(0, rows, 1)
        for cache, staged in zip((self.k_rows, self.v_rows), staging):
            cache[:, :, :, :size].index_copy_(1, rows, staged)
        self._record()

    def head_for(self, plan: decode_kernels.FusedPlan) -> torch.Tensor:
        """The head [H, A] as the fused kernels of `plan` read it."""
        return self.head.t() if plan.k_major else self.head_t

    def _fuses(self, rows: int) -> bool:
        return self.fused and rows <= self.fuse_rows

    def _decode(self, rows: int, span: int) -> None:
        """One token for each of rows [0, rows)."""
        if self._fuses(rows):  # every row attends over its own length: `span` does not matter
            x = self.model.forward_fused(self.tokens[:rows], self.positions[:rows],
                                         (self.k_rows[:, :rows], self.v_rows[:, :rows]), self.plan)
            logits = self.model.logits_fused(x, self.head_for(self.plan), self.head_bias, self.plan)
            # the draw, tokens, steps, positions and ring row in one kernel
            if self.plan.one_sample and decode_kernels.can_sample(logits.shape[1], CANDIDATES):
                decode_kernels.sample(logits, self.step_state, CANDIDATES, self.model.counts, pdl=self.plan.pdl,
                                      topk=self.plan.sample_topk)
                return
        elif rows == 1:  # the single-sequence forward: its cache write fuses into the rotary kernel (1.10 vs 1.23 ms)
            logits = self._logits(self.model.forward(self.tokens[:1], self.positions[:1], span,
                                                     cache=(self.k_rows[:, 0], self.v_rows[:, 0])))
        else:
            logits = self._logits(self.model.forward_rows(self.tokens[:rows], self.positions[:rows], span,
                                                          (self.k_rows[:, :rows], self.v_rows[:, :rows])))
        steps = self.steps[:rows]
        noise = self.noise[:rows].gather(1, steps.view(rows, 1, 1).expand(rows, 1, CANDIDATES)).view(rows, -1)
        chosen = pick(logits, self.temperature[:rows], self.top_k[:rows], self.top_p[:rows], noise)
        self.tokens[:rows].copy_(self.allowed.index_select(0, chosen))
        # a row whose stream has ended keeps stepping until its row is reused: never past the buffers' ends
        steps.add_(1).clamp_max_(self.max_len)
        self.positions[:rows].add_(1).clamp_max_(self.max_len - 1)
        self._record()

    def _run(self, kind: str, a: int, b: int = 0) -> None:
        if self.cuda_stream is not None and self._began is None:  # the next read's first launch: time it
            self._began = torch.cuda.Event(enable_timing=True)
            self._began.record(self.cuda_stream)
        graph = self._graphs.get((kind, a, b))
        if graph is not None:
            graph.replay()
        elif kind == "prefill":
            self._prefill(a, b)
        else:
            self._decode(a, b)
        self._launches += 1

    @torch.inference_mode()
    def _capture_all(self) -> float:
        """One graph per (prompts, bucket) prefill and per (rows, span) decode (a fused decode: one per rows, the
        same graph for every span), sharing one memory pool (they never run at once)."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        shapes = [("prefill", batch, size) for batch in self.prefill_batches for size in self.prefills]
        shapes += [("decode", rows, span) for rows in self.row_buckets for span in self.spans]
        with self._on_stream():
            self.lengths.fill_(1)
            self.admit_rows.copy_(torch.arange(self.admit_rows.numel(), device=self.device))
            for kind, a, b in shapes:
                if kind == "decode" and self._fuses(a) and b != self.spans[0]:
                    self._graphs[(kind, a, b)] = self._graphs[(kind, a, self.spans[0])]  # the same step
                    continue
                fn = (lambda: self._prefill(a, b)) if kind == "prefill" else (lambda: self._decode(a, b))
                for _ in range(2):  # first calls: cuBLAS handles, compiles, allocator warm-up
                    fn()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.cuda_stream, capture_error_mode=self.capture_mode):
                    fn()
                graph.replay()  # a graph's first launch uploads it to the GPU: here, not in a request
                self._graphs[(kind, a, b)] = graph
            self.positions.zero_()
            self.steps.zero_()
            self.launch.zero_()
            self.cuda_stream.synchronize()
        return time.perf_counter() - t0

    # ---- the worker: admit, step, read back ------------------------------------------------------------------

    def supports(self, prompt: Prompt, opts: SamplingOptions) -> bool:
        """Whether this request fits the captured shapes and sampler."""
        allowed = prompt.allowed_ids
        return (bool(prompt.ids) and len(prompt.ids) <= self.prefills[-1]
                and len(prompt.ids) + opts.max_tokens <= self.max_len
                and allowed is not None and 0 < len(allowed) <= self.allowed.numel()
                and (opts.temperature == 0 or 0 < opts.top_k <= CANDIDATES)
                # an id outside the vocabulary would fault inside a graph replay, and a device-side fault ends
                # every CUDA call of this process (the decoder's too): such a request goes elsewhere
                and self._in_vocab(prompt.ids) and self._allowed_in_vocab(allowed))

    def _in_vocab(self, ids: Any) -> bool:
        return 0 <= min(ids) and max(ids) < self.model.vocab_size

    def _allowed_in_vocab(self, allowed: tuple[int, ...]) -> bool:
        """`_in_vocab` for an allowed set, scanned once: every sentence brings the same tuple (8,195 ids)."""
        if allowed is self._vocab_checked:
            return True
        if not self._in_vocab(allowed):
            return False
        self._vocab_checked = allowed
        return True

    @torch.inference_mode()
    def drive(self) -> None:
        """Worker thread: admit waiting jobs into free rows, step every row in bursts, deliver the tokens read
        back, until no job is left (jobs arriving meanwhile join at the next burst)."""
        pending: deque[_Read] = deque()
        unread: list[list[tuple[_Job, int]]] = []
        self._began = self._last_end = None  # a gap before this run is no job's wait
        try:
            with self._on_stream():
                while True:
                    if self._admit(unread):  # its first token goes to the host at once (time to first token)
                        pending.append(self._read_back(unread))
                    while len(pending) <= AHEAD and self._burst(unread):
                        pending.append(self._read_back(unread))
                    if pending:
                        self._deliver(pending.popleft())
                    else:
                        self._sweep()
                        if not self._waiting:
                            return
        except Exception as err:  # noqa: BLE001 - raised in every consumer
            self._fail(err)

    def _admit(self, unread: list) -> bool:
        """Give waiting jobs free rows and prefill them, as few launches as the prefill batches allow: requests
        with no row yet first (up to ADMIT_NEW: their first sound comes first), then later sentences in arrival
        order while fewer than ADMIT jobs are admitted. All rows share one allowed set: a job with another waits
        until the rows are empty."""
        admitted: list[_Job] = []
        new = 0
        while self._waiting and None in self._in_rows:
            running = {job.group for job in self._in_rows if job is not None}
            index = next((i for i, job in enumerate(self._waiting) if job.group not in running), None)
            if index is not None and new < ADMIT_NEW:
                new += 1
            elif len(admitted) < ADMIT:
                index = 0
            else:
                break
            job = self._waiting[index]
            if not self._is_current(job.allowed) and any(self._in_rows):
                break
            del self._waiting[index]
            self._set_allowed(job.allowed)
            job.row, job.launched = self._in_rows.index(None), 1
            self._in_rows[job.row] = job
            admitted.append(job)
        # similar lengths share a launch (each is padded to the longest's bucket)
        admitted.sort(key=lambda job: len(job.ids))
        any_admitted = bool(admitted)
        while admitted:
            batch = max(b for b in self.prefill_batches if b <= len(admitted))
            self._start(admitted[:batch], unread)
            del admitted[:batch]
        return any_admitted

    def _start(self, jobs: list[_Job], unread: list) -> None:
        """Prefill these jobs (a captured batch size) into their rows."""
        size = bucket(max(len(job.ids) for job in jobs), self.prefills)
        prompts = torch.zeros(len(jobs), size, dtype=torch.long)
        for i, job in enumerate(jobs):
            prompts[i, :len(job.ids)] = torch.tensor(job.ids, dtype=torch.long)
            self._sampling(job)
        self.prompts[:len(jobs), :size].copy_(prompts)
        self.lengths[:len(jobs)].copy_(torch.tensor([len(job.ids) for job in jobs]))
        self.admit_rows[:len(jobs)].copy_(torch.tensor([job.row for job in jobs]))
        self._run("prefill", len(jobs), size)
        unread.append([(job, job.row) for job in jobs])
        for job in jobs:
            self._release_if_done(job)

    def _sampling(self, job: _Job) -> None:
        """The job's temperature, top-k, top-p and noise into its row."""
        row, opts = job.row, job.opts
        greedy = opts.temperature == 0
        self.temperature[row] = 1.0 if greedy else opts.temperature
        self.top_k[row] = 1 if greedy else opts.top_k
        self.top_p[row] = 1.0 if greedy else opts.top_p
        steps = opts.max_tokens
        if greedy:
            self.noise[row, :steps].zero_()
        else:
            self.noise[row, :steps].copy_(gumbel(steps, CANDIDATES, opts.seed, self.device))

    def _burst(self, unread: list) -> bool:
        """Launch a burst of decode steps (CROWD_BURSTS) over the rows that want one; False when none does."""
        launched = False
        busy = sum(job is not None for job in self._in_rows)
        steps = next(n for most, n in self.bursts if most is None or busy <= most)
        for _ in range(steps):
            jobs = [job for job in self._in_rows if job is not None and job.wants_steps()]
            if not jobs:
                break
            rows = bucket(max(job.row for job in jobs) + 1, self.row_buckets)
            # token k of a job feeds token k - 1 at position n + k - 1: its span must cover n + k positions
            span = bucket(max(len(job.ids) + job.launched for job in jobs), self.spans)
            self._run("decode", rows, span)
            unread.append([(job, job.row) for job in jobs])
            for job in jobs:
                job.launched += 1
                self._release_if_done(job)
            launched = True
        return launched

    def _release_if_done(self, job: _Job) -> None:
        """Free the job's row once no more steps are launched for it (its tokens in flight stay readable: they
        sit in earlier ring rows, and a new job's prefill in that row runs after those steps)."""
        if not job.wants_steps() and self._in_rows[job.row] is job:
            self._in_rows[job.row] = None

    def _read_back(self, unread: list) -> _Read:
        """Queue copies of the ring rows of the launches not yet read; unread is emptied."""
        start, stop = self._launches - len(unread), self._launches
        for a, b in _ring_ranges(start, stop):
            self.host[a:b].copy_(self.ring[a:b], non_blocking=self.cuda_stream is not None)
        event = None
        if self.cuda_stream is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.cuda_stream)
        read = _Read(event, start, stop, list(unread), self._began)
        self._began = None
        unread.clear()
        return read

    def _deliver(self, read: _Read) -> None:
        """Hand each job its tokens from these launches (cut at a stop id); end the jobs that are done."""
        if read.event is not None:
            read.event.synchronize()
            self._time(read)
        got: dict[_Job, list[int]] = {}
        for launch, entries in zip(range(read.start, read.stop), read.entries):
            ring_row = self.host[launch % RING].tolist()
            for job, row in entries:
                got.setdefault(job, []).append(ring_row[row])
        for job, tokens in got.items():
            if job.ended or job.aborted.is_set():  # steps launched before it ended: nobody reads them
                continue
            cut = next((i + 1 for i, t in enumerate(tokens) if t in self._stop_ids), None)
            if cut is not None:
                tokens, job.stopped = tokens[:cut], True
            job.delivered += len(tokens)
            if job.stopped or job.delivered >= job.opts.max_tokens:
                self.served += 1
                self._end(job, tokens)
            else:
                job.deliver("tokens", tokens, False)
        self._sweep()

    def _time(self, read: _Read) -> None:
        """Add the read's launches to busy_ms and the empty stream before them to idle_ms."""
        if read.began is None:
            return
        if self._last_end is not None:
            self.idle_ms += max(0.0, self._last_end.elapsed_time(read.began))
        self.busy_ms += read.began.elapsed_time(read.event)
        self._last_end = read.event

    def _sweep(self) -> None:
        """End aborted jobs, waiting or running (their rows free at once: steps in flight for them are skipped)."""
        for job in list(self._jobs):
            if job.aborted.is_set() and not job.ended:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(job)
                self._end(job)

    def _end(self, job: _Job, last: list[int] | None = None) -> None:
        """Take the job off the lane, then hand over its `last` tokens (marked finished) and the end: whoever
        sees them sees the lane without it."""
        job.ended = True
        if 0 <= job.row < self.rows and self._in_rows[job.row] is job:
            self._in_rows[job.row] = None
        with contextlib.suppress(ValueError):
            self._jobs.remove(job)
        if last is not None:
            job.deliver("tokens", last, True)
        job.deliver("end", None)

    def _fail(self, err: BaseException) -> None:
        """Every job gets the error (the router hands their streams over); the rows start empty again."""
        jobs = [job for job in list(self._jobs) if not job.ended]
        self._waiting.clear()
        self._in_rows = [None] * self.rows
        with contextlib.suppress(Exception):  # re-read the launch counter: the failure may have cut a burst
            self._launches = int(self.launch.item())
        for job in jobs:
            job.deliver("error", err)
            self._end(job)

    # ---- TokenGenerator --------------------------------------------------------------------------------------

    @property
    def load(self) -> int:
        return len(self._jobs)

    def groups(self) -> set[str]:
        return {job.group for job in list(self._jobs)}

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str,
                     group: str | None = None) -> AsyncIterator[list[int]]:
        """Yield token deltas (stop id included when reached); up to `rows` jobs run at once, the rest wait in
        arrival order."""
        if not self.supports(prompt, opts):
            raise ValueError("this request does not fit the graph lane")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def deliver(kind: str, payload: Any, finished: bool = False) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, (payload, finished)))
            except RuntimeError:  # the consumer's loop is gone
                job.aborted.set()

        job = _Job(tuple(prompt.ids), opts, tuple(prompt.allowed_ids or ()), deliver, request_id,
                   group or request_id)
        self._jobs.append(job)
        self._waiting.append(job)
        try:
            self._executor.submit(self.drive)  # a no-op when a running drive has taken the job already
        except RuntimeError as err:  # closed
            self._jobs.remove(job)
            self._waiting.remove(job)
            raise GenerationError("the graph lane is closed") from err
        try:
            while True:
                kind, (payload, finished) = await queue.get()
                if kind == "error":
                    raise _lane_error(payload)
                if kind == "end":
                    return
                yield payload
                if finished:
                    return
        finally:
            job.aborted.set()

    async def abort(self, request_id: str) -> None:
        for job in list(self._jobs):
            if job.request_id == request_id:
                job.aborted.set()

    async def close(self) -> None:
        for job in list(self._jobs):
            job.aborted.set()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)


def _ring_ranges(start: int, stop: int) -> list[tuple[int, int]]:
    """Ring-row slices holding launches [start, stop) (two when they wrap)."""
    a, b = start % RING, start % RING + (stop - start)
    return [(a, b)] if b <= RING else [(a, RING), (0, b - RING)]


class LaneRouter:
    """TokenGenerator: the graph lane first; another generator (vLLM, or the torch generator) for the rest.

    - A lane that holds a crowd (`others_limit=None, handoff_at=None`, the factory's choice when the GPU fits
      CROWD_ROWS rows): every request the lane supports while it serves fewer requests than rows (a request's
      later sentences wait there for a row); vLLM takes the overflow, and nothing moves. The lane steps its
      streams in this process, where the decoder's CUDA stream overlaps with it; vLLM runs in a process of its
      own, and two processes on one GPU take turns rather than overlap.
    - A small lane (the defaults): the lane while vLLM is idle; once vLLM runs HANDOFF_AT streams, the lane's
      streams move to vLLM (prompt plus the tokens so far, the rest of the budget) and join its batch.

    Same sampling distribution on every path; the random streams differ, so a seed is reproducible only on the
    same path and, on the lane, in the same company (a batch's rows may round differently from a lone row), except
    on a fixed-shape lane (GraphLane `fixed_shapes`), whose rows never depend on their company."""

    def __init__(self, primary: Any, lane: GraphLane, others_limit: int | None = OTHERS_LIMIT,
                 handoff_at: int | None = HANDOFF_AT, overflow: bool = True, failover: bool = True,
                 events: EventSink = ignore_events) -> None:
        self.primary, self.lane, self.events = primary, lane, events
        self.others_limit, self.handoff_at = others_limit, handoff_at
        """None: the lane takes a stream whatever the primary runs / never hands a stream over (a lane that holds
        a crowd itself, or a primary slower than the lane)."""
        self.overflow = overflow
        """Requests beyond the lane's rows go to the primary (False: they wait for a row on the lane)."""
        self.enabled = True
        """False sends everything to the primary (the bench's A/B on one engine)."""
        self.failed = False
        """The lane failed once (out of memory, a failed replay): it takes no more streams."""
        self.failover = failover
        """A stream the lane fails goes on on the primary (False: the error reaches the caller; a deterministic
        engine must not change generators mid-sentence)."""
        self.primary_live = 0
        self.lane_streams = 0
        self.handoffs = 0

    concurrent_streams = True
    """Many streams at once (the lane queues a request's later sentences, the primary takes the rest)."""

    def __getattr__(self, name: str) -> Any:  # start_s, warmup_s, max_num_seqs ... are vLLM's
        return getattr(self.primary, name)

    def _use_lane(self, prompt: Prompt, opts: SamplingOptions, group: str) -> bool:
        if not self.enabled or self.failed:
            return False
        if self.others_limit is not None and self.primary_live >= self.others_limit:
            return False
        # fewer requests on the lane than rows, a later sentence of a request the lane serves (it waits for a row
        # there: the lane gives rows to requests without one first), or no overflow; the shape and vocabulary
        # check (it scans the ~8k allowed ids) last, so a busy engine does not pay it per stream
        groups = self.lane.groups()
        room = not self.overflow or group in groups or len(groups) < self.lane.rows
        return room and self.lane.supports(prompt, opts)

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        if self._use_lane(prompt, opts, request_id_group := request_of(request_id)):
            self.lane_streams += 1
            done: list[int] = []
            lane = self.lane.stream(prompt, opts, request_id, request_id_group)
            try:
                async for delta in lane:
                    done += delta
                    yield delta
                    if self.handoff_at is not None and self.primary_live >= self.handoff_at:
                        break
                else:
                    return
            except GenerationError as err:  # out of GPU memory, a failed replay: the primary carries on
                if not self.failover:
                    raise
                self.failed = True
                self.events(Notice(f"graph lane stopped ({err}); every stream runs on "
                                   f"{type(self.primary).__name__} now"))
            finally:
                await lane.aclose()
            if done and (done[-1] in self.lane.token_ids.stop_ids or len(done) >= opts.max_tokens):
                return
            self.handoffs += 1
            prompt = replace(prompt, ids=tuple(prompt.ids) + tuple(done))
            opts = replace(opts, max_tokens=opts.max_tokens - len(done))
        self.primary_live += 1
        try:
            async for delta in self.primary.stream(prompt, opts, request_id):
                yield delta
        finally:
            self.primary_live -= 1

    async def abort(self, request_id: str) -> None:
        await self.lane.abort(request_id)
        await self.primary.abort(request_id)

    async def close(self) -> None:
        await self.lane.close()
        await self.primary.close()


def _lane_error(err: BaseException) -> BaseException:
    if isinstance(err, (ValueError, GenerationError)):
        return err
    if "out of memory" in str(err).lower():
        return GenerationError("out of GPU memory while generating tokens (graph lane)")
    return GenerationError(f"graph lane failed: {type(err).__name__}: {err}")
