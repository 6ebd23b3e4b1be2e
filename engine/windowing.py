"""Provides the streaming decode schedule: which codes to decode next and which of their samples to emit. Pure.

BiCodec has no causal state: streaming means decoding overlapping windows. Each window decodes
`left` codes of already-emitted context, the new codes, and up to `right` codes of lookahead; it emits the
samples of the new codes plus a `crossfade` tail that the next window's head blends over.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator


WHOLE_CODES = 750
"""15 s of codes: WindowSchedule.whole()'s window."""


@dataclass(frozen=True, slots=True)
class WindowSchedule:
    """Streaming decode knobs (in semantic codes; 1 code = 20 ms of audio).

    Defaults come from the seam-error table in docs/decoder-context.md. What sets a seam's error is the
    right context of the samples just before it (the crossfade starts there with the old window at full
    weight), so `right` is the quality knob: 16 codes keeps the error near -50 dB on random-init weights,
    8 gives about -14 dB. Left context is cheap (codes already exist), so it matches.
    """

    first_new: int = 4
    """New codes in the first window: small so first audio comes after first_new + right LLM steps; it does
    not change seam quality (that is `right`)."""
    new: int = 12
    """New codes in the second window; later windows grow by `growth` up to `max_new`. Each window's audio
    must outlast the generation of the next one: with growth 2 that holds from 2x real-time generation up,
    and the player's pre-roll covers the rest. Small early windows cost decoder throughput (`left` + `right`
    codes of context per window), which crowds cannot afford: hence `busy_streams`."""
    growth: float = 2.0
    """Each later window is this many times larger (fewer decoder calls once playback is safely ahead)."""
    max_new: int = 96
    """Upper bound on new codes per window (bounds decode latency and memory)."""
    left: int = 16
    """Left context codes (already emitted; costs compute only)."""
    right: int = 16
    """Right context codes (lookahead; costs latency: the LLM must be this far ahead)."""
    first_right: int | None = None
    """Right context of the first window only (None = `right`); smaller trades first-seam quality for TTFA."""
    busy_streams: int = 48
    """Above this many concurrent requests, sentences use `busy()`'s larger windows, which keep up where each
    stream generates slower and decode batches queue."""
    solo_streams: int = 1
    """Up to this many concurrent requests (one listener), a request's next sentence starts with the current one
    instead of at its first audio (with eager lookahead: batching backends). The two rows step side by side at
    nearly one row's cost on the graph lane, so a two-sentence request finishes sooner without moving its first
    audio."""
    busy_first_new: int = 16
    """`busy()`'s first window: under load the player waits for its pre-roll anyway, so a larger first window
    costs no first audio and saves decoder throughput."""
    busy_new: int = 24
    """`busy()`'s second window (later ones grow by `busy_growth`): small enough to follow the first chunk
    before its audio runs out, even when a crowd's first decode calls are cut small and its first chunks come
    early."""
    busy_growth: float | None = None
    """`busy()`'s growth (None: `growth`). A window comes whole, so a stream whose LLM makes its codes at s x real
    time plays without a gap only while its windows grow by no more than about s each: the busy schedule of a
    family whose crowds run near real time grows by less (engine.bench.playback `window_arrivals`)."""
    crossfade: int = 2
    """Codes at each seam whose audio is crossfaded between the two windows; must be < right."""

    def __post_init__(self) -> None:
        if not (self.first_new >= 1 and self.new >= 1 and self.max_new >= self.new and self.growth >= 1
                and (self.busy_growth is None or self.busy_growth >= 1)):
            raise ValueError("window sizes must be >= 1, max_new >= new, growth >= 1")
        # right >= 1 guarantees that every sentence ends with a final window (where its fade-out goes).
        rights = (self.right, self.right if self.first_right is None else self.first_right)
        if not (0 <= self.left and min(rights) >= 1 and 0 <= self.crossfade < min(rights)):
            raise ValueError("need left >= 0, right >= 1 and 0 <= crossfade < right")

    def right_context(self, window_index: int) -> int:
        """Lookahead codes required before window number `window_index` may be decoded."""
        if window_index == 0 and self.first_right is not None:
            return self.first_right
        return self.right

    @classmethod
    def whole(cls, codes: int = WHOLE_CODES) -> "WindowSchedule":
        """For rendering, not streaming (export): a sentence of up to 15 s is decoded in one pass once all its
        codes exist, so it has no seams at all and costs one decoder call instead of ~8; longer ones are cut
        into 15 s windows (which bounds the decoder's memory), seamed like any other."""
        return cls(first_new=codes, new=codes, growth=1.0, max_new=codes, busy_streams=1 << 30)

    def busy(self) -> "WindowSchedule":
        """The schedule for a loaded engine: larger first windows (`busy_first_new`, `busy_new`) growing by
        `busy_growth`, same context and seams."""
        return replace(self, first_new=max(self.first_new, self.busy_first_new), new=max(self.new, self.busy_new),
                       max_new=max(self.max_new, self.busy_new),
                       growth=self.growth if self.busy_growth is None else self.busy_growth)

    def finer(self) -> "WindowSchedule":
        """For an engine that makes speech at one to a few times real time with the decoder on cores of its own (a
        many-core CPU): windows grow by 1.5 up to 64 codes. A window comes whole, once all of it is made, so between
        one and about two times real time growth 2 needs a longer hold before a sentence plays (engine.pacing); the
        extra windows cost the decoder's own cores, not the LLM's."""
        return replace(self, growth=1.5, max_new=min(self.max_new, 64))

    def ahead(self) -> "WindowSchedule":
        """The schedule of a sentence decoded ahead of its turn (a lone request's next sentence, side by side
        with the current one): its audio is needed only once the current sentence has played, so it skips the
        small windows first sound needs and starts at this schedule's third window (+ `left` new codes in the
        first, which has no left context), so that it is not decoded together with the current sentence's first
        window, which would delay first audio. Every window keeps a length of this
        schedule's (the decoder's graphs)."""
        later = self.new_codes(2)
        return replace(self, first_new=max(self.first_new, later + self.left), new=max(self.new, later),
                       max_new=max(self.max_new, later), first_right=None)

    def variants(self) -> tuple["WindowSchedule", ...]:
        """This schedule and those the pipeline switches a sentence to (`busy`, `ahead`): every window shape it
        decodes comes from one of them."""
        return self, self.busy(), self.ahead()

    def new_codes(self, window_index: int) -> int:
        """New codes emitted by window number `window_index` (0-based)."""
        if window_index == 0:
            return self.first_new
        return min(self.max_new, int(self.new * self.growth ** (window_index - 1)))


