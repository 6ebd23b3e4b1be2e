"""Provides LaneScheduler: which of the graph lane's jobs hold which rows, and what each launch and read-back does for
them. Pure (ints, tuples and callbacks; no torch), so the policy is tested without a GPU: GraphLane
(engine.backends.graph_gen) drives it, and its LaneRunner (engine.backends.lane_runner) launches what it plans.

A job (one sentence of a request) waits for a free row, is prefilled there (its first token), is stepped with every
other busy row in bursts of decode steps, and gets its tokens one read-back at a time. It ends at a stop id, at its
token limit or when aborted; its row is free again once no more steps are launched for it.
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from engine.config import SamplingOptions
from engine.deadlines import DeadlineBoard
from engine.rows import RowTable

PREFILL_BUCKETS = (32, 64, 128, 256, 512)
"""Prompt lengths are padded up to one of these (one graph each); longer prompts go to vLLM. A sentence prompt
is ~40 ids plus its text tokens."""
SPAN_BUCKETS = (128, 256, 512, 1024, 2048, 4096)
"""Attention spans (one decode graph each): a step attends over the smallest span holding its position, so short
sentences do not pay for the longest one."""
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""Batch sizes with a decode graph each: a step runs the smallest holding the highest busy row."""
PREFILL_BATCHES = (1, 2, 4, 8)
"""Prompts one prefill graph runs side by side (an admitted group is split into these: 7 = 4 + 2 + 1). One prefill
reads every weight once however many prompts it holds, so the rows already running wait far less for a batch of
prompts than for the same prompts one at a time."""
BURST = 2
"""Steps per read-back: tokens reach the caller at most BURST - 1 steps late, and a read costs far less than a
step."""
CROWD_BURSTS = ((32, BURST), (None, 8))
"""Steps per read-back by rows running (up to 32, more): each read hands every stream its tokens through the event
loop, so a crowd gets fewer, larger deliveries (a first window needs ~20 tokens either way); larger bursts at
fewer rows delay first audio, since a newcomer's prefill waits for the bursts already queued."""
CROWD_MEMORY_SHARE = 0.20
"""Share of the GPU's memory the KV cache of a lane sized for a crowd may take, by default (LaneSizing; 50 MB a row
for Spark's LLM at 4,096 positions, so 512 rows on a 141 GB card and 256 on an 80 GB one). The crowd's streams must
fit the lane: one that overflows to vLLM runs in vLLM's process, and two processes on one GPU take turns (time
slices) instead of overlapping, which stalls this process's decoder and lane for every stream."""
FIXED_LANES = ((1024, 256), (2048, 64))
"""(positions, most rows) of each fixed-shape lane of a deterministic engine (export), shortest first, by default
(LaneSizing.fixed): a sentence runs on the first whose positions hold its prompt and token budget. Every step attends
over all of a lane's positions and runs all its rows, so most sentences take the short lane and the long ones (up to
the longest sentence the pipeline cuts, JoinConfig.max_sentence_chars) the other; what fits neither runs on the
router's last generator, whose arithmetic is per request too. More rows cost a step less than they add;
FIXED_MEMORY_SHARE caps each lane on smaller GPUs."""
FIXED_MEMORY_SHARE = 0.10
"""Share of the GPU's memory each fixed-shape lane's KV cache may take, by default (LaneSizing.fixed_share)."""
ADMIT = 8
"""Later sentences (of requests that already have a row) prefilled between two bursts: they are not waited on."""
ADMIT_NEW = 32
"""Requests with no row yet prefilled between two bursts: each is a listener waiting for first sound, and eight
prompts share one launch (PREFILL_BATCHES), so a crowd of 32 gets its rows in one admission instead of over four
rounds of bursts."""


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest size >= n (a ValueError when n exceeds them all: admission keeps every job within them)."""
    size = next((s for s in sizes if s >= n), None)
    if size is None:
        raise ValueError(f"{n} exceeds every launch shape ({max(sizes)} at most)")
    return size


@dataclass(frozen=True, slots=True)
class LaneSizing:
    """How a family's graph lane is sized on a GPU (ModelFamily.lane; engine.factory builds the lane by it)."""

    positions: int = SPAN_BUCKETS[-1]
    """Positions of every row's KV cache: the most a sentence's prompt plus token budget may take there. A request
    that needs more runs on the generator behind the lane (GraphLane.supports), never past the cache."""
    memory_share: float = CROWD_MEMORY_SHARE
    """Share of the GPU's memory the KV cache of a lane sized for a crowd may take (graph_gen.rows_for)."""
    fixed: tuple[tuple[int, int], ...] = FIXED_LANES
    """(positions, most rows) of each fixed-shape lane of its deterministic engine (export), shortest first."""
    fixed_share: float = FIXED_MEMORY_SHARE
    """Share of the GPU's memory each of those lanes' KV cache may take (graph_gen.fixed_rows_for)."""
    fit_budget: bool = False
    """A sentence whose budget outgrows the longest of those lanes runs there with its budget cut to the positions
    left after its prompt, not on the torch generator behind them (which steps one request at a time)."""


