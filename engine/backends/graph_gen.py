"""Provides GraphLane (up to `rows` streams stepped together, each step one CUDA-graph launch) and LaneRouter.

Why: vLLM takes tens of milliseconds to a stream's 20th token (first audio needs ~20), at a slower step than ours.
The lane runs the LLM in this process (engine.backends.qwen2_static) with everything for a
step (forward, logits over the allowed ids only, top-k/top-p sampling) captured once per shape as a CUDA graph, so
a step is one launch and the GPU never waits for Python. The host launches a few steps ahead and reads tokens back
in small bursts.

GraphLane joins two halves: a LaneScheduler (engine.lane_scheduler, pure: which jobs hold which rows, what each
launch and read-back does for them) and a LaneRunner (engine.backends.lane_runner: the tensors, the graphs, the
launches). Its worker thread asks the scheduler for a plan, has the runner launch it, and reports back.

Without CUDA the same code runs eagerly (the CPU tests use that); the router only builds a lane on a GPU.
"""
from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, AsyncGenerator, AsyncIterator, Callable

import torch

from engine.backends import decode_kernels
from engine.backends.base import DeadlineScheduled
from engine.backends.lane_runner import CANDIDATES, FUSE_ROWS, LaneRunner, ReadBack
from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.config import SamplingOptions, request_of
from engine.deadlines import DeadlineBoard
from engine.errors import GenerationError
from engine.events import EventSink, Notice, ignore_events
from engine.lane_scheduler import (CROWD_MEMORY_SHARE, FIXED_MEMORY_SHARE, ROW_BUCKETS, SPAN_BUCKETS, Launch, LaneJob,
                                   LaneScheduler, LaneShapes)
from engine.prompt import Prompt

AHEAD = 1
"""Bursts in flight while the host reads one: the GPU never idles on Python. One, not more: a new stream's prefill
is launched behind every burst in flight, so each one more is a burst of steps added to its first audio."""
ROWS = 8
"""Streams the lane steps at once, by default (the factory sizes it to the GPU: `rows_for`). A step over 8 rows
takes about as long as over 1: the weights are read once whatever the rows."""
OTHERS_LIMIT = 1
"""The lane takes a stream only while vLLM runs fewer than this many (1: only when vLLM is idle)."""
HANDOFF_AT = 2
"""A small lane's stream moves to vLLM once vLLM runs this many: a crowd has arrived and joins one batch there."""
CROWD_ROWS = 32
"""A lane of this many rows or more keeps its streams and takes new ones while it has rows (see LaneRouter)."""
FIXED_SHAPES = "lab/lane_invariance_probe.py"
"""Why `GraphLane(fixed_shapes=True)` is batch invariant: on the plain tensor code, a decode row's hidden state was
bitwise the same whatever the other rows held, how many rows ran and in which order, but not over every span, and
a prompt prefilled alone differed from the same prompt packed with others (the probe named). So a
fixed-shape lane runs one span, one row count and one prompt per prefill; the per-request Gumbel noise already
made the draws independent of the row."""