@dataclass(frozen=True, slots=True)
class Window:
    """One planned decode: code indices are absolute within the sentence."""

    start: int
    """First code fed to the decoder (includes left context)."""
    stop: int
    """One past the last code fed to the decoder (includes right context)."""
    emit_start: int
    """First code whose samples this window emits; its first `head` codes blend with the previous window's
    held-back tail, which covered the same codes."""
    emit_stop: int
    """One past the last code whose samples this window emits (includes the held-back crossfade tail)."""
    head: int
    """Codes at the start of the emitted span that crossfade with the previous window's tail."""
    tail: int
    """Codes at the end of the emitted span held back for the next window's crossfade (0 on the last window)."""
    final: bool


class WindowPlanner:
    """Plans windows for one sentence as codes arrive. Owns only indices; one instance per sentence."""

    def __init__(self, schedule: WindowSchedule) -> None:
        self.schedule = schedule
        self.emitted = 0
        """Codes whose audio is final; the previous window's held-back tail covers the next `_pending_head`."""
        self.windows = 0
        self._pending_head = 0

    def next_window(self, available: int, done: bool) -> Window | None:
        """The next window to decode given `available` codes so far, or None if it must wait for more.

        When `done`, everything left is planned as one final window (no lookahead needed at the true end).
        """
        s = self.schedule
        remaining = available - self.emitted
        if remaining <= 0:
            return None
        want = max(s.new_codes(self.windows), self._pending_head)
        right = s.right_context(self.windows)
        if done and remaining <= want + right:
            return self._plan(available, available, final=True)
        if remaining < want + right:
            return None
        return self._plan(self.emitted + want, available, final=False)

    def _plan(self, new_stop: int, available: int, final: bool) -> Window:
        s = self.schedule
        tail = 0 if final else s.crossfade
        emit_start = self.emitted
        right = s.right_context(self.windows)
        window = Window(start=max(0, emit_start - s.left), stop=available if final else new_stop + right,
                        emit_start=emit_start, emit_stop=new_stop + tail, head=self._pending_head, tail=tail,
                        final=final)
        self.emitted = new_stop
        self._pending_head = tail
        self.windows += 1
        return window


def planned_windows(planner: WindowPlanner, codes: int) -> Iterator[tuple[int, Window]]:
    """Each window `planner` plans for a sentence of `codes` codes that come one at a time, with how many had come
    when it was planned (the last one ends the sentence)."""
    for available in range(1, codes + 1):
        while (window := planner.next_window(available, available == codes)) is not None:
            yield available, window
