"""Provides LaneRunner, the graph lane's device half: the LLM's static copy, the rows' KV cache and every buffer a
step reads; prefills and decode steps, each one CUDA-graph launch once captured; and the read-back of their tokens.
Which jobs, rows and shapes to run is engine.lane_scheduler's choice; GraphLane (engine.backends.graph_gen) joins
the two.

Sampling is Gumbel-max over the top-k candidates: argmax(logits / T + G) with G = -log(E), E ~ Exp(1), is an
exact draw from softmax(logits / T) restricted to the candidates top-k and top-p keep; the noise comes from the
request's seeded generator before the first step, so the graph holds no RNG state and a seed gives the same
tokens on every run (alone on the lane: rows of a batch may round differently). Greedy (temperature 0) is top-1
with no noise.

A lane built with `repetition_penalty` (a family whose sampling has one: Orpheus) also keeps, per row, which allowed
ids its prompt holds or it drew (`seen`, set at the row's prefill and by every step) and applies the penalty to the
logits before the draw (engine.backends.torch_gen.repetition_penalty); other lanes capture none of these ops.

Without CUDA the same code runs eagerly (the CPU tests use that).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.backends import decode_kernels
from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.backends.qwen2_static import StaticQwen2
from engine.backends.torch_gen import repetition_penalty
from engine.config import SamplingOptions
from engine.lane_scheduler import LaneShapes

CANDIDATES = 64
"""Top-k candidates the graph keeps. Requests with top_k 0 (off) or above this go to vLLM (Spark's default is 50)."""
TOPK_CHUNKS = 16
"""The candidates are found in two rounds: top-k of each of this many slices of the logits, then of their union
(the same values as one top-k). torch.topk over the ~8k allowed logits is one thread block per row, a visible share
of a step. The head's width is padded to a multiple of this."""
FUSE_ROWS = 16
"""Decode steps of up to this many rows run the fused kernels (engine.backends.decode_kernels): faster than the
compiled tensor code at few rows, slower from a few dozen on. The fused projections' programs cover 16 rows each and read the weights again for every 16 rows;
cuBLAS's batched GEMMs read them once."""
RING = 512
"""Launches whose tokens the ring keeps: more than are ever in flight ((AHEAD + 1) bursts of 8 steps and one
admission's prefills, at most (ADMIT_NEW + ADMIT) / 8 + 3)."""
LANE_STREAM_PRIORITY = -1
"""CUDA stream priority of the lane (lower is higher; torch's streams default to 0, as the decoder's does)."""


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


@dataclass(frozen=True, slots=True)
class RowPenalties:
    """A penalised lane's repetition-penalty state: which ids of the head each row has seen, and its penalty."""

    seen: torch.Tensor
    """[rows, head width] bool: the head's ids the row's prompt holds or it drew (set at its prefill, so a reused
    row forgets its last job's)."""
    penalty: torch.Tensor
    """[rows] each row's repetition penalty (1.0: none, and its logits stay exactly as they are)."""
    drawn: torch.Tensor
    """[1] True: what a drawn id's place in `seen` becomes (a device tensor, for the captured steps)."""
    rows: torch.Tensor
    """[rows] 0, 1, ...: the rows a decode step runs, as an index."""

    @classmethod
    def new(cls, rows: int, width: int, device: torch.device) -> RowPenalties:
        return cls(torch.zeros(rows, width, dtype=torch.bool, device=device), torch.ones(rows, device=device),
                   torch.ones(1, dtype=torch.bool, device=device), torch.arange(rows, device=device))

    def apply(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`logits` [B, A] of `rows` [B] with each row's penalty applied (torch_gen.repetition_penalty)."""
        return repetition_penalty(logits, self.seen.index_select(0, rows), self.penalty.index_select(0, rows)[:, None])

    def mark(self, rows: torch.Tensor, drawn: torch.Tensor) -> None:
        """Each of `rows` [B] has drawn the head's id `drawn` [B]: seen from now on."""
        self.seen.index_put_((rows, drawn), self.drawn)


@dataclass(slots=True)
class ReadBack:
    """Launches [start, stop) (counted since the lane began) on their way to the host."""

    event: Any
    """Recorded after the copies, on CUDA (None: the tokens are there already)."""
    start: int
    stop: int
    began: Any = None
    """A timing event recorded before the first of these launches, on CUDA."""


class LaneRunner:
    """The lane's tensors and launches. A prefill writes prompts into their rows' caches and samples each one's
    first token; a decode step samples the next token of rows [0, rows). Every launch writes all rows' tokens into
    ring[launch % RING], which `read_back` copies to the host. On CUDA every launch shape of `shapes` is captured
    once as a graph and replayed; elsewhere (or with `capture=False`) the same code runs eagerly."""

    def __init__(self, model: torch.nn.Module | Qwen2Weights, allowed: tuple[int, ...], shapes: LaneShapes, *,
                 device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 compile_layers: bool = False, capture: bool | None = None, fused: bool | None = None,
                 fuse_rows: int = FUSE_ROWS, plan: decode_kernels.FusedPlan | None = None,
                 compile_prefill: bool | None = None, capture_mode: str = "global",
                 between: Callable[[str], None] | None = None, repetition_penalty: bool = False) -> None:
        """The arguments are GraphLane's (which documents them), less the scheduler's."""
        self.between = between
        """Called before each graph capture: a lane built in the background waits there for live streams."""
        self.penalised = repetition_penalty
        """The steps apply each row's repetition penalty (its ops are in the captured graphs)."""
        self.device = torch.device(device)
        self.shapes = shapes
        self.rows, self.max_len = shapes.rows, shapes.max_len
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
        with self.on_stream():
            self.model = StaticQwen2(model, self.max_len, self.device, dtype, own_cache=False)
            self._choose_steps(fused, compile_layers, compile_prefill)
            self.plan = plan if plan is not None else decode_kernels.plan_for()
            self._buffers(-(-len(allowed) // TOPK_CHUNKS) * TOPK_CHUNKS)
        self.allowed_now: tuple[int, ...] = ()
        self.allowed_at: dict[int, int] = {}
        """Each allowed id's place in the head (a prompt's `seen` row is built on the host from it)."""
        self.set_allowed(allowed)
        self.graphs: dict[tuple[str, int, int], torch.cuda.CUDAGraph] = {}
        """The captured launches by (kind, a, b): ("prefill", prompts, size) and ("decode", rows, span)."""
        self.capture_s = self._capture_all() if self.capture else 0.0
        self.launches = 0
        """Launches so far (the device's `launch` counter, mirrored)."""
        self.busy_ms = 0.0
        """GPU time of the launches read back so far (first launch's start to last launch's end, per read)."""
        self.idle_ms = 0.0
        """GPU time the lane's stream sat empty between two reads of one run of the worker: the host was late
        with the next launch (Python, the GIL), not the GPU slow with the last."""
        self._began: torch.cuda.Event | None = None
        self._last_end: torch.cuda.Event | None = None

    def _choose_steps(self, fused: bool | None, compile_layers: bool, compile_prefill: bool | None) -> None:
        """Fused kernels or tensor code for the decode steps, and what Inductor compiles."""
        wanted = (self.device.type == "cuda" and decode_kernels.available() and decode_kernels.pays_for(self.model.hidden)
                  if fused is None else fused)
        self.fused = wanted and decode_kernels.supports(self.model.head_dim)
        tensor_steps = not self.fused or self.rows > self.fuse_rows
        compiled_prefill = compile_prefill is True or (compile_prefill is None and tensor_steps)
        if compile_layers and (tensor_steps or compiled_prefill):
            # a lane whose every step is fused and whose prefills are plain compiles nothing: not even
            # importing the compiler, which a fresh process would pay for before its first word
            self.model.compile_layers(prefill=compiled_prefill)

    # ---- static state ----------------------------------------------------------------------------------------

    def _buffers(self, width: int) -> None:
        dev, rows = self.device, self.rows
        long: dict[str, Any] = dict(device=dev, dtype=torch.long)
        most = self.shapes.prefill_batches[-1]
        longest = self.shapes.prefills[-1]
        self.prompts = torch.zeros(most, longest, **long)
        """A prefill's prompts, right-padded to its bucket."""
        self.lengths = torch.ones(most, **long)
        """Their real lengths (the prefill graph samples after position length - 1 of each)."""
        self.admit_rows = torch.zeros(most, **long)
        """The row each prompt of a prefill fills."""
        self.staging = self.model.new_rows_cache(most, longest)
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
        self.penalties = RowPenalties.new(rows, width, dev) if self.penalised else None
        self.step_state = decode_kernels.StepState(self.temperature, self.top_k, self.top_p, self.noise, self.allowed,
                                                   self.tokens, self.steps, self.positions, self.ring, self.launch,
                                                   self.max_len)
        """The buffers a fused step's `decode_kernels.sample` reads and moves on."""

    @property
    def head_width(self) -> int:
        """Allowed ids the head holds at most (its rows, padded to a multiple of TOPK_CHUNKS)."""
        return self.allowed.numel()

    def set_allowed(self, allowed: tuple[int, ...]) -> None:
        """Point the head at these vocabulary ids (padding rows get -inf logits); every row shares them."""
        if allowed is self.allowed_now or allowed == self.allowed_now:  # identity first: a shared 8,195-id tuple
            return
        width = self.head_width
        ids = torch.tensor(list(allowed) + [allowed[0]] * (width - len(allowed)), dtype=torch.long)
        with self.on_stream():
            self.allowed.copy_(ids)
            self.head.copy_(self.model.head_rows(self.allowed))
            if self.head_t is not None:
                self.head_t.copy_(self.head.t())
            self.head_bias.zero_()
            self.head_bias[len(allowed):] = float("-inf")
        self.allowed_now = allowed
        self.allowed_at = {token: place for place, token in enumerate(allowed)}

    def on_stream(self):
        """The lane's CUDA stream as the current one (nothing off CUDA)."""
        return torch.cuda.stream(self.cuda_stream) if self.cuda_stream is not None else contextlib.nullcontext()

    # ---- launches --------------------------------------------------------------------------------------------

    def prefill(self, rows: list[int], prompts: list[tuple[int, ...]], options: list[SamplingOptions],
                size: int) -> None:
        """Launch one prefill of these prompts (a captured batch size), padded to `size`, each into its row with
        its sampling options. Nothing here waits for the GPU: the lane's stream may still hold a burst, and a copy
        from pageable memory (or an indexed write) would wait for it before the new stream's prefill is queued."""
        batch = self._host(torch.zeros(len(prompts), size, dtype=torch.long))
        for i, (row, ids, opts) in enumerate(zip(rows, prompts, options)):
            batch[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            self._sampling(row, opts, ids)
        self.prompts[:len(prompts), :size].copy_(batch, non_blocking=True)
        self.lengths[:len(prompts)].copy_(self._host(torch.tensor([len(ids) for ids in prompts])), non_blocking=True)
        self.admit_rows[:len(prompts)].copy_(self._host(torch.tensor(rows)), non_blocking=True)
        self._launch("prefill", len(prompts), size)

    def decode(self, rows: int, span: int) -> None:
        """Launch one decode step of rows [0, rows) over `span` positions."""
        self._launch("decode", rows, span)

    def _host(self, values: torch.Tensor) -> torch.Tensor:
        """`values` in page-locked memory on CUDA, so a copy from it to the GPU is queued without waiting."""
        return values.pin_memory() if self.device.type == "cuda" else values

    def _sampling(self, row: int, opts: SamplingOptions, prompt: tuple[int, ...]) -> None:
        """A request's temperature, top-k, top-p and noise into its row; on a penalised lane its penalty, and its
        prompt's ids as the row's `seen` (what the row's last job drew is forgotten). The writes are kernels and
        copies queued on the lane's stream (fill_, not an indexed store; `seen` built on the host: `isin` syncs)."""
        greedy = opts.temperature == 0
        self.temperature[row].fill_(1.0 if greedy else opts.temperature)
        self.top_k[row].fill_(1 if greedy else opts.top_k)
        self.top_p[row].fill_(1.0 if greedy else opts.top_p)
        if self.penalties is not None:
            self.penalties.penalty[row].fill_(opts.repetition_penalty)
            seen = torch.zeros(self.head_width, dtype=torch.bool)
            seen[[self.allowed_at[token] for token in prompt if token in self.allowed_at]] = True
            self.penalties.seen[row].copy_(self._host(seen), non_blocking=True)
        steps = opts.max_tokens
        if greedy:
            self.noise[row, :steps].zero_()
        else:
            self.noise[row, :steps].copy_(gumbel(steps, CANDIDATES, opts.seed, self.device))

    def _launch(self, kind: str, a: int, b: int) -> None:
        if self.cuda_stream is not None and self._began is None:  # the next read's first launch: time it
            self._began = torch.cuda.Event(enable_timing=True)
            self._began.record(self.cuda_stream)
        graph = self.graphs.get((kind, a, b))
        if graph is not None:
            graph.replay()
        elif kind == "prefill":
            self._prefill_step(a, b)
        else:
            self._decode_step(a, b)
        self.launches += 1

    # ---- the captured steps ----------------------------------------------------------------------------------

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, A] float logits over the allowed ids for hidden states [B, H]."""
        return torch.mm(hidden, self.head.t()).float() + self.head_bias

    def _record(self) -> None:
        """Every row's token into this launch's ring row; the launch counter moves on."""
        self.ring.index_copy_(0, torch.remainder(self.launch, RING), self.tokens.view(1, -1))
        self.launch.add_(1)

    def _prefill_step(self, batch: int, size: int) -> None:
        """Prompts [0, batch) into their rows (`admit_rows`): each row's cache, first token, position and step."""
        k_staged, v_staged = self.staging
        staging = (k_staged[:, :batch, :, :size], v_staged[:, :batch, :, :size])
        hidden = self.model.prefill_rows(self.prompts[:batch, :size], staging)
        rows, lengths = self.admit_rows[:batch], self.lengths[:batch]
        last = torch.arange(batch, device=self.device) * size + lengths - 1
        logits = self._logits(hidden.index_select(0, last))
        if self.penalties is not None:
            logits = self.penalties.apply(logits, rows)
        first = pick(logits, self.temperature.index_select(0, rows), self.top_k.index_select(0, rows),
                     self.top_p.index_select(0, rows), self.noise[:, 0].index_select(0, rows))
        if self.penalties is not None:
            self.penalties.mark(rows, first)
        self.tokens.index_copy_(0, rows, self.allowed.index_select(0, first))
        self.positions.index_copy_(0, rows, lengths)
        self.steps.index_fill_(0, rows, 1)
        for cache, staged in zip((self.k_rows, self.v_rows), staging):
            cache[:, :, :, :size].index_copy_(1, rows, staged)
        self._record()

    def head_for(self, plan: decode_kernels.FusedPlan) -> torch.Tensor:
        """The head [H, A] as the fused kernels of `plan` read it."""
        if plan.k_major:
            return self.head.t()
        if self.head_t is None:
            raise ValueError("this lane runs no fused steps: it keeps no transposed head")
        return self.head_t

    def _fuses(self, rows: int) -> bool:
        return self.fused and rows <= self.fuse_rows

    def _decode_step(self, rows: int, span: int) -> None:
        """One token for each of rows [0, rows)."""
        if self._fuses(rows):  # every row attends over its own length: `span` does not matter
            x = self.model.forward_fused(self.tokens[:rows], self.positions[:rows],
                                         (self.k_rows[:, :rows], self.v_rows[:, :rows]), self.plan)
            logits = self.model.logits_fused(x, self.head_for(self.plan), self.head_bias, self.plan)
            # the draw, tokens, steps, positions and ring row in one kernel (a penalised lane draws below)
            if (self.plan.one_sample and not self.penalised
                    and decode_kernels.can_sample(logits.shape[1], CANDIDATES)):
                decode_kernels.sample(logits, self.step_state, CANDIDATES, self.model.counts, pdl=self.plan.pdl,
                                      topk=self.plan.sample_topk)
                return
        elif rows == 1:  # the single-sequence forward: its cache write fuses into the rotary kernel
            logits = self._logits(self.model.forward(self.tokens[:1], self.positions[:1], span,
                                                     cache=(self.k_rows[:, 0], self.v_rows[:, 0])))
        else:
            logits = self._logits(self.model.forward_rows(self.tokens[:rows], self.positions[:rows], span,
                                                          (self.k_rows[:, :rows], self.v_rows[:, :rows])))
        if self.penalties is not None:
            logits = self.penalties.apply(logits, self.penalties.rows[:rows])
        steps = self.steps[:rows]
        noise = self.noise[:rows].gather(1, steps.view(rows, 1, 1).expand(rows, 1, CANDIDATES)).view(rows, -1)
        chosen = pick(logits, self.temperature[:rows], self.top_k[:rows], self.top_p[:rows], noise)
        if self.penalties is not None:
            self.penalties.mark(self.penalties.rows[:rows], chosen)
        self.tokens[:rows].copy_(self.allowed.index_select(0, chosen))
        # a row whose stream has ended keeps stepping until its row is reused: never past the buffers' ends
        steps.add_(1).clamp_max_(self.max_len)
        self.positions[:rows].add_(1).clamp_max_(self.max_len - 1)
        self._record()

    @torch.inference_mode()
    def _capture_all(self) -> float:
        """One graph per (prompts, bucket) prefill and per (rows, span) decode (a fused decode: one per rows, the
        same graph for every span), sharing one memory pool (they never run at once)."""
        t0 = time.perf_counter()
        if self.cuda_stream is None:
            raise RuntimeError("CUDA graphs are captured on a GPU only")
        pool = torch.cuda.graph_pool_handle()
        shapes = [("prefill", batch, size) for batch in self.shapes.prefill_batches for size in self.shapes.prefills]
        shapes += [("decode", rows, span) for rows in self.shapes.row_buckets for span in self.shapes.spans]
        with self.on_stream():
            self.lengths.fill_(1)
            self.admit_rows.copy_(torch.arange(self.admit_rows.numel(), device=self.device))
            for kind, a, b in shapes:
                if kind == "decode" and self._fuses(a) and b != self.shapes.spans[0]:
                    self.graphs[(kind, a, b)] = self.graphs[(kind, a, self.shapes.spans[0])]  # the same step
                    continue
                if self.between is not None:
                    self.between(f"lane {kind} {a}x{b}")
                self.graphs[(kind, a, b)] = self._capture(kind, a, b, pool)
            self.positions.zero_()
            self.steps.zero_()
            self.launch.zero_()
            self.cuda_stream.synchronize()
        return time.perf_counter() - t0

    def _capture(self, kind: str, a: int, b: int, pool: Any) -> torch.cuda.CUDAGraph:
        fn = (lambda: self._prefill_step(a, b)) if kind == "prefill" else (lambda: self._decode_step(a, b))
        for _ in range(2):  # first calls: cuBLAS handles, compiles, allocator warm-up
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=self.cuda_stream, capture_error_mode=self.capture_mode):
            fn()
        graph.replay()  # a graph's first launch uploads it to the GPU: here, not in a request
        return graph

    # ---- read-backs ------------------------------------------------------------------------------------------

    def new_run(self) -> None:
        """A worker run begins: the stream's gap before it is no job's wait."""
        self._began = self._last_end = None

    def read_back(self, count: int) -> ReadBack:
        """Queue copies of the ring rows of the last `count` launches to the host."""
        start, stop = self.launches - count, self.launches
        for a, b in _ring_ranges(start, stop):
            self.host[a:b].copy_(self.ring[a:b], non_blocking=self.cuda_stream is not None)
        event = None
        if self.cuda_stream is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.cuda_stream)
        read = ReadBack(event, start, stop, self._began)
        self._began = None
        return read

    def tokens_of(self, read: ReadBack) -> list[list[int]]:
        """Wait for a read-back: per launch of it, every row's token."""
        if read.event is not None:
            read.event.synchronize()
            self._time(read)
        return [self.host[launch % RING].tolist() for launch in range(read.start, read.stop)]

    def _time(self, read: ReadBack) -> None:
        """Add the read's launches to busy_ms and the empty stream before them to idle_ms."""
        if read.began is None:
            return
        if self._last_end is not None:
            self.idle_ms += max(0.0, self._last_end.elapsed_time(read.began))
        self.busy_ms += read.began.elapsed_time(read.event)
        self._last_end = read.event

    def resync(self) -> None:
        """Re-read the launch counter from the device: a failure may have cut a burst short."""
        with contextlib.suppress(Exception):
            self.launches = int(self.launch.item())


def _ring_ranges(start: int, stop: int) -> list[tuple[int, int]]:
    """Ring-row slices holding launches [start, stop) (two when they wrap)."""
    a, b = start % RING, start % RING + (stop - start)
    return [(a, b)] if b <= RING else [(a, RING), (0, b - RING)]
