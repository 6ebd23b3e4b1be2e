"""DecodeBatcher on CPU with the ToneDecoder: identical results, real batches under concurrency, errors reach the
right caller, a cancelled waiter harms no one; widen_left / standard_lengths shapes."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.backends.base import DecodeItem
from engine.batching import DecodeBatcher, lengths_for, standard_lengths, widen_left
from engine.fakes import ToneDecoder
from engine.windowing import WindowPlanner, WindowSchedule

GLOBALS = tuple(range(32))


def item(seed: int, n: int = 20, keep: tuple[int, int] | None = None) -> DecodeItem:
    rng = np.random.default_rng(seed)
    codes = tuple(int(c) for c in rng.integers(0, 8192, n))
    start, stop = keep if keep else (0, None)
    return DecodeItem(codes, GLOBALS, start, stop)


class RecordingDecoder(ToneDecoder):
    """ToneDecoder that records batch sizes, takes `delay_s` per call, and fails on a poisoned code."""

    def __init__(self, delay_s: float = 0.0, poison: int | None = None) -> None:
        self.delay_s, self.poison = delay_s, poison
        self.batches: list[int] = []
        self.threads: set[str] = set()

    def decode(self, items):
        self.batches.append(len(items))
        self.threads.add(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.poison is not None and any(self.poison in it.codes for it in items):
            raise ValueError("poisoned window")
        return super().decode(items)


@pytest.fixture
def pool():
    p = ThreadPoolExecutor(1, thread_name_prefix="decode")
    yield p
    p.shutdown(wait=True)


async def test_results_identical_to_unbatched(pool):
    dec = RecordingDecoder(delay_s=0.01)
    batcher = DecodeBatcher(dec, pool)
    items = [item(i, n=10 + i % 7, keep=(1, 8)) for i in range(40)]
    got = await asyncio.gather(*(batcher.decode(it) for it in items))
    want = ToneDecoder().decode(items)
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and np.array_equal(g, w)
    assert sum(dec.batches) == 40


async def test_slow_calls_are_kept_with_their_shapes_and_the_longest_counted(pool):
    from engine.batching import SLOW_CALL_S

    batcher = DecodeBatcher(RecordingDecoder(delay_s=SLOW_CALL_S + 0.02), pool)
    await asyncio.gather(*(batcher.decode(item(i, n=12)) for i in range(3)))
    fast = DecodeBatcher(RecordingDecoder(), pool)
    await fast.decode(item(0, n=12))
    stats = batcher.stats
    assert stats.slow and all(took >= SLOW_CALL_S and lengths == (12,) for _, took, _, lengths in stats.slow)
    assert sum(n for _, _, n, _ in stats.slow) == stats.items == 3 and stats.longest_s >= SLOW_CALL_S
    assert not fast.stats.slow and 0 < fast.stats.longest_s < SLOW_CALL_S


async def test_batches_form_under_concurrency(pool):
    dec = RecordingDecoder(delay_s=0.02)
    batcher = DecodeBatcher(dec, pool, max_batch=16)
    await asyncio.gather(*(batcher.decode(item(i)) for i in range(40)))
    assert dec.batches == [16, 16, 8]  # all 40 queued before the worker ran: full batches
    assert batcher.stats.items == 40 and batcher.stats.max_batch == 16
    assert list(batcher.stats.recent) == [(1, 16), (2, 16), (3, 8)]  # each call's number and size, for a bench
    assert dec.threads == {"decode_0"}


async def test_streams_arriving_while_busy_share_a_call(pool):
    dec = RecordingDecoder(delay_s=0.03)
    batcher = DecodeBatcher(dec, pool)

    async def stream(k: int) -> list[np.ndarray]:
        out = []
        for w in range(4):
            await asyncio.sleep(0.001 * k)
            out.append(await batcher.decode(item(100 * k + w)))
        return out

    results = await asyncio.gather(*(stream(k) for k in range(8)))
    assert sum(dec.batches) == 32 and len(dec.batches) < 32 and batcher.stats.mean_batch > 2
    for k, pcms in enumerate(results):
        for w, pcm in enumerate(pcms):
            assert np.array_equal(pcm, ToneDecoder().decode([item(100 * k + w)])[0])


class LengthRecordingDecoder(RecordingDecoder):
    """Also records the window lengths of each call and when each call finished."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(delay_s)
        self.lengths: list[list[int]] = []
        self.finished: list[float] = []

    def decode(self, items):
        self.lengths.append([len(it.codes) for it in items])
        out = super().decode(items)
        self.finished.append(time.perf_counter())
        return out