def sentence_positions(token_budget: int) -> int:
    """Positions a sentence with this token budget can take on a lane: its tokens after the longest prompt a lane
    prefills (PREFILL_BUCKETS)."""
    return PREFILL_BUCKETS[-1] + token_budget


@dataclass(frozen=True, slots=True)
class LaneShapes:
    """The launch shapes a lane has graphs for: the runner captures them, the scheduler plans within them."""

    rows: int
    max_len: int
    """Positions of every row's KV cache (prompt plus tokens)."""
    spans: tuple[int, ...]
    """Attention spans a decode step runs over."""
    prefills: tuple[int, ...]
    """Prompt lengths a prefill pads to."""
    prefill_batches: tuple[int, ...]
    """Prompts one prefill runs side by side."""
    row_buckets: tuple[int, ...]
    """Rows one decode step runs."""

    def positions_short(self, prompt_ids: int, max_tokens: int) -> str | None:
        """Why a row cannot hold a prompt of `prompt_ids` ids and a budget of `max_tokens` tokens (its steps would
        write past the row's KV cache), in words; None where it can."""
        need = prompt_ids + max_tokens
        if need <= self.max_len:
            return None
        return (f"a prompt of {prompt_ids} ids and a budget of {max_tokens} tokens need {need} positions; its rows "
                f"hold {self.max_len}")

    @classmethod
    def of(cls, rows: int, max_len: int, fixed: bool = False) -> LaneShapes:
        """The shapes of a lane of `rows` rows over `max_len` positions. `fixed`: one span (every position), one
        row count (every row) and one prompt per prefill, so a row's arithmetic never depends on its company
        (graph_gen.FIXED_SHAPES says why that is enough)."""
        prefills = tuple(p for p in PREFILL_BUCKETS if p <= max_len)
        if fixed:
            return cls(rows, max_len, (max_len,), prefills, (1,), (rows,))
        spans = tuple(s for s in SPAN_BUCKETS if s < max_len) + (max_len,)
        batches = tuple(b for b in PREFILL_BATCHES if b <= rows)
        return cls(rows, max_len, spans, prefills, batches, tuple(b for b in ROW_BUCKETS if b < rows) + (rows,))


