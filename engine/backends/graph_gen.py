"""Provides GraphLane (one stream at a time, each step one CUDA-graph launch) and LaneRouter (lane or vLLM).

Why: at one stream vLLM took 42-57 ms to its 20th token (first audio needs ~20) at 1.45 ms per greedy step and
1.74 with top-k/top-p (docs/benchmarks.md). The lane runs the LLM in this process (engine.backends.qwen2_static)
with everything for a step (forward, logits over the allowed ids only, top-k/top-p sampling) captured once per
shape as a CUDA graph, so a step is one launch and the GPU never waits for Python (1.21 ms per token, 20th token at
26 ms on an H200). The host launches a few steps ahead and reads tokens back in small bursts.

Sampling is Gumbel-max over the top-k candidates: argmax(logits / T + G) with G = -log(E), E ~ Exp(1), is an
exact draw from softmax(logits / T) restricted to the candidates top-k and top-p keep; the noise comes from the
request's seeded generator before the first step, so the graph holds no RNG state and a seed gives the same
tokens on every run. Greedy (temperature 0) is top-1 with no noise.

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

from engine.backends.qwen2_static import StaticQwen2
from engine.config import SamplingOptions, request_of
from engine.errors import GenerationError
from engine.events import EventSink, Notice, ignore_events
from engine.prompt import Prompt

CANDIDATES = 64
"""Top-k candidates the graph keeps. Requests with top_k 0 (off) or above this go to vLLM (Spark's default is 50)."""
PREFILL_BUCKETS = (32, 64, 128, 256, 512)
"""Prompt lengths are padded up to one of these (one graph each); longer prompts go to vLLM. A sentence prompt
is ~40 ids plus its text tokens."""
SPAN_BUCKETS = (128, 256, 512, 1024, 2048, 4096)
"""Attention spans (one decode graph each): a step attends over the smallest span holding its position, so short
sentences do not pay for the longest one."""
BURST = 2
"""Steps per read-back: tokens reach the caller at most BURST - 1 steps late (~1 ms); a read costs ~20 us."""
AHEAD = 2
"""Bursts in flight while the host reads one: the GPU never idles on Python."""
OTHERS_LIMIT = 1
"""The lane takes a stream only while vLLM runs fewer than this many (1: only when vLLM is idle)."""
HANDOFF_AT = 2
"""A lane stream moves to vLLM once vLLM runs this many: a crowd has arrived and joins one batch there."""


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
    """Index [1] into `logits` [A] drawn by Gumbel-max among the top CANDIDATES after temperature, top-k (a [1]
    tensor <= CANDIDATES) and top-p (keep while the mass of strictly more likely candidates is below top_p, so
    the most likely always stays); `noise` [CANDIDATES] is Gumbel noise (zeros: the most likely). Fixed shapes,
    no host sync: it runs inside the captured step."""
    values, index = torch.topk(logits, CANDIDATES)
    rank = torch.arange(CANDIDATES, device=logits.device)
    values = (values / temperature).masked_fill(rank >= top_k, float("-inf"))
    probs = torch.softmax(values, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    values = values.masked_fill(before >= top_p, float("-inf"))
    return index.index_select(0, torch.argmax(values + noise).view(1))


def bucket(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest size >= n (None when n exceeds them all)."""
    return next((s for s in sizes if s >= n), None)


@dataclass(slots=True, eq=False)
class _Job:
    """One request on the lane: what to run and where its tokens go."""

    ids: tuple[int, ...]
    opts: SamplingOptions
    allowed: tuple[int, ...]
    deliver: Callable[..., None]
    request_id: str
    group: str
    aborted: threading.Event = field(default_factory=threading.Event)


class GraphLane:
    """Batch-1 token generator whose prefill and decode steps are CUDA graphs (eager on the CPU)."""

    def __init__(self, model: torch.nn.Module, token_ids: Any, allowed: tuple[int, ...], *,
                 device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 max_len: int = SPAN_BUCKETS[-1], compile_layers: bool = False, capture: bool | None = None) -> None:
        self.device = torch.device(device)
        self.token_ids = token_ids
        self._stop_ids = frozenset(token_ids.stop_ids)
        self.max_len = max_len
        self.spans = tuple(s for s in SPAN_BUCKETS if s < max_len) + (max_len,)
        self.prefills = tuple(p for p in PREFILL_BUCKETS if p <= max_len)
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.cuda_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        with self._on_stream():
            self.model = StaticQwen2(model, max_len, self.device, dtype, compile_layers=compile_layers)
            self._buffers(len(allowed))
        self.allowed_now: tuple[int, ...] = ()
        self._set_allowed(allowed)
        self._graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.capture_s = self._capture_all() if self.capture else 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graph-lane")
        self._jobs: deque[_Job] = deque()
        """Jobs queued or running, oldest first (the router reads their groups)."""
        self.served = 0

    # ---- static state ----------------------------------------------------------------------------------------

    def _buffers(self, width: int) -> None:
        dev = self.device
        long = dict(device=dev, dtype=torch.long)
        self.prompt = torch.zeros(self.prefills[-1], **long)
        self.length = torch.ones(1, **long)
        """Real prompt length (the prefill graph samples after position length - 1)."""
        self.token = torch.zeros(1, **long)
        self.position = torch.zeros(1, **long)
        self.step = torch.zeros(1, **long)
        self.out = torch.zeros(self.max_len + 1, **long)
        self.noise = torch.zeros(self.max_len + 1, CANDIDATES, device=dev)
        self.temperature = torch.ones(1, device=dev)
        self.top_k = torch.ones(1, **long)
        self.top_p = torch.ones(1, device=dev)
        self.arange = torch.arange(self.prefills[-1], **long)
        self.allowed = torch.zeros(width, **long)
        self.head = torch.zeros(width, self.model.hidden, device=dev, dtype=self.model.dtype)
        self.head_bias = torch.zeros(width, device=dev)
        self.host = torch.zeros(self.max_len + 1, dtype=torch.long, pin_memory=dev.type == "cuda")

    def _set_allowed(self, allowed: tuple[int, ...]) -> None:
        """Point the head at these vocabulary ids (padding rows get -inf logits)."""
        if allowed == self.allowed_now:
            return
        width = self.allowed.numel()
        ids = torch.tensor(list(allowed) + [allowed[0]] * (width - len(allowed)), dtype=torch.long)
        with self._on_stream():
            self.allowed.copy_(ids)
            self.head.copy_(self.model.head_rows(self.allowed))
            self.head_bias.zero_()
            self.head_bias[len(allowed):] = float("-inf")
        self.allowed_now = allowed

    def _on_stream(self):
        return torch.cuda.stream(self.cuda_stream) if self.cuda_stream is not None else contextlib.nullcontext()

    # ---- the captured steps ----------------------------------------------------------------------------------

    def _sample(self, hidden: torch.Tensor) -> None:
        """From the last hidden state [1, H]: the next token into out[step] and token; step += 1."""
        logits = torch.mv(self.head, hidden[0]).float() + self.head_bias  # [A]
        row = pick(logits, self.temperature, self.top_k, self.top_p, self.noise.index_select(0, self.step)[0])
        token = self.allowed.index_select(0, row)
        self.out.index_copy_(0, self.step, token)
        self.token.copy_(token)
        self.step.add_(1)

    def _prefill(self, size: int) -> None:
        hidden = self.model.forward(self.prompt[:size], self.arange[:size], size)
        self.step.zero_()
        self._sample(hidden.index_select(0, self.length - 1))
        self.position.copy_(self.length)

    def _decode(self, span: int) -> None:
        self._sample(self.model.forward(self.token, self.position, span))
        self.position.add_(1)

    def _run(self, kind: str, size: int) -> None:
        graph = self._graphs.get((kind, size))
        if graph is not None:
            graph.replay()
        elif kind == "prefill":
            self._prefill(size)
        else:
            self._decode(size)

    @torch.inference_mode()
    def _capture_all(self) -> float:
        """One graph per prefill bucket and per span, sharing one memory pool (they never run at once)."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        with self._on_stream():
            self.length.fill_(1)
            for kind, sizes, fn in (("prefill", self.prefills, self._prefill), ("decode", self.spans, self._decode)):
                for size in sizes:
                    for _ in range(2):  # first calls: cuBLAS handles, compiles, allocator warm-up
                        self.position.zero_()
                        fn(size)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=self.cuda_stream):
                        fn(size)
                    self._graphs[(kind, size)] = graph
            self.cuda_stream.synchronize()
        return time.perf_counter() - t0

    # ---- one request (on the lane's worker thread) -----------------------------------------------------------

    def supports(self, prompt: Prompt, opts: SamplingOptions) -> bool:
        """Whether this request fits the captured shapes and sampler."""
        allowed = prompt.allowed_ids
        return (bool(prompt.ids) and len(prompt.ids) <= self.prefills[-1]
                and len(prompt.ids) + opts.max_tokens <= self.max_len
                and allowed is not None and 0 < len(allowed) <= self.allowed.numel()
                and (opts.temperature == 0 or 0 < opts.top_k <= CANDIDATES)
                # an id outside the vocabulary would fault inside a graph replay, and a device-side fault ends
                # every CUDA call of this process (the decoder's too): such a request goes elsewhere
                and self._in_vocab(prompt.ids) and self._in_vocab(allowed))

    def _in_vocab(self, ids: Any) -> bool:
        return 0 <= min(ids) and max(ids) < self.model.vocab_size

    def _start(self, job: _Job) -> None:
        ids, opts = job.ids, job.opts
        self._set_allowed(job.allowed)
        greedy = opts.temperature == 0
        self.prompt[:len(ids)].copy_(torch.tensor(ids, dtype=torch.long))
        self.length.fill_(len(ids))
        self.temperature.fill_(1.0 if greedy else opts.temperature)
        self.top_k.fill_(1 if greedy else opts.top_k)
        self.top_p.fill_(1.0 if greedy else opts.top_p)
        steps = opts.max_tokens
        if greedy:
            self.noise[:steps].zero_()
        else:
            self.noise[:steps].copy_(gumbel(steps, CANDIDATES, opts.seed, self.device))
        self._run("prefill", bucket(len(ids), self.prefills))

    @torch.inference_mode()
    def run(self, job: _Job) -> None:
        """Generate job's tokens, delivering ("tokens", ids, finished) in bursts, then ("end", None)."""
        try:
            if not job.aborted.is_set():
                with self._on_stream():
                    self._generate(job)
                self.served += 1
        except Exception as err:  # noqa: BLE001 - raised in the consumer
            job.deliver("error", err)
        finally:
            self._jobs.remove(job)
            job.deliver("end", None)

    def _generate(self, job: _Job) -> None:
        n, limit = len(job.ids), job.opts.max_tokens
        self._start(job)
        pending: deque[tuple[Any, int, int]] = deque([self._read_back(0, 1)])
        launched = 1
        while pending:
            while launched < limit and len(pending) <= AHEAD:
                stop = min(limit, launched + BURST)
                for k in range(launched, stop):  # token k-1 is fed at position n + k - 1
                    self._run("decode", bucket(n + k, self.spans))
                pending.append(self._read_back(launched, stop))
                launched = stop
            event, start, stop = pending.popleft()
            if event is not None:
                event.synchronize()
            tokens = self.host[start:stop].tolist()
            for i, t in enumerate(tokens):
                if t in self._stop_ids:
                    job.deliver("tokens", tokens[:i + 1], True)
                    return
            if job.aborted.is_set():
                return
            job.deliver("tokens", tokens, stop >= limit)

    def _read_back(self, start: int, stop: int) -> tuple[Any, int, int]:
        """Queue a copy of out[start:stop] to the host; (event to wait on, start, stop)."""
        if self.cuda_stream is None:
            self.host[start:stop].copy_(self.out[start:stop])
            return None, start, stop
        self.host[start:stop].copy_(self.out[start:stop], non_blocking=True)
        event = torch.cuda.Event()
        event.record(self.cuda_stream)
        return event, start, stop

    # ---- TokenGenerator --------------------------------------------------------------------------------------

    @property
    def load(self) -> int:
        return len(self._jobs)

    def groups(self) -> set[str]:
        return {job.group for job in list(self._jobs)}

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str,
                     group: str | None = None) -> AsyncIterator[list[int]]:
        """Yield token deltas (stop id included when reached); jobs run one at a time, in arrival order."""
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
        try:
            self._executor.submit(self.run, job)
        except RuntimeError as err:  # closed
            self._jobs.remove(job)
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


class LaneRouter:
    """TokenGenerator: the graph lane for a lone stream (and the later sentences of its request), vLLM for
    everything else. When vLLM gets busy while the lane runs, the lane's stream moves to vLLM (its prompt plus the
    tokens so far, the rest of its budget): two processes on one GPU take turns rather than overlap, so a lane
    running beside a batch competes with it (a lane that kept its stream measured TTFA p95 at 32 streams 161 vs
    139 ms in run 11, though the order of runs moves p95 by as much: docs/benchmarks.md). Same sampling
    distribution on both; the random streams differ, so a seed is reproducible only on the same path
    (deterministic engines have no lane)."""

    def __init__(self, primary: Any, lane: GraphLane, others_limit: int | None = OTHERS_LIMIT,
                 handoff_at: int | None = HANDOFF_AT, events: EventSink = ignore_events) -> None:
        self.primary, self.lane, self.events = primary, lane, events
        self.others_limit, self.handoff_at = others_limit, handoff_at
        """None: the lane takes a stream whatever the primary runs / never hands a stream over (a primary slower
        than the lane, like the eager torch generator)."""
        self.enabled = True
        """False sends everything to the primary (the bench's A/B on one engine)."""
        self.failed = False
        """The lane failed once (out of memory, a failed replay): it takes no more streams."""
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
        # idle, or a later sentence of the request the lane serves (it queues behind the earlier ones); the shape
        # and vocabulary check (it scans the ~8k allowed ids) last, so a busy engine does not pay it per stream
        return (self.lane.load == 0 or self.lane.groups() == {group}) and self.lane.supports(prompt, opts)

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
