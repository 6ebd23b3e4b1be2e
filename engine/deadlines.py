"""Provides the one deadline policy every stage orders its queue by: when each stream's next audio is due
(`StreamClock`, kept for every live stream by a `DeadlineBoard`), which queued work goes first
(`DeadlinePolicy.key`), how large a decoder batch may grow before the most pressing window waits too long
(`BatchCost`), and whether one more stream fits (`DeadlineBoard.admit`). Pure: the board reads the clock it is
handed (time.perf_counter unless a test scripts one); no threads, no torch.

A real-time listener starts playing a stream at its first audio and from then on has played `t - first_audio_at`
seconds, so the stream's next audio is due at `first_audio_at + audio_delivered_s - margin`; before its first
audio, a stream is due a fixed budget after its request arrived. The decoder batcher (engine.batching), the graph
lane's admission (engine.lane_scheduler) and vLLM's submission priority (engine.backends.vllm_gen) all ask the same
board and the same policy: one scheduler, not one per stage.

That due time is strict (the listener counted as playing from the first audio), which suits an order. Admission
judges a stream by the listener as our player plays it instead: from when it holds its pre-roll (the first window
carries less), and at the speed the engine made it (audio over engine time up to its latest chunk: a window under
way counts once it is whole). Counted strictly, every new stream was late from its first window until it got a
pre-roll ahead, however fast the engine, and an engine far below its capacity refused requests (issue 42).

No starvation: queued work counts as due at most `max_wait_s` after it was queued, so work for a stream far
ahead of its listener waits a bounded time behind pressing work, not for ever.

engine.pacing is the listener's side of the same clock (how long a sentence waits before it plays, on an engine
slower than real time); this is the engine's side (what is due when, for every stream). They share the margin a
stream must be made faster than real time by (REALTIME_MARGIN).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from engine.pacing import REALTIME_MARGIN

T = TypeVar("T")

MARGIN_S = 0.2
"""Audio is due this long before its listener plays it: the listener's pre-roll (engine.bench.load PREROLL_S), so
the jitter of one delivery does not empty its buffer."""
FIRST_AUDIO_S = 0.25
"""A new stream's first audio is due this long after its request arrived: the first-audio target under load
(issue 42: p95 at most 250 ms at the highest rate), so a stream that waits for its first sound competes with live
streams' next windows instead of queueing behind all of them."""
PRESSING_S = 1.0
"""A stream whose next audio is due within this is pressing: background work (tuning) waits for it, and a live
stream this close to its listener is served before any new stream's first sentence (the servers that hold first
audio under load use the same bound)."""
MAX_WAIT_S = 2.0
"""Queued work counts as due at most this long after it was queued (the starvation bound)."""
AT_RISK_S = 0.05
"""Audio its listener holds below which a playing stream shown made fast enough (REALTIME_SPEED) is at risk of an
underrun: no new stream is admitted while one is (`DeadlineBoard.admit`). Well below MARGIN_S: windows come whole,
so a stream made at twice real time holds under its pre-roll before each window of the default schedule
(engine.windowing: growth 2) and is not late; one not shown fast enough is at risk below MARGIN_S."""
REALTIME_SPEED = REALTIME_MARGIN
"""A stream is made fast enough only at this many seconds of audio per second of the engine's time (the pacer's
margin: below it a loaded machine's jitter empties a listener's pre-roll): admission refuses a stream that would
slow a measured live one below it."""
SPEED_EVIDENCE_S = 0.25
"""Engine time after a stream's first audio before its speed counts: its first windows are small and come in a
burst."""
DECODE_BOUND_S = 0.1
"""The longest decoder call the most pressing window waits for when it has less slack than that: a batch is cut
to what the cost model says fits (BatchCost.cap), since a crowd's large batches take many times one window's
call."""