@dataclass(slots=True, eq=False)
class LaneJob:
    """One sentence on the lane: what to run, where its tokens go, and how far the lane has got with it."""

    ids: tuple[int, ...]
    """Its prompt."""
    opts: SamplingOptions
    allowed: tuple[int, ...]
    """The ids it may sample; all busy rows share one such set."""
    deliver: Callable[..., None]
    """Called on the lane's worker: ("tokens", ids, finished), ("end", None) or ("error", exception)."""
    request_id: str
    group: str
    """Its request: a request's sentences share it."""
    aborted: threading.Event = field(default_factory=threading.Event)
    """Set from any thread: no more steps and no more tokens for it."""
    row: int = -1
    """Its row of the batch (and of the KV cache) once admitted."""
    launched: int = 0
    """Launches that sample a token for it (its prefill included)."""
    delivered: int = 0
    stopped: bool = False
    """A stop id came back: no more steps for it."""
    ended: bool = False
    """Off the lane: its end (or error) was handed over."""
    queued_at: float = 0.0
    """When it was queued, on the deadline board's clock (engine.deadlines: the starvation bound counts from it)."""

    def wants_steps(self) -> bool:
        return not self.stopped and self.launched < self.opts.max_tokens and not self.aborted.is_set()


Launch = tuple[LaneJob, ...]
"""The jobs one launch sampled a token for, each in its row."""


@dataclass(frozen=True, slots=True)
class Prefill:
    """One prefill launch: these jobs' prompts, padded to `size`, each into its row."""

    jobs: Launch
    size: int

    @property
    def rows(self) -> list[int]:
        return [job.row for job in self.jobs]

    @property
    def prompts(self) -> list[tuple[int, ...]]:
        return [job.ids for job in self.jobs]

    @property
    def options(self) -> list[SamplingOptions]:
        return [job.opts for job in self.jobs]

    @property
    def allowed(self) -> tuple[int, ...]:
        """The allowed set the jobs share (an admission never mixes two)."""
        return self.jobs[0].allowed


@dataclass(frozen=True, slots=True)
class Step:
    """One decode launch: rows [0, rows) over `span` positions; `jobs` want its tokens (other rows compute too)."""

    jobs: Launch
    rows: int
    span: int


