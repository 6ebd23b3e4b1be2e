"""Provides Tuning: the work a server does after it has started answering (a larger graph lane, vLLM, more decoder
graphs), run step by step in the background and swapped in between sentences, never in the middle of one. The
`Tuning` runner is pure; `crowd_tuning` (a server tuning for crowds) and `short_window_tuning` (any other server)
build its steps from the composition root's parts (engine.factory), which they import when called.

Each step runs on a worker thread; what it returns is handed to `apply` on the event loop, which swaps it into the
engine. Its progress is what `voicectl status` and the TUI show.

Tuning never hurts a live request: it yields (`Yielding`) before each step and before each graph capture inside
the lane and decoder steps while a live stream is pressing (its next audio due within engine.deadlines
PRESSING_S), so the GPU and the decode thread are the live streams' while they need them; and no full garbage
collection, which stops every thread, runs while it builds (engine.pauses `full_collections_held`).
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from engine.errors import one_line
from engine.events import EventSink, Notice, StartupPhase, ignore_events
from engine.pauses import full_collections_held


YIELD_POLL_S = 0.02
"""How often a paused piece of background work looks again whether a live stream is still pressing."""
MAX_YIELD_S = 5.0
"""The longest one pause waits: under a crowd that is always pressing, tuning still goes on, a piece at a time (the
larger lane and vLLM it builds are what carry that crowd)."""
SETTLE_WAIT_S = 60.0
"""The longest the settle waits for a moment with no live stream: it stops every thread while it collects all tuning
built, which no one hears when no one is listening; under steady traffic it runs after this wait anyway."""
LONGEST_PIECES = 8
"""Pieces of background work a server's status lists, the longest first."""


@dataclass
class PieceLog:
    """Background work timed piece by piece: a piece runs from one yield to the next (a graph capture, its warm-up
    calls included). A request that arrives mid-piece waits for its end, so the longest pieces bound the first audio
    of a request served while tuning."""

    clock: Callable[[], float] = time.monotonic
    keep: int = LONGEST_PIECES
    count: int = 0
    seconds: float = 0.0
    """Seconds of all pieces ended so far."""
    longest: list[tuple[float, str]] = field(default_factory=list)
    """(seconds, what) of the `keep` longest pieces, longest first."""
    _open: tuple[float, str] | None = None

    def begin(self, what: str) -> None:
        """A piece called `what` starts now (the one before it, if any, ends)."""
        self.end()
        self._open = (self.clock(), what)

    def end(self) -> None:
        """The open piece, if any, ends now."""
        if self._open is None:
            return
        began, what = self._open
        self._open = None
        took = self.clock() - began
        self.count += 1
        self.seconds += took
        self.longest = sorted([*self.longest, (took, what)], key=lambda piece: -piece[0])[:self.keep]

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "seconds": round(self.seconds, 3),
                "longest_ms": [[round(took * 1e3, 1), what] for took, what in self.longest]}


class TuningStopped(BaseException):
    """Raised at a background step's next yield once its tuning was cancelled (the server stops): the step's thread
    ends there instead of building the rest, which nothing would use, while the process waits for it to exit. A
    BaseException, as asyncio's CancelledError is, so that no `except Exception` of a build (the lane's retry without
    the compiler) takes it for a failure."""


