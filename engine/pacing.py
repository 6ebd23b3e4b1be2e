"""Provides Pacer: how much of a sentence `speak` holds back from the player, so that speech never stops mid-sentence
on a machine that makes it slower than real time. Pure (no clocks: the caller passes the time).

While audio comes faster than it plays, each chunk goes to the player as it arrives (the player's short pre-roll
covers the jitter). Once the engine is measured slower than that, at speed s, a sentence that may last D seconds
plays through without a gap only if it starts late enough that what is still to come arrives before it is due.
Windows arrive whole (`Pacer.windows_s`), so from its latest chunk the pacer predicts when each later window of the
sentence arrives at speed s (with a margin) and starts the sentence at the first moment from which none of them
comes late (`RequestPace.release_at`): a moment the caller keeps by its clock, not only when a chunk comes. A
sentence whose length is unknown is held until it is complete. The listener hears longer pauses between sentences
instead of gaps inside them. The speed is the audio a sentence's chunks after its first carried over the time they
took to come, not counting the time `speak` spent blocked on a full player (which would cap any engine at real
time); it counts only once it rests on MIN_INTERVALS intervals between chunks, and it is the lower of that measured
from the first chunk and that measured from the second, because a first chunk that comes late (a slow first
decode, while the LLM went on) brings the next ones in a burst and makes the first interval, or any span that starts
with it, look fast. A sentence rendered ahead of its turn (a lone listener's next sentence, on an engine that steps
two at once) comes out in a burst when its turn comes: its chunks are timed by when they were made
(AudioChunk.made_at), and its later windows predicted by the schedule it renders with (`ahead_windows_s`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

REALTIME_MARGIN = 1.15
"""Stream a sentence as it is made only where audio comes at least this many times faster than it plays: below
it, the jitter of a loaded machine empties the player's small pre-roll."""
RECOVERED_MARGIN = 1.4
"""A paced engine goes back to streaming after a sentence made this much faster than real time (the machine's
load went away); higher than REALTIME_MARGIN so that it does not flip at every sentence."""
MIN_INTERVALS = 2
"""Intervals between a sentence's chunks before its speed counts: one interval alone cannot tell a fast engine
from a late chunk followed by a burst, so a speed never rests on the first one alone."""
LEAD_MARGIN_S = 0.01
"""What a player that starts at a request's first chunk keeps beyond the device's pull (`preroll_s`): the lead it
was measured with is the least of one earlier request, and the next may come a little later."""
PREROLL_S = 0.2
"""A player's pre-roll while the engine's speed is not known yet, it is slow, or a request's first chunk does not
come far enough ahead of the next one for the device (`Pacer.preroll_s`): `say`'s, and the speechd module's."""
FAST_PREROLL_S = 0.0
"""The pre-roll otherwise: the least the player takes (its device's pull), so that a request plays from its first
chunk. At say's latency (0.1 s) the device takes more as it starts than a Spark request's first window holds, so a
request starts with its second chunk; smaller latencies, which let the first chunk start it, left gaps on a loaded
machine (the device ran dry mid-message), so players keep say's latency and the lead rule
decides."""
MIN_EVIDENCE_S = 0.2
"""Audio, after a sentence's second chunk, measured before its speed counts (unless the sentence ends first): the
third window of the default schedule (engine.windowing) carries 0.48 s, so a probed first sentence is judged as
its third chunk comes."""


