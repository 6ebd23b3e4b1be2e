"""Provides cross-stream decode batching: many streams' windows become one decoder call. Pure (no torch).

`DecodeBatcher` wraps any CodecDecoder. Every stream awaits `batcher.decode(item)`; the first caller's window
goes to the decoder at once (no added latency when idle), and windows that arrive while a decode is in flight
are gathered and run as ONE `decoder.decode(items)` call when it returns. On a GPU a batch of B windows costs
about as much as one (launch-bound), so throughput grows with the number of streams instead of collapsing.

`widen_left` makes window shapes batchable: windows of equal code length go into one forward pass, so a window
is widened to the next standard length by taking more left context (codes that already exist; more context
only makes the decode more exact), instead of padding.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from engine.backends.base import CodecDecoder, DecodeItem
from engine.deadlines import BatchCost, DeadlineBoard
from engine.windowing import WindowSchedule

FIRST_AUDIO_HOLD_S = 0.03
"""How long the decoder holds back other streams' windows while a stream waits for its first audio (0: never): a
call under way when its first window comes makes that window wait for it. Longer than Spark's first window takes to
generate on a GPU, so there the hold usually ends as that window comes (Orpheus's takes longer: it then only goes
first)."""
FIRST_AUDIO_STREAMS = 16
"""Live streams up to which a stream waiting for its first audio goes first (and may hold the others back): with
few streams each one is made far ahead of its listener; in a crowd, deadlines alone decide."""
HOLD_POLL_S = 0.002
"""How often a held queue looks again whether the stream it waits for still waits (it also wakes on arrivals)."""
SLOW_CALL_S = 0.05
"""A decoder call at least this long is kept in BatchStats.slow (a window of a shape with no captured graph decodes
eagerly, and its first time may build kernels for it)."""
SLOW_CALLS = 64
"""Slow calls kept, the latest."""
RECENT_CALLS = 4096
"""Decoder calls whose sizes BatchStats keeps (a bound for a server that runs for weeks)."""
DECODE_BATCHES = (1, 4, 8, 16, 32, 64)
"""Window batches a decoder that replays CUDA graphs captures for each window length (a batch of B windows replays
the smallest >= B): any family's decoder, and what a server's tuning captures for crowds."""

@dataclass(slots=True)
class BatchStats:
    """Counters for tuning and benchmarks."""

    calls: int = 0
    """Decoder calls made."""
    items: int = 0
    """Windows decoded."""
    max_batch: int = 0
    """Largest batch seen."""
    retried_alone: int = 0
    """Windows re-decoded one by one after their batch failed (to find whose window was bad)."""
    capped: int = 0
    """Calls cut below max_batch so that the most pressing window waited less (engine.deadlines BatchCost)."""
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=RECENT_CALLS))
    """(call number, windows) of the latest RECENT_CALLS calls: how a benchmark level's first calls batched."""
    cost: BatchCost = field(default_factory=BatchCost)
    """Seconds a call took, by its batch size: what `capped` cuts by."""
    longest_s: float = 0.0
    """The longest call."""
    slow: deque[tuple[float, float, int, tuple[int, ...]]] = field(default_factory=lambda: deque(maxlen=SLOW_CALLS))
    """(started at, on time.perf_counter; seconds; windows; their code lengths) of the latest calls of at least
    SLOW_CALL_S: whether a stall every stream heard at once was one decoder call, and of what shape."""

    def note_call(self, items: Sequence[DecodeItem], started: float, took: float) -> None:
        self.cost.note(len(items), took)
        self.calls += 1
        self.items += len(items)
        self.max_batch = max(self.max_batch, len(items))
        self.recent.append((self.calls, len(items)))
        self.longest_s = max(self.longest_s, took)
        if took >= SLOW_CALL_S:
            self.slow.append((started, took, len(items), tuple(sorted({len(i.codes) for i in items}))))

    @property
    def mean_batch(self) -> float:
        return self.items / self.calls if self.calls else 0.0