class LaneScheduler:
    """The lane's jobs and rows: admission (prefill plans), decode steps in bursts, what each read-back hands to
    which job, and the end of a job (stop id, token limit, abort) that frees its row.

    Jobs arrive and are aborted from the event loop's thread (`add`, `abort`); everything else runs on the lane's
    one worker thread, which launches each plan and then reports it (`launched`)."""

    def __init__(self, shapes: LaneShapes, stop_ids: Iterable[int], allowed: tuple[int, ...]) -> None:
        self.shapes = shapes
        self.stop_ids = frozenset(stop_ids)
        self.allowed = allowed
        """The allowed set the rows step with (the runner points its head at it before a prefill)."""
        self.jobs: deque[LaneJob] = deque()
        """Jobs waiting, running or draining, oldest first (the router reads their groups)."""
        self.waiting: deque[LaneJob] = deque()
        self.rows: RowTable[LaneJob] = RowTable(shapes.rows)
        """The job each row steps (a freed row keeps computing, nobody reads it): the row bookkeeping the CPU rows
        share (engine.rows)."""
        self.unread: list[Launch] = []
        """Launches not read back yet, oldest first."""
        self.bursts = CROWD_BURSTS
        """Steps per read-back by rows running (the bench swaps it to measure other bursts)."""
        self.served = 0
        """Jobs that ended with all their tokens (a stop id or the token limit)."""
        self.deadlines: DeadlineBoard | None = None
        """Where set, waiting jobs get rows most pressing first (their streams' due times: engine.deadlines);
        else requests without a row first, then in arrival order."""

    # ---- arrivals (any thread) ---------------------------------------------------------------------------------

    def add(self, job: LaneJob) -> None:
        """Queue a job for a row; a ValueError for one whose prompt and token budget exceed a row's positions
        (its steps would write past the row's KV cache)."""
        short = self.shapes.positions_short(len(job.ids), job.opts.max_tokens)
        if short:
            raise ValueError(short)
        if self.deadlines is not None:
            job.queued_at = self.deadlines.clock()
        self.jobs.append(job)
        self.waiting.append(job)

    def withdraw(self, job: LaneJob) -> None:
        """Take back a job no worker will see (the lane is closed)."""
        self.jobs.remove(job)
        self.waiting.remove(job)

    def abort(self, request_id: str) -> None:
        """Abort the request's jobs: the worker ends them at its next sweep."""
        for job in list(self.jobs):
            if job.request_id == request_id:
                job.aborted.set()

    def abort_all(self) -> None:
        for job in list(self.jobs):
            job.aborted.set()

    @property
    def load(self) -> int:
        return len(self.jobs)

    @property
    def row_jobs(self) -> list[LaneJob | None]:
        """The job each row steps (None: free), as of now."""
        return self.rows.holders()

    @property
    def busy_rows(self) -> int:
        return self.rows.busy

    def groups(self) -> set[str]:
        return {job.group for job in list(self.jobs)}

    # ---- admission ---------------------------------------------------------------------------------------------

    def admit(self) -> list[Prefill]:
        """Give waiting jobs free rows, in as few prefills as PREFILL_BATCHES allow: requests with no row yet first
        (up to ADMIT_NEW: their first sound comes first), then later sentences in arrival order while fewer than
        ADMIT jobs are admitted. All rows share one allowed set: a job with another waits until the rows are
        empty. With a deadline board, most pressing first instead (`_admit_by_deadline`)."""
        if self.deadlines is not None and len(self.waiting) > 1:
            return self._prefills(self._admit_by_deadline(self.deadlines))
        admitted: list[LaneJob] = []
        new = 0
        while self.waiting and not self.rows.full:
            index = self._first_without_row()
            if index is not None and new < ADMIT_NEW:
                new += 1
            elif len(admitted) < ADMIT:
                index = 0
            else:
                break
            job = self.waiting[index]
            if not self._steps_with(job.allowed) and self.rows.busy:
                break
            del self.waiting[index]
            self._seat(job)
            admitted.append(job)
        return self._prefills(admitted)

    def _admit_by_deadline(self, board: DeadlineBoard) -> list[LaneJob]:
        """Seat waiting jobs most pressing first by the board's policy (a stream about to run dry, then a new
        stream's first sentence, then the next sentence of a stream far ahead of its listener; ties and a
        request's own sentences in arrival order), within the same ADMIT_NEW / ADMIT caps per round."""
        running = {job.group for job in self.row_jobs if job is not None}
        waiting = list(self.waiting)
        order = board.policy.order(waiting, lambda job: board.key(job.group, job.queued_at))
        admitted: list[LaneJob] = []
        new = later = 0
        for job in (waiting[i] for i in order):
            if self.rows.full:
                break
            fresh = job.group not in running
            if (fresh and new >= ADMIT_NEW) or (not fresh and later >= ADMIT):
                continue
            if not self._steps_with(job.allowed) and self.rows.busy:
                break
            self._seat(job)
            admitted.append(job)
            running.add(job.group)
            new, later = new + fresh, later + (not fresh)
        for job in admitted:  # in place: `add` appends from the event loop's thread meanwhile
            self.waiting.remove(job)
        return admitted

    def _first_without_row(self) -> int | None:
        """Where the oldest waiting job of a request that holds no row stands in the queue."""
        running = {job.group for job in self.row_jobs if job is not None}
        return next((i for i, job in enumerate(self.waiting) if job.group not in running), None)

    def _steps_with(self, allowed: tuple[int, ...]) -> bool:
        """Whether the rows step with these ids now (identity first: every sentence shares one 8,195-id tuple)."""
        return allowed is self.allowed or allowed == self.allowed

    def _seat(self, job: LaneJob) -> None:
        row = self.rows.seat(job)
        if row is None:
            raise RuntimeError("a job was seated with every row held")
        self.allowed, job.row = job.allowed, row

    def _prefills(self, jobs: list[LaneJob]) -> list[Prefill]:
        """Admitted jobs as prefill launches of the captured batch sizes, similar lengths together (each prompt is
        padded to its launch's longest)."""
        jobs = sorted(jobs, key=lambda job: len(job.ids))
        plans = []
        while jobs:
            batch = max(b for b in self.shapes.prefill_batches if b <= len(jobs))
            launch, jobs = tuple(jobs[:batch]), jobs[batch:]
            plans.append(Prefill(launch, bucket(max(len(job.ids) for job in launch), self.shapes.prefills)))
        return plans

    # ---- decode steps ------------------------------------------------------------------------------------------

    def burst(self) -> Iterator[Step]:
        """The decode steps of one burst (`bursts`: how many by the rows busy as it starts), each planned once the
        one before was launched and reported; it ends early when no row wants a step."""
        for _ in range(self._burst_length()):
            step = self._next_step()
            if step is None:
                return
            yield step

    def _burst_length(self) -> int:
        busy = self.busy_rows
        return next(n for most, n in self.bursts if most is None or busy <= most)

    def _next_step(self) -> Step | None:
        jobs = tuple(job for job in self.row_jobs if job is not None and job.wants_steps())
        if not jobs:
            return None
        rows = bucket(max(job.row for job in jobs) + 1, self.shapes.row_buckets)
        # token k of a job feeds token k - 1 at position n + k - 1: its span must cover n + k positions
        span = bucket(max(len(job.ids) + job.launched for job in jobs), self.shapes.spans)
        return Step(jobs, rows, span)

    def launched(self, jobs: Launch) -> None:
        """A prefill or step sampling a token for these jobs was launched: it awaits a read-back, and a job that
        wants no more steps frees its row (its launched tokens stay readable: a new job's prefill in that row runs
        after them)."""
        self.unread.append(jobs)
        for job in jobs:
            job.launched += 1
            if not job.wants_steps():
                self.rows.free(job.row, job)

    # ---- read-backs --------------------------------------------------------------------------------------------

    def take_unread(self) -> list[Launch]:
        """The launches not read back yet (the latest ones, oldest first); the next read-back covers them."""
        unread, self.unread = self.unread, []
        return unread

    def deliver(self, launches: list[Launch], tokens: list[list[int]]) -> None:
        """Hand each job its tokens from these launches (`tokens`: per launch, every row's), cut at a stop id; end
        the jobs that are done, then the aborted ones."""
        got: dict[LaneJob, list[int]] = {}
        for jobs, by_row in zip(launches, tokens):
            for job in jobs:
                got.setdefault(job, []).append(by_row[job.row])
        for job, new in got.items():
            self._hand_over(job, new)
        self.sweep()

    def _hand_over(self, job: LaneJob, tokens: list[int]) -> None:
        if job.ended or job.aborted.is_set():  # steps launched before it ended: nobody reads them
            return
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self.stop_ids), None)
        if cut is not None:
            tokens, job.stopped = tokens[:cut], True
        job.delivered += len(tokens)
        if job.stopped or job.delivered >= job.opts.max_tokens:
            self.served += 1
            self._end(job, tokens)
        else:
            job.deliver("tokens", tokens, False)

    # ---- ends --------------------------------------------------------------------------------------------------

    def sweep(self) -> None:
        """End aborted jobs, waiting or running (their rows free at once: steps in flight for them are skipped)."""
        for job in list(self.jobs):
            if job.aborted.is_set() and not job.ended:
                with contextlib.suppress(ValueError):
                    self.waiting.remove(job)
                self._end(job)

    def fail(self, err: BaseException) -> None:
        """Every job gets the error (the router hands their streams over); the rows start empty again."""
        jobs = [job for job in list(self.jobs) if not job.ended]
        self.waiting.clear()
        self.rows.clear()
        self.unread.clear()
        for job in jobs:
            job.deliver("error", err)
            self._end(job)

    def _end(self, job: LaneJob, last: list[int] | None = None) -> None:
        """Take the job off the lane, then hand over its `last` tokens (marked finished) and the end: whoever
        sees them sees the lane without it."""
        job.ended = True
        self.rows.free(job.row, job)
        with contextlib.suppress(ValueError):
            self.jobs.remove(job)
        if last is not None:
            job.deliver("tokens", last, True)
        job.deliver("end", None)