async def test_one_length_per_call_keeps_arrival_order_and_returns_each_length_early(pool):
    dec = LengthRecordingDecoder(delay_s=0.02)
    batcher = DecodeBatcher(dec, pool, max_batch=4, one_length=True)
    lengths = [20, 32, 20, 32, 32, 20, 48, 20, 20, 20]
    items = [item(i, n=n) for i, n in enumerate(lengths)]
    done: dict[int, float] = {}

    async def one(k: int) -> np.ndarray:
        pcm = await batcher.decode(items[k])
        done[k] = time.perf_counter()
        return pcm

    got = await asyncio.gather(*(one(k) for k in range(len(items))))
    for g, w in zip(got, ToneDecoder().decode(items)):
        assert np.array_equal(g, w)
    # all ten were queued before the worker ran: each call takes the oldest waiting window's length, up to 4
    assert dec.lengths == [[20, 20, 20, 20], [32, 32, 32], [48], [20, 20]]
    # a window comes back when its own call ends, not when a later length's call does
    assert done[1] < dec.finished[2] and done[6] < dec.finished[3]


async def test_mixed_lengths_share_a_call_without_one_length(pool):
    dec = LengthRecordingDecoder(delay_s=0.02)
    batcher = DecodeBatcher(dec, pool, max_batch=8)
    await asyncio.gather(*(batcher.decode(item(i, n=n)) for i, n in enumerate([20, 32, 20, 48, 32])))
    assert dec.lengths == [[20, 32, 20, 48, 32]]


async def test_max_codes_bounds_a_batch(pool):
    dec = RecordingDecoder(delay_s=0.01)
    batcher = DecodeBatcher(dec, pool, max_batch=64, max_codes=50)
    await asyncio.gather(*(batcher.decode(item(i, n=20)) for i in range(10)))
    assert max(dec.batches) <= 2


async def test_error_reaches_only_the_caller_with_the_bad_window(pool):
    dec = RecordingDecoder(delay_s=0.01, poison=7777)
    batcher = DecodeBatcher(dec, pool)
    good = [item(i) for i in range(6)]
    bad = DecodeItem((1, 2, 7777, 3), GLOBALS)
    tasks = [asyncio.ensure_future(batcher.decode(it)) for it in good[:3] + [bad] + good[3:]]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[3], ValueError) and "poisoned" in str(results[3])
    for r, it in zip(results[:3] + results[4:], good):
        assert np.array_equal(r, ToneDecoder().decode([it])[0])
    assert batcher.stats.retried_alone >= 1


async def test_single_failure_propagates_and_batcher_keeps_working(pool):
    dec = RecordingDecoder(poison=5)
    batcher = DecodeBatcher(dec, pool)
    with pytest.raises(ValueError):
        await batcher.decode(DecodeItem((5,), GLOBALS))
    assert len(await batcher.decode(item(1))) == 20 * 320


async def test_idle_batcher_sends_the_first_window_at_once(pool):
    dec = RecordingDecoder(delay_s=0.03)
    batcher = DecodeBatcher(dec, pool)
    first = asyncio.ensure_future(batcher.decode(item(0)))
    await asyncio.sleep(0.005)
    rest = [asyncio.ensure_future(batcher.decode(item(i))) for i in range(1, 9)]
    await asyncio.gather(first, *rest)
    assert dec.batches == [1, 8]


async def test_cancelling_one_waiter_does_not_break_others(pool):
    dec = RecordingDecoder(delay_s=0.03)
    batcher = DecodeBatcher(dec, pool)
    first = asyncio.ensure_future(batcher.decode(item(0)))  # in flight
    await asyncio.sleep(0.005)
    queued = [asyncio.ensure_future(batcher.decode(item(i))) for i in range(1, 6)]
    await asyncio.sleep(0)
    queued[2].cancel()  # cancelled while queued: its window is dropped
    first_result = await first
    others = await asyncio.gather(*queued, return_exceptions=True)
    assert isinstance(others[2], asyncio.CancelledError)
    assert np.array_equal(first_result, ToneDecoder().decode([item(0)])[0])
    for k in (0, 1, 3, 4):
        assert np.array_equal(others[k], ToneDecoder().decode([item(k + 1)])[0])
    assert sum(dec.batches) == 5  # the cancelled window was never decoded