@dataclass
class Pacer:
    """One engine's pacing: what it measured carries over from request to request; each `speak` call paces its own
    sentences through `request()`."""

    probe_first: bool = False
    """Hold a request's sentences until one of them gives a speed (MIN_INTERVALS, MIN_EVIDENCE_S): engines that
    compute on the CPU, where the first sentence could otherwise start playing and then stall. Engines without it
    (CUDA) stream from the first chunk and are paced only once measured slow."""
    slow: bool = False
    """Measured slower than REALTIME_MARGIN: each sentence waits until it can play through (`start_after`)."""
    speed: float | None = None
    """The last measured speed: seconds of audio made per second of the engine's time."""
    announced: bool = False
    """The listener has been told (once) that sentences wait before they play."""
    windows_s: tuple[float, ...] = ()
    """Audio of each window a sentence comes in, in order, the last repeating (the decode schedule's): a window
    arrives whole, once all of it is made, so a sentence must wait longer than a steady flow would need
    (`start_after`). Empty: audio counted as a steady flow."""
    ahead_windows_s: tuple[float, ...] = ()
    """The same of a sentence rendered ahead of its turn (WindowSchedule.ahead: larger windows); empty: `windows_s`."""
    lead_s: float | None = None
    """How far ahead of real time the last request's first sentence came, at its tightest: played from its first
    chunk as that came, the least audio it had in hand as each later chunk came (`_Sentence.lead_s`). None until a
    first sentence of two chunks or more was measured."""

    @classmethod
    def from_hello(cls, info: Mapping[str, Any], *, probe: bool = True, learnt: bool = False) -> "Pacer":
        """A client's pacer for the server whose hello is `info`: its engine's windows and whether it probes
        (engine.engine_api.describe_engine's "paced_*"; `probe` False: this client plays nothing, a file). With
        `learnt`, it also starts from what the server measured of its recent requests (`measured`): a client that
        lives for one request (`say`) has nothing of its own to go on. An engine measured fast there is not probed
        again (`fast`); one measured slow, or not yet, is, as before."""
        speed, lead = info.get("paced_speed"), info.get("paced_lead_s")
        pacer = cls(probe_first=probe and bool(info.get("paced_start")),
                    windows_s=tuple(float(w) for w in info.get("paced_windows_s") or ()),
                    ahead_windows_s=tuple(float(w) for w in info.get("paced_ahead_windows_s") or ()))
        if learnt and isinstance(speed, (int, float)) and speed > 0:
            pacer.speed, pacer.slow = float(speed), bool(info.get("paced_slow"))
            pacer.lead_s = float(lead) if isinstance(lead, (int, float)) else None
            pacer.probe_first = pacer.probe_first and not pacer.fast
        return pacer

    def measured(self) -> dict[str, Any]:
        """What it learnt, as a server tells its clients in its hello (`from_hello` reads it): the speed (None
        until measured), whether that is slow, and the first sentences' lead."""
        speed = self.speed if self.speed is not None and math.isfinite(self.speed) else None  # JSON has no inf
        return {"paced_speed": speed, "paced_slow": self.slow, "paced_lead_s": self.lead_s}

    @property
    def fast(self) -> bool:
        """Measured well ahead of real time (RECOVERED_MARGIN): a request may play from its pre-roll without first
        learning the speed again."""
        return self.speed is not None and not self.slow and self.speed >= RECOVERED_MARGIN

    def request(self) -> "RequestPace":
        """The pacing of one `speak` call."""
        return RequestPace(self)

    def start_after(self, planned_s: float | None, made_s: float, chunks: int, ahead: bool = False) -> float:
        """Seconds after a sentence's latest chunk (its `chunks`-th, which brought it to `made_s` of audio) from which
        it plays to its end without a gap: at the measured speed s (over the margin), each window still to come, from
        a to b into the sentence (windows_s, cut at the planned length D), arrives (b - made_s)/s after that chunk and
        must be there once a has played. Negative: it could have started already; inf: its length or the speed is
        unknown; -inf where nothing is held (an engine not measured slow with no windows or length to plan with).
        `ahead`: the sentence was rendered ahead of its turn, in `ahead_windows_s`."""
        windows = (ahead and self.ahead_windows_s) or self.windows_s
        if not self.slow and (planned_s is None or self.speed is None or not windows):
            return -math.inf
        if planned_s is None or self.speed is None:
            return math.inf
        speed = self.speed / REALTIME_MARGIN
        if not windows:  # a steady flow: the instant that comes latest is the end, or the next one
            return max((planned_s - made_s) / speed - planned_s, -made_s)
        wait, start, k = -math.inf, made_s, chunks
        while start < planned_s:
            end = min(planned_s, start + windows[min(k, len(windows) - 1)])
            wait, start, k = max(wait, (end - made_s) / speed - start), end, k + 1
        return wait

    @property
    def holds_sentences(self) -> bool:
        """Whether a sentence may be held back before it plays: once slow, and on an engine that plans holds for
        its windows (one that may lag, with windows_s), so the player takes the gap between sentences for a pause."""
        return self.slow or (self.probe_first and bool(self.windows_s))

    def notice(self) -> str | None:
        """What to tell the listener, once, when the engine turned out slower than real time."""
        if not self.slow or self.announced or self.speed is None:
            return None
        self.announced = True
        return (f"speech comes at {self.speed:.2f}x real time here, too slow to play as it is made: each sentence "
                f"starts once enough of it is ready to play through (pauses between sentences, none within)")

    def preroll_s(self, default_s: float, floor_s: float, pull_s: float) -> float:
        """The pre-roll of a player whose device takes `pull_s` of audio ahead of real time as it starts (its primed
        buffer and a callback's block): `floor_s`, so that the request plays from its first chunk, where the last
        request's first sentence came far enough ahead of real time for that (`lead_s`, at least `pull_s` and
        LEAD_MARGIN_S) from an engine measured well ahead of it; else `default_s`, while the engine is unmeasured or
        held back (slow, or below RECOVERED_MARGIN: a slow engine keeps the margin it is paced with)."""
        if self.speed is None or self.slow or self.speed < RECOVERED_MARGIN or self.lead_s is None:
            return default_s
        return min(default_s, floor_s) if self.lead_s >= pull_s + LEAD_MARGIN_S else default_s

    def judge(self, speed: float) -> None:
        """A sentence's measured speed: slow below REALTIME_MARGIN, fast again from RECOVERED_MARGIN."""
        self.speed = speed
        if not self.slow and speed < REALTIME_MARGIN:
            self.slow = True
        elif self.slow and speed >= RECOVERED_MARGIN:
            self.slow = False