@dataclass(frozen=True, slots=True)
class DeadlinePolicy:
    """The numbers every stage's ordering uses (one object, shared)."""

    margin_s: float = MARGIN_S
    first_audio_s: float = FIRST_AUDIO_S
    pressing_s: float = PRESSING_S
    max_wait_s: float = MAX_WAIT_S
    at_risk_s: float = AT_RISK_S
    decode_bound_s: float = DECODE_BOUND_S
    realtime_speed: float = REALTIME_SPEED
    speed_evidence_s: float = SPEED_EVIDENCE_S

    def key(self, due_at: float | None, queued_at: float) -> float:
        """What a queue orders by, smallest first: the stream's due time, capped at `queued_at + max_wait_s` so that
        nothing waits without bound; work of no known stream (None: warm-up, a voice's conditioning) counts as due
        at that cap."""
        cap = queued_at + self.max_wait_s
        return cap if due_at is None or due_at > cap else due_at

    def order(self, items: Sequence[T], key: Callable[[T], float]) -> list[int]:
        """Indices of `items` most pressing first; ties keep their queue order."""
        keys = [key(item) for item in items]
        return sorted(range(len(items)), key=lambda i: (keys[i], i))

    def pressing(self, due_at: float | None, now: float) -> bool:
        return due_at is not None and due_at - now < self.pressing_s


