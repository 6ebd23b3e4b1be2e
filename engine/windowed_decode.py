"""Provides WindowedDecode: one sentence's streaming decode, minus the decoder call. Pure.

It plans the windows as codes arrive (engine.windowing), builds each window's decoder input (widened leftwards to
a standard length where the decoder wants equal shapes, engine.batching) and joins the decoded audio across seams
(engine.crossfade). The pipeline and the benchmark's `stream_decode` both decode through it, so the bench
measures exactly the pipeline's windows.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.backends.base import DecodeItem
from engine.batching import widen_left
from engine.crossfade import Crossfader
from engine.windowing import Window, WindowPlanner, WindowSchedule, planned_windows


class WindowedDecode:
    """One sentence's windows, their decoder inputs and their joined audio; one instance per sentence."""

    def __init__(self, schedule: WindowSchedule, globals_: Sequence[int], samples_per_code: int,
                 lengths: Sequence[int] = ()) -> None:
        self.planner = WindowPlanner(schedule)
        self.globals = tuple(globals_)
        self.samples_per_code = samples_per_code
        self.lengths = tuple(lengths)
        """Standard window lengths to widen each window to (empty: decode every window at its own length)."""
        self._fader = Crossfader()

    def next_window(self, available: int, done: bool) -> Window | None:
        """The next window given `available` codes so far (all of them when `done`), or None if it must wait."""
        return self.planner.next_window(available, done)

    def item(self, window: Window, codes: Sequence[int]) -> DecodeItem:
        """The decoder input for `window` of the sentence's `codes`: its codes and the span whose audio it keeps."""
        item = DecodeItem(tuple(codes[window.start:window.stop]), self.globals, window.emit_start - window.start,
                          window.emit_stop - window.start, window.start)
        if not self.lengths:
            return item
        return widen_left(item, codes, window.start, self.lengths, pad_after=self.planner.schedule.left)

    def join(self, window: Window, pcm: np.ndarray) -> np.ndarray:
        """The window's decoded audio ready to play: its head blended over the previous window's held-back tail,
        its own tail held back for the next window."""
        spc = self.samples_per_code
        return self._fader.push(pcm, window.head * spc, window.tail * spc)


def uncovered_lengths(schedule: WindowSchedule, lengths: Sequence[int]) -> tuple[int, ...]:
    """Window lengths that no standard length in `lengths` covers, over every sentence length under `schedule` and
    its busy and ahead variants: the first windows of short sentences, which have too few codes before them to be
    widened (`widen_left` pads only a window that holds a whole left context). Beyond twice the longest standard
    length every window holds one, so longer sentences add none."""
    odd: set[int] = set()
    for variant in schedule.variants():
        for count in range(1, 2 * max(lengths) + 1):
            decode, codes = WindowedDecode(variant, (), 1, lengths), list(range(count))
            odd.update(len(decode.item(window, codes).codes) for _, window in planned_windows(decode.planner, count))
    return tuple(sorted(odd - set(lengths)))