@dataclass
class Yielding:
    """Background work's pauses for live streams: `wait` (a worker thread) or `wait_async` (the event loop) returns
    once no live stream is pressing, or after MAX_YIELD_S."""

    pressing: Callable[[], int]
    """Live streams whose next audio is due soon (engine.deadlines DeadlineBoard.pressing)."""
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    poll_s: float = YIELD_POLL_S
    max_s: float = MAX_YIELD_S
    pauses: int = 0
    """Times it waited."""
    paused_s: float = 0.0
    """Seconds it waited, in all."""
    pieces: PieceLog = field(default_factory=PieceLog)
    """The work between waits (`wait`'s `what`), timed."""
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set once the work is called off: `wait` raises TuningStopped from then on."""

    def wait(self, what: str = "") -> None:
        """Block while a live stream is pressing (at most max_s); then the piece of work called `what` begins.
        TuningStopped once the work was called off (`stopped`)."""
        self.pieces.end()
        t0 = self.clock()
        if self.pressing():
            while self.pressing() and self.clock() - t0 < self.max_s and not self.stopped.is_set():
                self.sleep(self.poll_s)
            self._count(t0)
        if self.stopped.is_set():
            raise TuningStopped(what)
        self.pieces.begin(what)

    async def wait_async(self) -> None:
        """`wait` on the event loop."""
        t0 = self.clock()
        if not self.pressing():
            return
        while self.pressing() and self.clock() - t0 < self.max_s:
            await asyncio.sleep(self.poll_s)
        self._count(t0)

    def _count(self, t0: float) -> None:
        self.pauses += 1
        self.paused_s += self.clock() - t0


def never_pressing() -> int:
    return 0


@dataclass
class TuningStep:
    """One piece of background work and where it stands."""

    name: str
    """What it builds: lane, vllm, decoder, ..."""
    build: Callable[[], Any]
    """Runs on a worker thread; returns what `apply` swaps in (None: nothing to swap)."""
    apply: Callable[[Any], Awaitable[None]] | None = None
    """Runs on the event loop with `build`'s result."""
    state: str = "pending"
    """pending | running | done | failed | skipped"""
    seconds: float | None = None
    detail: str = ""
    """Why it failed or was skipped, or what it built."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "seconds": self.seconds, "detail": self.detail}


@dataclass
class Tuning:
    """Background steps run one after another; the engine answers requests meanwhile with what is ready."""

    steps: list[TuningStep] = field(default_factory=list)
    events: EventSink = ignore_events
    yielding: Yielding = field(default_factory=lambda: Yielding(never_pressing))
    """Waits for live streams before each step (its steps wait inside too, between graph captures)."""
    settle: Callable[[], None] | None = None
    """Runs on a worker thread once every step is over, no stream is live (or SETTLE_WAIT_S passed) and none is
    pressing: what the steps left behind is tidied (a server freezes its heap again, so that the collector stops
    walking the lane and graphs they built)."""
    idle: Callable[[], bool] = lambda: True
    """Whether no stream is live now (the settle waits for it)."""
    settle_wait_s: float = SETTLE_WAIT_S
    started: float | None = None
    finished: float | None = None

    @property
    def done(self) -> bool:
        return all(step.state in ("done", "failed", "skipped") for step in self.steps)

    def status(self) -> dict[str, Any]:
        """What `voicectl status` shows: done, seconds since the start, each step."""
        end = self.finished if self.finished is not None else time.monotonic()
        return {"done": self.done, "seconds": None if self.started is None else end - self.started,
                "steps": [step.as_dict() for step in self.steps], "yielded_s": round(self.yielding.paused_s, 3),
                "pieces": self.yielding.pieces.as_dict()}

    async def run(self) -> None:
        """Run every step. A failing step is a notice and the engine keeps what it had; the others go on."""
        loop = asyncio.get_running_loop()
        self.started = time.monotonic()
        with full_collections_held():
            for step in self.steps:
                await self.yielding.wait_async()
                await self._run_step(loop, step)
        if self.settle is not None:
            waited = 0.0
            while not self.idle() and waited < self.settle_wait_s:
                await asyncio.sleep(self.yielding.poll_s)
                waited += self.yielding.poll_s
            await self.yielding.wait_async()
            await loop.run_in_executor(None, self.settle)
        self.finished = time.monotonic()
        if self.steps:
            self.events(Notice(f"tuned in {self.finished - self.started:.1f} s: "
                               + ", ".join(f"{s.name} {s.state}" for s in self.steps)))

    async def _run_step(self, loop: asyncio.AbstractEventLoop, step: TuningStep) -> None:
        step.state, t = "running", time.monotonic()
        try:
            built = await loop.run_in_executor(None, step.build)
            if step.apply is not None and built is not None:
                await step.apply(built)
            step.state = "done" if built is not None or step.apply is None else "skipped"
        except asyncio.CancelledError:
            step.state, step.detail = "failed", "cancelled"
            self.yielding.stopped.set()  # its thread ends at its next yield
            raise
        except Exception as err:  # noqa: BLE001 - the engine keeps serving with what it had
            step.state, step.detail = "failed", one_line(err)
            self.events(Notice(f"background {step.name} failed ({step.detail}); serving without it"))
        finally:
            self.yielding.pieces.end()  # a step's last piece ends with it
            step.seconds = time.monotonic() - t
            if step.state == "done":
                self.events(StartupPhase(f"tuning_{step.name}", step.seconds))


# ---- what a server tunes ------------------------------------------------------------------------------------

def crowd_tuning(synth: Any, config: Any, events: EventSink = ignore_events):
    """What a server started as one listener's engine (`one_listener`, backend auto) builds after it answers:
    decoder graphs for batched windows, a lane sized to the GPU, and vLLM for the streams beyond it where that lane
    is too small to hold a crowd, each swapped in when ready. The lane is compiled in a child process first
    (engine.compile_ahead), so that the server's own build of it, beside live streams, finds its kernels cached.
    Nothing on an engine without a GPU lane."""
    from engine.factory import (_build_lane, _current_gpu, _freeze_heap, _lane_in_front, _lane_runs_on, _vllm_installed,
                                gpu_device, holds_a_crowd)

    info = synth.model_info
    gate = Yielding(synth.deadlines.pressing)
    if info is None or not _lane_in_front(synth.generator):
        return Tuning([], events, gate)

    def compile_ahead() -> bool:
        import torch

        from engine.compile_ahead import compile_lane_ahead

        device = gpu_device(config)
        runs = _lane_runs_on(torch.device(device), ignore_events)  # else the lane step says why there is none
        ahead.detail = compile_lane_ahead(info, device, gate.stopped) if runs else "no lane on this GPU"
        return True

    ahead = TuningStep("compile", compile_ahead)
    steps = [TuningStep("decoder", lambda: _capture_decoder_batches(synth, gate)), ahead,
             TuningStep("lane", lambda: _build_lane(info, events, gpu_device(config), rows=None, background=True,
                                                    between=gate.wait),
                        lambda lane: _swap(synth, events, lane=lane))]
    if config.backend == "auto" and _vllm_installed() and _current_gpu(gpu_device(config)):
        from engine.backends.vllm_gen import VllmTokenGenerator

        def build_vllm() -> Any:
            if holds_a_crowd(synth.generator.lane):  # the lane step before swapped in a lane of a crowd's size
                vllm.detail = "the graph lane holds the crowd"
                return None
            return VllmTokenGenerator(info, events=events)

        vllm = TuningStep("vllm", build_vllm, lambda gen: _swap(synth, events, primary=gen))
        steps.append(vllm)
    # Loading froze the heap; what tuning built since (a lane of hundreds of rows and its graphs, vLLM) would
    # otherwise be walked by every full collection, with every thread stopped, while crowds are served.
    return Tuning(steps, events, gate, settle=_freeze_heap if config.freeze_heap else None,
                  idle=lambda: synth.active_requests == 0)


def short_window_tuning(synth: Any, events: EventSink = ignore_events) -> Tuning:
    """What a server that builds nothing for crowds (an explicit backend, or one started for `say` and the TUI)
    builds after it answers: the decoder's graph for each length that short sentences decode at and no standard
    length covers (`_capture_decoder_batches` without the crowd's batches). Nothing where the decoder takes any
    shape (on the CPU). No settle: the few objects its graphs add are not worth a collection that stops every
    thread."""
    gate = Yielding(synth.deadlines.pressing)
    if not synth.decoder.fixed_shapes:
        return Tuning([], events, gate)
    return Tuning([TuningStep("decoder", lambda: _capture_decoder_batches(synth, gate, crowd=False))], events, gate)


def server_tuning(synth: Any, config: Any, events: EventSink = ignore_events, crowd: bool = True) -> Tuning:
    """What a serving engine (a server, a Ray replica) builds after it answers: the crowd's parts where it tunes for
    crowds (`crowd`, built as `config`), else the short sentences' window graphs alone."""
    return crowd_tuning(synth, config, events) if crowd else short_window_tuning(synth, events)


def _capture_decoder_batches(synth: Any, gate: Yielding | None = None, crowd: bool = True) -> bool:
    """With `crowd`, the decoder's graphs for crowds' batches, one at a time on this (the tuning) thread while the
    decode thread goes on serving (engine.backends.cuda_graphs), and with a `gate` only while no live stream is
    pressing; for the window lengths of the schedule the engine runs (a config may leave it to the model family).
    Then one window's graph for each length that short sentences decode at and no standard length covers: such a
    window otherwise runs eagerly at a shape of its own, planned by cuDNN on the decode thread the first time it
    comes, while every stream's windows wait."""
    from engine.batching import DECODE_BATCHES, lengths_for
    from engine.windowed_decode import uncovered_lengths

    standard = lengths_for(synth.schedule)
    shapes = [(batch, length) for batch in DECODE_BATCHES for length in standard] if crowd else []
    shapes += [(1, length) for length in uncovered_lengths(synth.schedule, standard)]
    for batch, length in shapes:
        if gate is not None:
            gate.wait(f"decoder {batch}x{length}")
        synth.decoder.warmup([length], [batch], background=True)
    return True


async def _swap(synth: Any, events: EventSink, lane=None, primary=None) -> None:
    """A router over the new lane or primary (and the other part kept) takes the next sentences; the parts it
    replaced finish what they run, then close."""
    from engine.factory import lane_router

    new = lane_router(primary or synth.generator.primary, lane or synth.generator.lane, events)
    old = synth.swap_generator(new)
    await _retire(old, keep=(new.lane, new.primary))


async def _retire(old, keep: tuple, poll_s: float = 0.5) -> None:
    """Close `old`'s lane and primary (those not in `keep`) once no stream runs on them."""
    while old.lane.groups() or old.primary_live:
        await asyncio.sleep(poll_s)
    if old.lane not in keep:
        await old.lane.close()
    if old.primary not in keep:
        await old.primary.close()