class RequestPace:
    """One request's pacing: the sentence being made, and whether the request still waits for a speed. What it
    measures goes to its engine's Pacer, so concurrent requests on one engine each keep their own sentences."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self._sentence = _Sentence()
        self._probing = pacer.probe_first
        """No sentence of this request has given a speed yet: hold each until its own does (or it ends)."""
        self._first = True
        """The sentence being made is the request's first (its lead goes to the Pacer)."""

    def blocked(self, seconds: float) -> None:
        """`speak` waited this long on a full player: not the engine's time (unless the sentence being made renders
        ahead of its turn, whatever `speak` does)."""
        if not self._sentence.ahead:
            self._sentence.blocked_s += seconds

    def arrived(self, seconds: float, sentence_end: bool, now: float, planned_s: float | None = None,
                made_at: float | None = None) -> bool:
        """A chunk of `seconds` of audio came at `now` (made at `made_at`, where that was earlier: rendered ahead of
        its turn) from a sentence that may last `planned_s`: whether to hold it (and those held before it) back. A
        chunk that is not held releases every held one before it; once part of a sentence plays, the rest follows as
        it comes (holding it then would open a gap inside the sentence)."""
        s = self._sentence
        if s.chunks == 0:
            s.ahead = made_at is not None
        s.note(seconds, now if made_at is None else made_at, planned_s)
        if s.measured(sentence_end):
            self.pacer.judge(s.speed())
            self._probing = False
        if sentence_end:
            if self._first and s.chunks > 1:
                self.pacer.lead_s = s.lead_s
            self._first = False
            self._sentence = _Sentence()
            return False
        if not s.released:
            s.released = self._start_at() <= now
        return not s.released

    def release_at(self) -> float | None:
        """When the held part of the sentence being made may start playing without waiting for its next chunk
        (`release` then), as `arrived` would have let it go had a chunk come then; None while nothing is held, or
        until another chunk: its length or speed is not known yet, or the speed is not yet the sentence's own (its
        first windows, small, come slower than the speed of a whole sentence before it; so until its own is measured,
        it starts only as a chunk comes, as the arrivals then show)."""
        s = self._sentence
        if s.chunks == 0 or s.released or not s.measured(sentence_end=False):
            return None
        at = self._start_at()
        return at if math.isfinite(at) else None

    def release(self) -> None:
        """The held part of the sentence went to the player (at `release_at`): the rest follows as it comes."""
        self._sentence.released = True

    def _start_at(self) -> float:
        """When the sentence being made may start playing: after its latest chunk by the Pacer's `start_after`, never
        while the request still waits for a speed (inf)."""
        s = self._sentence
        if self._probing:
            return math.inf
        return s.last_at + self.pacer.start_after(s.planned_s, s.audio_s, s.chunks, s.ahead)


@dataclass
class _Sentence:
    """The chunks of the sentence being made."""

    chunks: int = 0
    first_at: float = 0.0
    second_at: float = 0.0
    last_at: float = 0.0
    audio_s: float = 0.0
    """Audio of its chunks so far."""
    evidence_s: float = 0.0
    """Audio of its chunks after the first."""
    later_s: float = 0.0
    """Audio of its chunks after the second."""
    blocked_s: float = 0.0
    """Time since its first chunk that `speak` spent blocked on the player."""
    blocked_at_second: float = 0.0
    """`blocked_s` as its second chunk came."""
    released: bool = False
    """Some of it went to the player."""
    planned_s: float | None = None
    """The most audio it may make, where known."""
    ahead: bool = False
    """It was rendered ahead of its turn: its chunks' times are when they were made."""
    lead_s: float = math.inf
    """Played from its first chunk as that came: the least audio not yet played as each later chunk came."""

    def note(self, seconds: float, now: float, planned_s: float | None) -> None:
        if self.chunks == 0:
            self.first_at = now
            self.blocked_s = 0.0  # waits while the sentence before it was written are not its own
        else:
            self.evidence_s += seconds
            self.lead_s = min(self.lead_s, self.audio_s - (now - self.first_at - self.blocked_s))
        if self.chunks == 1:
            self.second_at, self.blocked_at_second = now, self.blocked_s
        elif self.chunks >= 2:
            self.later_s += seconds
        self.audio_s += seconds
        self.last_at = now
        self.planned_s = planned_s
        self.chunks += 1

    def measured(self, sentence_end: bool) -> bool:
        """Whether its speed counts: MIN_INTERVALS intervals, and MIN_EVIDENCE_S after the second chunk unless it
        ended. Once true it stays true while the sentence goes on (its chunks and audio only grow)."""
        return self.chunks > MIN_INTERVALS and (self.later_s >= MIN_EVIDENCE_S or (sentence_end and self.later_s > 0))

    def speed(self) -> float:
        """The lower of its speed since the first chunk and since the second: a late first chunk shortens the
        first interval, so a span that starts with it alone could make a slow engine look fast."""
        since_first = _rate(self.evidence_s, self.last_at - self.first_at - self.blocked_s)
        since_second = _rate(self.later_s, self.last_at - self.second_at - (self.blocked_s - self.blocked_at_second))
        return min(since_first, since_second)


def _rate(audio_s: float, took: float) -> float:
    return float("inf") if took <= 0 else audio_s / took