async def test_cancelling_an_in_flight_waiter(pool):
    dec = RecordingDecoder(delay_s=0.03)
    batcher = DecodeBatcher(dec, pool)
    a = asyncio.ensure_future(batcher.decode(item(0)))
    await asyncio.sleep(0.005)
    b = asyncio.ensure_future(batcher.decode(item(1)))
    c = asyncio.ensure_future(batcher.decode(item(2)))
    await asyncio.sleep(0.04)  # b and c now in flight together
    b.cancel()
    assert np.array_equal(await c, ToneDecoder().decode([item(2)])[0])
    assert np.array_equal(await a, ToneDecoder().decode([item(0)])[0])
    assert len(await batcher.decode(item(3))) == 20 * 320


def test_rebinds_to_a_new_event_loop():
    dec = RecordingDecoder()
    batcher = DecodeBatcher(dec)
    for k in range(2):
        assert np.array_equal(asyncio.run(batcher.decode(item(k))), ToneDecoder().decode([item(k)])[0])


def test_standard_lengths_match_the_planner():
    s = WindowSchedule()
    assert lengths_for(s) == (20, 32, 56, 80, 128)  # the default schedule's and its busy variant's
    seen = set()
    for variant in (s, s.busy()):
        planner = WindowPlanner(variant)
        for available in range(1, 600):
            while (w := planner.next_window(available, False)) is not None:
                seen.add(w.stop - w.start)
    assert seen == set(lengths_for(s))
    assert standard_lengths(4, 24, 2.0, 96, 16, 16, first_right=12) == (16, 44, 80, 128)
    assert standard_lengths(8, 24, 1.0, 24, 16, 16) == (24, 48, 56)
    assert standard_lengths(16, 16, 2.0, 96, 16, 16) == (32, 48, 64, 96, 128)  # second window = first


def test_widen_left_pads_a_short_last_window_only_past_its_own_left_context():
    codes = list(range(500, 540))  # a 40-code sentence
    last = DecodeItem(tuple(codes[4:40]), GLOBALS, 12, 36, 4)  # 12 codes of context, then the sentence's end
    wide = widen_left(last, codes, 4, (24, 48), pad_after=12)
    assert len(wide.codes) == 48 and wide.codes == (500,) * 8 + tuple(codes[:4]) + last.codes
    assert (wide.keep_start, wide.keep_stop, wide.start) == (24, 48, -8)
    out_a, out_b = ToneDecoder().decode([last, wide])
    assert np.array_equal(out_a, out_b)  # each code's tone is its own: the kept audio is the same
    assert widen_left(last, codes, 4, (24, 48), pad_after=13) is last  # less own context than asked: eager
    assert widen_left(last, codes, 4, (24, 48)) is last  # no pad_after: never padded


def test_widen_left_takes_existing_context():
    codes = list(range(100, 300))
    it = DecodeItem(tuple(codes[150:170]), GLOBALS, 5, 20)  # a final window of 20 codes at absolute 150
    wide = widen_left(it, codes, 150, (24, 48, 80, 128))
    assert len(wide.codes) == 24 and wide.codes[4:] == it.codes and wide.codes[:4] == tuple(codes[146:150])
    assert (wide.keep_start, wide.keep_stop) == (9, 24)
    out_a, out_b = ToneDecoder().decode([it, wide])
    assert np.array_equal(out_a, out_b)
    # not enough codes before the window: unchanged
    assert widen_left(it, codes, 3, (24,)) is it
    # already standard or longer than every standard length: unchanged
    assert widen_left(DecodeItem(tuple(codes[:24]), GLOBALS), codes, 50, (24,)).codes == tuple(codes[:24])
    assert widen_left(it, codes, 150, (8, 16)) is it
    # keep_stop None means "to the end"
    open_end = widen_left(DecodeItem(tuple(codes[150:170]), GLOBALS), codes, 150, (24,))
    assert (open_end.keep_start, open_end.keep_stop) == (4, 24)