@dataclass(slots=True)
class StreamClock:
    """One stream's deadline: when it arrived, when its first audio went out, and how much audio went out since."""

    arrived_at: float
    first_audio_at: float | None = None
    audio_s: float = 0.0
    """Seconds of audio handed on (pauses between sentences included: the listener plays them too)."""
    first_s: float = 0.0
    """Seconds of its first chunk (not part of its measured speed: it came before the clock started)."""
    playing_at: float | None = None
    """When its listener started playing: once it held its pre-roll (the policy's `margin_s`), as our player does
    (engine.bench.playback simulate_player). None while it still fills it (the first window carries less)."""
    made_in_s: float = 0.0
    """Engine time from its first audio to its latest chunk (its consumer's waits left out): what the audio after
    the first chunk took to make."""
    held: bool = False
    """Audio is ready and waits for its consumer to take it (a client that reads slowly or not at all): the
    engine is not what keeps this stream's listener waiting, so it is neither pressing nor at risk."""
    held_since: float = 0.0
    held_s: float = 0.0
    """Time since its first audio that its consumer kept it waiting (not the engine's time, as in engine.pacing)."""

    def heard(self, seconds: float, now: float, preroll_s: float = MARGIN_S) -> None:
        """`seconds` of audio went to the listener at `now`; its listener starts once it holds `preroll_s`."""
        if self.first_audio_at is None:
            self.first_audio_at, self.first_s = now, seconds
        else:
            self.made_in_s = now - self.first_audio_at - self._held_until(now)
        self.audio_s += seconds
        if self.playing_at is None and self.audio_s >= preroll_s:
            self.playing_at = now

    def hold(self, held: bool, now: float) -> None:
        """Its audio waits for its consumer (True) or the consumer asked for more (False)."""
        if held and not self.held:
            self.held_since = now
        elif self.held and not held and self.first_audio_at is not None:
            self.held_s += now - max(self.held_since, self.first_audio_at)
        self.held = held

    def _held_until(self, now: float) -> float:
        """Time since its first audio that its consumer kept it waiting, up to `now` (a wait under way counted)."""
        if not self.held or self.first_audio_at is None:
            return self.held_s
        return self.held_s + now - max(self.held_since, self.first_audio_at)

    def due_at(self, policy: DeadlinePolicy) -> float:
        """When its next audio must be out for a real-time listener not to run dry, counted strictly (as if it
        played from the first audio): the ordering key of every stage's queue."""
        if self.first_audio_at is None:
            return self.arrived_at + policy.first_audio_s
        return self.first_audio_at + self.audio_s - policy.margin_s

    def at_risk(self, now: float, policy: DeadlinePolicy) -> bool:
        """Whether the engine is letting its listener down. Before its first audio: when that is late by more than
        `pressing_s` past its budget (a little late is the engine's own latency, a lot is a line of streams).
        After it, while its listener still fills its pre-roll (the first window carries less): when the rest of
        the pre-roll is overdue, not there within `margin_s / realtime_speed` of engine time (the window that
        completes it carries about a pre-roll: it is late only for an engine slower than `realtime_speed`). Once
        it plays, a stream shown made fast enough (`pace` at least `realtime_speed`) is at risk only when its
        listener holds less than `at_risk_s` (windows come whole, so such a stream dips below its pre-roll before
        each one by design); any other when its listener holds less than its pre-roll (`margin_s`). A stream
        held by its consumer never is."""
        if self.held:
            return False
        if self.first_audio_at is None:
            return now - self.arrived_at > policy.first_audio_s + policy.pressing_s
        if self.playing_at is None:
            waited = now - self.first_audio_at - self._held_until(now)
            return waited > policy.margin_s / policy.realtime_speed
        left = self.playing_at + self.audio_s - now
        pace = self.pace()
        fast = pace is not None and pace >= policy.realtime_speed
        return left < (policy.at_risk_s if fast else policy.margin_s)

    def pace(self) -> float | None:
        """Seconds of audio after the first chunk per second of engine time, up to its latest chunk; None before
        a second chunk."""
        if self.first_audio_at is None or self.made_in_s <= 0:
            return None
        return (self.audio_s - self.first_s) / self.made_in_s

    def speed(self, now: float, policy: DeadlinePolicy) -> float | None:
        """Seconds of audio made per second of the engine's time, from its first audio to its latest chunk (its
        consumer's waits left out): what the engine made, not the time since, in which a window is under way and
        counts only once it is whole; None until `speed_evidence_s` of such time. A stream that stalls after
        that keeps its speed and shows up as at risk instead (`at_risk`)."""
        if self.made_in_s < policy.speed_evidence_s:
            return None
        return self.pace()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether one more stream is admitted now, and if not why (when to ask again is the front end's to say: it
    knows how long its live responses still run, voiceapp.http.rules retry_after_s)."""

    admit: bool
    reason: str = ""


class DeadlineBoard:
    """Every live stream's clock, by request id: the pipeline opens, feeds and closes them; the schedulers read due
    times (`due_at`, from any thread: a lookup, no iteration); the front ends ask `admit`."""

    def __init__(self, policy: DeadlinePolicy = DeadlinePolicy(), clock: Callable[[], float] = time.perf_counter,
                 capacity_streams: float | None = None) -> None:
        self.policy, self.clock = policy, clock
        self.capacity_streams = capacity_streams
        """Streams the engine carries in real time, where it says (the tuned stream limit, a fake engine's known
        throughput); None: unknown, and only the live streams' slack decides admission."""
        self._clocks: dict[str, StreamClock] = {}

    def open(self, request_id: str) -> None:
        self._clocks[request_id] = StreamClock(self.clock())

    def heard(self, request_id: str, seconds: float) -> None:
        stream = self._clocks.get(request_id)
        if stream is not None:
            stream.heard(seconds, self.clock(), self.policy.margin_s)

    def hold(self, request_id: str, held: bool) -> None:
        """Whether the stream's next audio is ready and waits for its consumer (StreamClock.held)."""
        stream = self._clocks.get(request_id)
        if stream is not None:
            stream.hold(held, self.clock())

    def close(self, request_id: str) -> None:
        self._clocks.pop(request_id, None)

    @property
    def live(self) -> int:
        return len(self._clocks)

    def due_at(self, request_id: str) -> float | None:
        """When the stream's next audio is due (None: no such live stream)."""
        stream = self._clocks.get(request_id)
        return None if stream is None else stream.due_at(self.policy)

    def key(self, request_id: str, queued_at: float) -> float:
        """The policy's ordering key for work of this stream queued at `queued_at`."""
        return self.policy.key(self.due_at(request_id), queued_at)

    def pressing(self, now: float | None = None) -> int:
        """Live streams whose next audio is due within the policy's `pressing_s`."""
        now = self.clock() if now is None else now
        return sum(not s.held and self.policy.pressing(s.due_at(self.policy), now)
                   for s in list(self._clocks.values()))

    def awaiting_first(self) -> int:
        """Live streams still waiting for their first audio (their consumer not holding them)."""
        return sum(s.first_audio_at is None and not s.held for s in list(self._clocks.values()))

    def awaits_first(self, request_id: str) -> bool:
        """Whether this live stream still waits for its first audio (its consumer not holding it)."""
        stream = self._clocks.get(request_id)
        return stream is not None and stream.first_audio_at is None and not stream.held

    def at_risk(self, now: float | None = None) -> int:
        """Live streams whose listener the engine is letting down (StreamClock.at_risk)."""
        now = self.clock() if now is None else now
        return sum(s.at_risk(now, self.policy) for s in list(self._clocks.values()))

    def admit(self, now: float | None = None) -> Verdict:
        """Whether a new stream may start now without pushing a live one into an underrun: below the declared
        capacity (where there is one), no live stream at risk, and every measured live stream fast enough to
        share the engine with one more (`shared_speed`)."""
        now = self.clock() if now is None else now
        live = self.live
        if self.capacity_streams is not None and live + 1 > self.capacity_streams:
            return Verdict(False, f"{live} streams live, the most this engine carries in real time")
        risk = self.at_risk(now)
        if risk:
            return Verdict(False, f"{risk} of {live} live streams are close to running dry")
        shared = self.shared_speed(now)
        if shared is not None and shared < self.policy.realtime_speed:
            return Verdict(False, f"{live} live streams would slow to {shared:.2f}x real time with one more")
        return Verdict(True)

    def shared_speed(self, now: float | None = None) -> float | None:
        """The slowest measured live stream's speed once one more stream shares the engine: the engine's time is
        shared, so each stream's share shrinks by live / (live + 1). None while no stream is measured."""
        now = self.clock() if now is None else now
        streams = [s for s in list(self._clocks.values()) if not s.held]
        speeds = [v for v in (s.speed(now, self.policy) for s in streams) if v is not None]
        if not speeds:
            return None
        live = self.live
        return min(speeds) * live / (live + 1)

    def capacity(self, now: float | None = None) -> float | None:
        """Streams the engine carries in real time, as far as the live ones show: the declared capacity, else the
        slowest measured stream's speed times the live streams (what each would get, shared), at REALTIME_SPEED;
        None while nothing says."""
        if self.capacity_streams is not None:
            return self.capacity_streams
        shared = self.shared_speed(now)
        return None if shared is None else shared * (self.live + 1) / self.policy.realtime_speed