def row_bytes(cfg: Any, max_len: int = SPAN_BUCKETS[-1], dtype_bytes: int = 2) -> int:
    """One row's KV cache: keys and values of every layer over `max_len` positions."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * max_len * head_dim * dtype_bytes


def fixed_rows_for(gpu_bytes: int, row_bytes: int, most: int, share: float = FIXED_MEMORY_SHARE) -> int:
    """Rows of a fixed-shape lane: `most` where `share` of the GPU holds their KV cache, else as many as it holds
    (at least 1; the share is the family's LaneSizing.fixed_share)."""
    return max(1, min(most, int(share * gpu_bytes // row_bytes)))


def rows_for(gpu_bytes: int, row_bytes: int, most: int | None = None, share: float = CROWD_MEMORY_SHARE) -> int:
    """The largest row bucket (at most `most`) whose KV cache fits `share` of a GPU of `gpu_bytes` (at least 1;
    the share is the family's LaneSizing.memory_share, CROWD_MEMORY_SHARE by default)."""
    fits = [rows for rows in ROW_BUCKETS
            if rows * row_bytes <= share * gpu_bytes and (most is None or rows <= most)]
    return fits[-1] if fits else 1


def _part(part: str, name: str, doc: str, settable: bool = False) -> property:
    """GraphLane's attribute `name`, as its `part` (scheduler or runner) keeps it."""
    def get(lane: GraphLane) -> Any:
        return getattr(getattr(lane, part), name)

    def put(lane: GraphLane, value: Any) -> None:
        setattr(getattr(lane, part), name, value)

    return property(get, put if settable else None, doc=doc)


class GraphLane:
    """Token generator for up to `rows` streams at once whose prefill and decode steps are CUDA graphs (eager on
    the CPU). A step runs every admitted stream as one row of a batch: rows cost little more than one (the weights
    are read once per step), so a request's sentences, or a few requests, run side by side at the lone stream's
    speed. Streams beyond `rows` wait for a free row.

    `scheduler` decides what runs, `runner` launches it; one worker thread (`drive`) goes between them."""

    def __init__(self, model: torch.nn.Module | Qwen2Weights, token_ids: Any, allowed: tuple[int, ...], *,
                 device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 max_len: int = SPAN_BUCKETS[-1], rows: int = ROWS, compile_layers: bool = False,
                 capture: bool | None = None, fused: bool | None = None, fuse_rows: int = FUSE_ROWS,
                 plan: decode_kernels.FusedPlan | None = None, compile_prefill: bool | None = None,
                 capture_mode: str = "global", fixed_shapes: bool = False,
                 between: Callable[[str], None] | None = None, repetition_penalty: bool = False) -> None:
        """`fused`: decode steps of up to `fuse_rows` rows run the fused kernels (default: on CUDA when Triton is
        there); more rows, prefills and `fused=False` run StaticQwen2's tensor code. `plan`: which variant of the
        fused step (default decode_kernels.PLAN, less what this GPU cannot run). `compile_prefill` (with
        `compile_layers`): Inductor compiles the prefills too; default only where some decode steps run the
        tensor code (a lane whose every step is fused would compile just its prefills, once per shape).
        `capture_mode`: torch.cuda.graph's capture_error_mode (thread_local for a lane built while other threads
        use the GPU). `fixed_shapes`: every decode step runs all `rows` over a span of `max_len`, and every prefill
        holds one prompt, so a row's arithmetic never depends on what else the lane runs (see FIXED_SHAPES).
        `between`: called before each graph capture, with what it captures (LaneRunner). `repetition_penalty`: the steps apply each
        request's repetition penalty (a lane for a family whose sampling has one: the extra ops are captured only
        then); a lane without takes no request that asks for one (`supports`)."""
        if fixed_shapes and (fused or compile_layers):
            raise ValueError("fixed shapes run the plain tensor code: no fused kernels, no compiled layers")
        self.token_ids = token_ids
        self.rows, self.max_len = rows, max_len
        self.shapes = LaneShapes.of(rows, max_len, fixed_shapes)
        self.runner = LaneRunner(model, allowed, self.shapes, device=device, dtype=dtype,
                                 compile_layers=compile_layers, capture=capture,
                                 fused=False if fixed_shapes else fused, fuse_rows=fuse_rows, plan=plan,
                                 compile_prefill=compile_prefill, capture_mode=capture_mode, between=between,
                                 repetition_penalty=repetition_penalty)
        self.scheduler = LaneScheduler(self.shapes, token_ids.stop_ids, allowed)
        self.fused, self.capture_s = self.runner.fused, self.runner.capture_s
        self.device = self.runner.device
        """The device its weights, cache and graphs are on."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graph-lane")
        self._vocab_checked: tuple[int, ...] | None = None
        """The last allowed set found inside the vocabulary."""

    load = _part("scheduler", "load", "Jobs waiting, running or draining.")
    served = _part("scheduler", "served", "Jobs that got all their tokens.")
    bursts = _part("scheduler", "bursts", "Steps per read-back by rows running (the bench swaps it).", settable=True)
    busy_ms = _part("runner", "busy_ms", "GPU time of the launches read back so far.")
    idle_ms = _part("runner", "idle_ms", "GPU time the lane's stream sat empty between two reads: the host was late.")

    # ---- the worker: admit, step, read back ------------------------------------------------------------------

    def supports(self, prompt: Prompt, opts: SamplingOptions) -> bool:
        """Whether this request fits the captured shapes and sampler."""
        allowed = prompt.allowed_ids
        return (bool(prompt.ids) and len(prompt.ids) <= self.shapes.prefills[-1]
                and self.shapes.positions_short(len(prompt.ids), opts.max_tokens) is None
                and allowed is not None and 0 < len(allowed) <= self.runner.head_width
                and (opts.temperature == 0 or 0 < opts.top_k <= CANDIDATES)
                and (opts.repetition_penalty == 1.0 or self.runner.penalised)  # never silently unpenalised
                # an id outside the vocabulary would fault inside a graph replay, and a device-side fault ends
                # every CUDA call of this process (the decoder's too): such a request goes elsewhere
                and self._in_vocab(prompt.ids) and self._allowed_in_vocab(allowed))

    def _misfit(self, prompt: Prompt, opts: SamplingOptions) -> str:
        """Why `supports` refuses the request, in words: its positions first (a row's KV cache ends at max_len)."""
        short = self.shapes.positions_short(len(prompt.ids), opts.max_tokens)
        if short:
            return short
        if len(prompt.ids) > self.shapes.prefills[-1]:
            return f"a prompt of {len(prompt.ids)} ids; it prefills {self.shapes.prefills[-1]} at most"
        return "its sampling or ids"

    def _in_vocab(self, ids: Any) -> bool:
        return 0 <= min(ids) and max(ids) < self.runner.model.vocab_size

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
        pending: deque[tuple[ReadBack, list[Launch]]] = deque()
        self.runner.new_run()
        try:
            with self.runner.on_stream():
                while True:
                    if self._admit():  # its first token goes to the host at once (time to first token)
                        pending.append(self._read_back())
                    while len(pending) <= AHEAD and self._burst():
                        pending.append(self._read_back())
                    if pending:
                        self._deliver(*pending.popleft())
                    else:
                        self.scheduler.sweep()
                        if not self.scheduler.waiting:
                            return
        except Exception as err:  # noqa: BLE001 - raised in every consumer
            self._fail(err)

    def _admit(self) -> bool:
        """Prefill the jobs the scheduler seats, one launch per prefill it plans; whether it seated any."""
        prefills = self.scheduler.admit()
        for prefill in prefills:
            self.runner.set_allowed(prefill.allowed)
            self.runner.prefill(prefill.rows, prefill.prompts, prefill.options, prefill.size)
            self.scheduler.launched(prefill.jobs)
        return bool(prefills)

    def _burst(self) -> bool:
        """Launch a burst of decode steps over the rows that want one; False when none does."""
        launched = False
        for step in self.scheduler.burst():
            self.runner.decode(step.rows, step.span)
            self.scheduler.launched(step.jobs)
            launched = True
        return launched

    def _read_back(self) -> tuple[ReadBack, list[Launch]]:
        """Queue the copies of the launches not read back yet."""
        launches = self.scheduler.take_unread()
        return self.runner.read_back(len(launches)), launches

    def _deliver(self, read: ReadBack, launches: list[Launch]) -> None:
        self.scheduler.deliver(launches, self.runner.tokens_of(read))

    def _fail(self, err: BaseException) -> None:
        """Every job gets the error; the rows start empty again."""
        self.runner.resync()
        self.scheduler.fail(err)

    # ---- TokenGenerator --------------------------------------------------------------------------------------

    def groups(self) -> set[str]:
        return self.scheduler.groups()

    def follow(self, board: DeadlineBoard) -> None:
        """Seat waiting sentences most pressing first (engine.backends.base DeadlineScheduled)."""
        self.scheduler.deadlines = board

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str,
                     group: str | None = None) -> AsyncGenerator[list[int], None]:
        """Yield token deltas (stop id included when reached); up to `rows` jobs run at once, the rest wait in
        arrival order."""
        if not self.supports(prompt, opts):
            raise ValueError(f"this request does not fit the graph lane ({self._misfit(prompt, opts)})")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def deliver(kind: str, payload: Any, finished: bool = False) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, (payload, finished)))
            except RuntimeError:  # the consumer's loop is gone
                job.aborted.set()

        job = LaneJob(tuple(prompt.ids), opts, tuple(prompt.allowed_ids or ()), deliver, request_id,
                      group or request_id)
        self.scheduler.add(job)
        try:
            self._executor.submit(self.drive)  # a no-op when a running drive has taken the job already
        except RuntimeError as err:  # closed
            self.scheduler.withdraw(job)
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
        self.scheduler.abort(request_id)

    async def close(self) -> None:
        self.scheduler.abort_all()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)


class LaneRouter:
    """TokenGenerator: the graph lane first; another generator (vLLM, or the torch generator) for the rest.

    - A lane that holds a crowd (`others_limit=None, handoff_at=None, overflow=False`, the factory's choice when
      the GPU fits CROWD_ROWS rows): every request the lane supports, those beyond its rows waiting for one, and
      nothing moves. The lane steps its streams in this process, where the decoder's CUDA stream overlaps with it;
      vLLM runs in a process of its own, and two processes on one GPU take turns rather than overlap, so a stream
      sent there would stall every other (`overflow=True` sends the overflow there all the same).
    - A small lane (the defaults): the lane while vLLM is idle; once vLLM runs HANDOFF_AT streams, the lane's
      streams move to vLLM (prompt plus the tokens so far, the rest of the budget) and join its batch.

    Same sampling distribution on every path; the random streams differ, so a seed is reproducible only on the
    same path and, on the lane, in the same company (a batch's rows may round differently from a lone row), except
    on a fixed-shape lane (GraphLane `fixed_shapes`), whose rows never depend on their company."""

    def __init__(self, primary: Any, lane: GraphLane, others_limit: int | None = OTHERS_LIMIT,
                 handoff_at: int | None = HANDOFF_AT, overflow: bool = True, failover: bool = True,
                 fit_budget: bool = False, events: EventSink = ignore_events) -> None:
        self.primary, self.lane, self.events = primary, lane, events
        self.fit_budget = fit_budget
        """A request whose prompt the lane holds but whose budget runs past its positions runs here with the budget
        cut to them, instead of on the primary (the longest lane of a deterministic engine whose family's budgets
        outgrow its spans: LaneSizing.fit_budget)."""
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

    def _fitted(self, prompt: Prompt, opts: SamplingOptions) -> SamplingOptions:
        """`opts` with its budget cut to the positions the lane's rows leave after the prompt, where `fit_budget`."""
        if not self.fit_budget:
            return opts
        room = self.lane.max_len - len(prompt.ids)
        return replace(opts, max_tokens=room) if 0 < room < opts.max_tokens else opts

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        opts = self._fitted(prompt, opts)
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

    def follow(self, board: DeadlineBoard) -> None:
        """The lane and (where it schedules by deadline too) the primary follow `board`."""
        self.lane.follow(board)
        if isinstance(self.primary, DeadlineScheduled):
            self.primary.follow(board)

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