class DecodeBatcher:
    """Gathers concurrent `decode(item)` calls into batched `decoder.decode(items)` calls on one executor.

    - Results are exactly what the decoder returns for each item (same order, same arrays).
    - At most `max_batch` windows and (if set) `max_codes` codes in all go into one call.
    - With `one_length`, a call holds windows of one length only (the oldest waiting window's): a decoder runs
      each length as its own forward pass and returns when all are done, so mixing lengths made every window wait
      for every other length's pass too (for fixed-shape decoders, where lengths are few and standard).
    - A failing batch is retried item by item, so an error reaches only the caller whose window caused it.
    - A caller cancelled while waiting drops its window if it was not sent yet; others are unaffected.
    - With a DeadlineBoard (`deadlines`), queued windows go most pressing first (the stream whose listener needs
      audio soonest: engine.deadlines), and a call takes no more windows than the most pressing one can wait for
      (BatchCost.cap, from the calls measured so far). Without one, or with one window queued, first come first
      served.
    - Among few live streams (`first_audio_streams`), a window of a stream still waiting for its first audio goes
      before the others; on a GPU the queue also waits a little for such a stream's first window
      (`_first_audio_turn`).
    Bound to the event loop that uses it; it re-binds when idle on a new loop (tests make one per test).
    """

    def __init__(self, decoder: CodecDecoder, executor: Executor | None = None, *, max_batch: int = 64,
                 max_codes: int | None = None, one_length: bool = False,
                 deadlines: DeadlineBoard | None = None, first_audio_hold_s: float = FIRST_AUDIO_HOLD_S,
                 first_audio_streams: int = FIRST_AUDIO_STREAMS) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.decoder, self.executor = decoder, executor
        self.max_batch, self.max_codes, self.one_length = max_batch, max_codes, one_length
        self.deadlines = deadlines
        """Orders the queue by the streams' due times (None: arrival order, batches of max_batch)."""
        self.first_audio_hold_s, self.first_audio_streams = first_audio_hold_s, first_audio_streams
        """With `deadlines`, up to `first_audio_streams` live streams: a stream's window before its first audio goes
        first, and while one such stream has no window queued, the others' wait for it at most
        `first_audio_hold_s` (`_first_audio_turn`)."""
        self.held_s = 0.0
        """Seconds the queue was held for first audio, in all."""
        self._arrived: asyncio.Event | None = None
        self.stats = BatchStats()
        self._pending: list[_Entry] = []
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def decode(self, item: DecodeItem, stream: str | None = None) -> np.ndarray:
        """Audio for one window (see CodecDecoder.decode), decoded together with whatever else is queued; `stream`:
        the request it is for (its deadline orders the queue)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._worker is not None and not self._worker.done() and self._loop is not None \
                    and not self._loop.is_closed():
                raise RuntimeError("DecodeBatcher is in use on another event loop")
            self._loop, self._worker, self._pending, self._arrived = loop, None, [], None
        future: asyncio.Future[np.ndarray] = loop.create_future()
        board = self.deadlines
        key = 0.0 if board is None else board.key(stream or "", board.clock())
        self._pending.append((item, future, key, stream or ""))
        if self._arrived is not None:
            self._arrived.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._first_audio_turn()
            batch = self._take()
            if not batch:
                continue
            items = [item for item, _ in batch]
            try:
                results, started, took = await loop.run_in_executor(self.executor, self._timed_decode, items)
                if len(results) != len(items):
                    raise RuntimeError(f"decoder returned {len(results)} results for {len(items)} windows")
            except Exception as err:  # noqa: BLE001 - handed to the callers
                if len(batch) == 1:
                    _settle(batch[0][1], err)
                    continue
                await self._one_by_one(loop, batch)
                continue
            self.stats.note_call(items, started, took)
            for (_, future), pcm in zip(batch, results):
                _settle(future, pcm)

    def _first_audio_first(self) -> bool:
        board = self.deadlines
        return board is not None and board.live <= self.first_audio_streams and board.awaiting_first() > 0

    async def _first_audio_turn(self) -> None:
        """While a stream waits for its first audio and none of the queued windows is its, hold the queue (at most
        `first_audio_hold_s`, and not while any live stream is close to running dry): its first window is being
        generated, and a call under way when it comes would make it wait for that call."""
        board, loop = self.deadlines, asyncio.get_running_loop()
        if board is None or self.first_audio_hold_s <= 0:
            return
        t0 = loop.time()
        until = t0 + self.first_audio_hold_s
        while self._first_audio_first() and not board.at_risk():
            if any(board.awaits_first(e[3]) for e in self._pending if not e[1].done()):
                break
            left = until - loop.time()
            if left <= 0 or not self._pending:
                break
            self._arrived = asyncio.Event()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(left, HOLD_POLL_S))
            except asyncio.TimeoutError:
                pass
        self._arrived = None
        self.held_s += loop.time() - t0

    def _timed_decode(self, items: list[DecodeItem]) -> tuple[list[np.ndarray], float, float]:
        """The decoder's call, when it started and its seconds, timed on the executor's thread (so a wait for other
        work there, a graph capture, is not counted as the call's cost)."""
        t = time.perf_counter()
        results = self.decoder.decode(items)
        return results, t, time.perf_counter() - t

    async def _one_by_one(self, loop: asyncio.AbstractEventLoop,
                          batch: list[tuple[DecodeItem, asyncio.Future[np.ndarray]]]) -> None:
        for item, future in batch:
            if future.done():
                continue
            self.stats.retried_alone += 1
            try:
                (pcm,) = await loop.run_in_executor(self.executor, self.decoder.decode, [item])
            except Exception as err:  # noqa: BLE001
                _settle(future, err)
            else:
                _settle(future, pcm)

    def _take(self) -> list[tuple[DecodeItem, asyncio.Future[np.ndarray]]]:
        """Up to `_most()` live windows (max_codes codes; with one_length, of the first one's length) from the
        front of the queue (most pressing first, where it is ordered by deadline), in order; cancelled ones
        dropped; the rest keep their order."""
        pending = [entry for entry in self._pending if not entry[1].done()]  # cancelled while queued: dropped
        board = self.deadlines
        if board is not None and len(pending) > 1:
            pending = [pending[i] for i in board.policy.order(pending, _key)]
            if self._first_audio_first():  # stable: the first windows in deadline order, then the rest
                pending.sort(key=lambda e: not board.awaits_first(e[3]))
        most = self._most(pending)
        batch: list[tuple[DecodeItem, asyncio.Future[np.ndarray]]] = []
        codes = 0
        rest: list[_Entry] = []
        for entry in pending:
            item, future = entry[0], entry[1]
            n = len(item.codes)
            full = len(batch) >= most or (
                self.max_codes is not None and batch and codes + n > self.max_codes) or (
                self.one_length and batch and n != len(batch[0][0].codes))
            if full:
                rest.append(entry)
            else:
                batch.append((item, future))
                codes += n
        self._pending = rest
        return batch

    def _most(self, pending: list[_Entry]) -> int:
        """Windows the next call may take: max_batch, less where the most pressing window (the first) cannot wait
        for a call that large (BatchCost.cap)."""
        board = self.deadlines
        if board is None or len(pending) <= 1:
            return self.max_batch
        policy = board.policy
        most = self.stats.cost.cap(pending[0][2] - board.clock(), min(self.max_batch, len(pending)),
                                   policy.decode_bound_s)
        if most < min(self.max_batch, len(pending)):
            self.stats.capped += 1
        return most


_Entry = tuple[DecodeItem, "asyncio.Future[np.ndarray]", float, str]
"""A queued window: its item, its caller's future, its deadline key (engine.deadlines DeadlinePolicy.key) and its
stream's request id ("" for none)."""


def _key(entry: _Entry) -> float:
    return entry[2]


def _settle(future: asyncio.Future[np.ndarray], outcome: np.ndarray | BaseException) -> None:
    """Resolve `future` with a decode's audio or its error, unless it is done already (cancelled)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


# ---- batchable window shapes ----------------------------------------------------------------------------------

def standard_lengths(first_new: int, new: int, growth: float, max_new: int, left: int, right: int,
                     first_right: int | None = None) -> tuple[int, ...]:
    """Code lengths of the windows a WindowSchedule produces mid-sentence (left + new + right for each window
    index, with left clipped at the sentence start), ascending. These are the shapes worth batching (and
    capturing as CUDA graphs); final windows are widened to one of them by `widen_left`."""
    lengths = set()
    emitted = 0
    for k in range(64):
        n = first_new if k == 0 else min(max_new, int(new * growth ** (k - 1)))
        r = first_right if (k == 0 and first_right is not None) else right
        lengths.add(min(left, emitted) + n + r)
        full_left = emitted >= left
        emitted += n
        following = min(max_new, int(new * growth ** k))
        if k > 0 and following == n and full_left:  # steady state: every later window looks the same
            break
    return tuple(sorted(lengths))


def lengths_for(schedule: WindowSchedule) -> tuple[int, ...]:
    """`standard_lengths` of a schedule and of its busy variant (which the pipeline switches to under load, exactly
    when batching and CUDA graphs matter most) and its ahead variant."""
    return tuple(sorted({n for s in schedule.variants()
                         for n in standard_lengths(s.first_new, s.new, s.growth, s.max_new, s.left, s.right,
                                                   s.first_right)}))


def widen_left(item: DecodeItem, codes: Sequence[int], start: int, lengths: Sequence[int],
               pad_after: int | None = None) -> DecodeItem:
    """`item` (which starts at absolute code `start` of `codes`) widened leftwards to the smallest standard
    length >= its own, using codes before `start`; unchanged if no standard length fits.

    Where the sentence has fewer codes before the window than that takes (its short last window), the rest is the
    sentence's first code repeated, but only when the window's own left context is at least `pad_after` codes:
    what it keeps then lies as far from the filler as from the left edge of any mid-sentence window, and the
    window replays a captured graph instead of an eager pass of a shape of its own (None: never pad)."""
    n = len(item.codes)
    target = next((length for length in sorted(lengths) if length >= n), None)
    if target is None or target == n:
        return item
    extra = target - n
    fill = max(0, extra - start)
    if fill and (pad_after is None or item.keep_start < pad_after or not codes):
        return item
    stop = item.keep_stop if item.keep_stop is not None else n
    before = (codes[0],) * fill + tuple(codes[start - (extra - fill): start])
    return replace(item, codes=before + tuple(item.codes),
                   keep_start=item.keep_start + extra, keep_stop=stop + extra, start=start - extra)