@dataclass
class BatchCost:
    """What a decoder call of B windows costs, learnt from the calls made (an exponential average per batch size),
    and the largest batch that keeps the most pressing window's wait bounded (`cap`)."""

    smoothing: float = 0.3
    """Weight of the newest call in a batch size's average."""
    seconds: dict[int, float] = field(default_factory=dict)
    """Average seconds of a call, by its batch size."""
    reach: int = 4
    """How many times the largest measured batch the cost is extrapolated to. Proportional cost is an upper bound that
    loosens with the distance (a GPU's call of many windows costs a fraction of as many single ones): past this, a
    batch is unknown, as before any call, and goes uncut, so an engine that served only a few streams does not
    cut a sudden crowd's first calls into small, slow ones (and so learns that crowd's real cost)."""

    def note(self, batch: int, seconds: float) -> None:
        old = self.seconds.get(batch)
        self.seconds[batch] = seconds if old is None else old + self.smoothing * (seconds - old)

    def estimate(self, batch: int) -> float | None:
        """Seconds a call of `batch` windows should take: the average of the nearest size measured at or above it,
        else scaled up from the largest below it (a call costs at most in proportion to its windows); None before
        any call."""
        if not self.seconds:
            return None
        above = [b for b in self.seconds if b >= batch]
        if above:
            return self.seconds[min(above)]
        largest = max(self.seconds)
        return self.seconds[largest] * batch / largest

    def cap(self, slack_s: float, most: int, bound_s: float) -> int:
        """The most windows (1 to `most`) one call may take while the most pressing of them, due in `slack_s`,
        waits no longer than max(slack_s, bound_s); `most` while nothing was measured within `reach` of it, and
        `most` where that window is late already (slack_s <= 0): its listener has run dry whatever the batch, and a
        smaller batch only slows every later window (an overloaded decoder makes up time only by its largest
        batches). The estimate is constant between two measured sizes and linear past the largest, so only those
        edges are tried."""
        budget = max(slack_s, bound_s)
        if not self.seconds or slack_s <= 0 or most > self.reach * max(self.seconds):
            return most
        largest = max(self.seconds)
        edges = [b for b in self.seconds if b < most] + [most]
        if most > largest:  # past the largest measured size: as many windows as its rate fits in the budget
            edges.append(min(most, int(budget * largest / self.seconds[largest])))
        fits = [b for b in edges if b >= 1 and (self.estimate(b) or 0.0) <= budget]
        return max(fits, default=1)
