"""engine.deadlines on scripted timelines: each stream's due time, the one ordering every stage uses (pressing first,
no starvation, ties stable), the decoder's batch cap, and admission (refuses what would underrun, admits again once
a stream ends). Also the two queues that use it: DecodeBatcher and the graph lane's LaneScheduler."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.backends.base import DecodeItem
from engine.batching import DecodeBatcher
from engine.config import SamplingOptions, request_of, sentence_id
from engine.deadlines import BatchCost, DeadlineBoard, DeadlinePolicy, StreamClock, Verdict
from engine.fakes import ToneDecoder
from engine.lane_scheduler import ADMIT_NEW, LaneJob, LaneScheduler, LaneShapes

POLICY = DeadlinePolicy(margin_s=0.2, first_audio_s=0.25, pressing_s=1.0, max_wait_s=2.0)


class Clock:
    """A scripted clock: time moves only when the test says."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---- one stream's clock ---------------------------------------------------------------------------------------

def test_a_new_stream_is_due_its_first_audio_budget_after_it_arrived():
    s = StreamClock(arrived_at=10.0)
    assert s.due_at(POLICY) == pytest.approx(10.25)


def test_after_first_audio_the_stream_is_due_when_its_listener_would_run_dry_less_the_margin():
    s = StreamClock(arrived_at=10.0)
    s.heard(0.5, now=10.1)  # first audio at 10.1: the listener plays from then on
    s.heard(1.0, now=10.3)
    assert s.first_audio_at == 10.1
    assert s.due_at(POLICY) == pytest.approx(10.1 + 1.5 - 0.2)


def test_the_board_follows_its_streams_and_forgets_ended_ones():
    clock = Clock(5.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("a")
    clock.t = 5.1
    board.heard("a", 2.0)
    board.heard("unknown", 1.0)  # a warm-up or a closed stream: ignored
    assert board.due_at("a") == pytest.approx(5.1 + 2.0 - 0.2)
    assert board.live == 1
    board.close("a")
    assert board.due_at("a") is None and board.live == 0


# ---- the ordering ---------------------------------------------------------------------------------------------

def test_pressing_work_goes_first_then_new_streams_then_far_ahead_ones():
    clock = Clock(100.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("far")
    board.open("near")
    clock.t = 100.2
    board.heard("far", 5.0)    # 5 s ahead of its listener
    board.heard("near", 0.35)  # 0.15 s of audio left once the margin is taken
    clock.t = 100.3
    board.open("new")           # due at 100.55
    queue = ["far", "new", "near"]
    order = POLICY.order(queue, lambda stream: board.key(stream, queued_at=clock.t))
    assert [queue[i] for i in order] == ["near", "new", "far"]


def test_ties_keep_queue_order():
    keys = {"a": 1.0, "b": 1.0, "c": 0.5, "d": 1.0}
    queue = list(keys)
    assert [queue[i] for i in POLICY.order(queue, keys.__getitem__)] == ["c", "a", "b", "d"]


def test_far_ahead_work_waits_a_bounded_time_behind_a_stream_of_pressing_work():
    """A far-ahead stream's sentence queued at t=0, and from then on every 0.1 s new pressing work due 0.5 s later:
    the far one goes once it has waited max_wait_s (less the pressing slack), not never."""
    far_key = POLICY.key(due_at=60.0, queued_at=0.0)
    served_at = None
    for step in range(100):
        now = step * 0.1
        pressing_key = POLICY.key(due_at=now + 0.5, queued_at=now)
        if far_key <= pressing_key:
            served_at = now
            break
    assert served_at is not None and served_at <= POLICY.max_wait_s


def test_work_of_no_known_stream_counts_as_due_at_the_wait_bound():
    assert POLICY.key(None, queued_at=3.0) == pytest.approx(5.0)


# ---- the decoder's batch cap ----------------------------------------------------------------------------------

def test_a_batch_is_cut_to_what_the_most_pressing_window_can_wait_for():
    cost = BatchCost()
    for batch, seconds in ((1, 0.006), (8, 0.04), (16, 0.09), (32, 0.3)):
        cost.note(batch, seconds)
    assert cost.cap(slack_s=0.05, most=32, bound_s=0.1) == 16  # 16 windows take 90 ms: within the 100 ms bound
    assert cost.cap(slack_s=1.0, most=32, bound_s=0.1) == 32   # far from due: the whole batch
    assert cost.cap(slack_s=0.004, most=32, bound_s=0.004) == 1  # due in 4 ms: alone, in 6 ms
    assert cost.cap(slack_s=-1.0, most=32, bound_s=0.1) == 32  # late already: the whole batch
    assert BatchCost().cap(slack_s=0.0, most=64, bound_s=0.1) == 64  # nothing measured: no cut


def test_cost_beyond_the_largest_measured_batch_scales_with_the_windows():
    cost = BatchCost()
    cost.note(16, 0.1)
    assert cost.estimate(32) == pytest.approx(0.2) and cost.estimate(4) == pytest.approx(0.1)


# ---- admission --------------------------------------------------------------------------------------------------

def test_admission_refuses_while_a_live_stream_would_run_dry_and_admits_once_it_ended():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("steady")
    board.open("starved")
    clock.t = 0.1
    board.heard("steady", 10.0)
    board.heard("starved", 0.4)
    clock.t = 0.2
    assert board.admit().admit  # starved has 0.3 s of audio left, 0.1 s over its margin
    clock.t = 0.35             # now under its margin: a new stream would take steps it needs
    verdict = board.admit()
    assert not verdict.admit and "1 of 2" in verdict.reason
    board.close("starved")
    assert board.admit() == Verdict(True)


def test_admission_refuses_past_the_declared_capacity():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock, capacity_streams=4)  # e.g. 200 tokens a second, 50 a stream
    for k in range(4):
        board.open(f"s{k}")
        board.heard(f"s{k}", 5.0)
    verdict = board.admit()
    assert not verdict.admit and "4 streams live" in verdict.reason
    board.close("s0")
    assert board.admit().admit


def test_a_first_audio_late_by_more_than_the_pressing_bound_counts_as_at_risk():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("waiting")
    clock.t = 0.3  # its first audio was due at 0.25: late, but by the engine's own latency
    assert board.admit().admit and board.pressing() == 1
    clock.t = 1.3  # more than pressing_s late: a line of streams is waiting
    assert not board.admit().admit and board.at_risk() == 1


@pytest.mark.parametrize("speed, admitted", [(2.0, True), (1.5, False)])
def test_admission_refuses_a_stream_that_would_slow_a_measured_one_below_real_time(speed, admitted):
    """Two streams made at `speed` (their consumers' waits left out): a third shares the engine's time three ways,
    so each would get speed x 2/3: 1.33x (admitted, above REALTIME_SPEED) or 1.00x (refused)."""
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    for name in ("a", "b"):
        board.open(name)
        board.heard(name, 1.0)  # a first chunk: before the speed's clock starts
    board.hold("a", True)   # a's consumer kept it waiting 0.5 s: not the engine's time
    clock.t = 0.5
    board.hold("a", False)
    clock.t = 1.0
    board.heard("a", speed * 0.5)
    board.heard("b", speed * 1.0)
    assert board.shared_speed() == pytest.approx(speed * 2 / 3)
    verdict = board.admit()
    assert verdict.admit is admitted
    if not admitted:
        assert "would slow to 1.00x" in verdict.reason
    assert board.capacity() == pytest.approx(speed * 2 / POLICY.realtime_speed)


def test_a_stream_not_measured_yet_does_not_decide():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("new")
    board.heard("new", 1.0)
    clock.t = 0.1  # 0.1 s of engine time since its first audio: too little to tell its speed
    assert board.shared_speed() is None and board.capacity() is None and board.admit().admit


def test_a_new_stream_on_its_first_short_window_is_not_at_risk_while_its_pre_roll_comes_in_time():
    """Issue 42: the first window carries 80 ms, less than the 200 ms pre-roll; its listener plays only once it
    holds that, so the stream is not late until the rest of it is overdue (margin / realtime_speed)."""
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("new")
    clock.t = 0.03
    board.heard("new", 0.08)
    clock.t = 0.1
    assert board.at_risk() == 0 and board.admit().admit
    clock.t = 0.03 + POLICY.margin_s / POLICY.realtime_speed + 0.01  # the next window is overdue
    assert board.at_risk() == 1 and not board.admit().admit
    board.heard("new", 0.24)  # it came: the listener plays from now, holding 0.32 s
    assert board._clocks["new"].playing_at == clock.t and board.admit().admit


def test_a_stream_made_fast_enough_is_not_at_risk_between_windows_until_it_runs_low():
    """Windows come whole: at 2x real time the listener holds less than its pre-roll before each one, by design.
    A stream shown that fast counts at risk only below at_risk_s; one not shown fast, below its pre-roll."""
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("fast")
    board.heard("fast", 0.08)
    clock.t = 0.12
    board.heard("fast", 0.24)  # 2x: the listener starts, holding 0.32 s
    clock.t = 0.12 + 0.32 - 0.1  # 0.1 s left: under the pre-roll, the next window (0.48 s at 2x) still 0.14 s away
    assert board._clocks["fast"].pace() == pytest.approx(2.0)
    assert board.at_risk() == 0 and board.admit().admit
    clock.t = 0.12 + 0.32 - POLICY.at_risk_s / 2  # about to run dry: at risk however fast it was
    assert board.at_risk() == 1
    board.open("slow")
    board.heard("slow", 0.08)
    clock.t += 0.12
    board.heard("slow", 0.12)  # 1x: not shown fast enough, so judged against its pre-roll
    clock.t += 0.05
    assert board._clocks["slow"].at_risk(clock.t, POLICY)


def test_a_streams_speed_is_what_it_made_not_the_time_its_next_window_is_under_way():
    """Three times real time, windows whole: just before its fifth window arrives, audio over time-till-now says
    under 2x (and one more stream "would slow it" below real time); audio over the time it took says 3x."""
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("a")
    board.heard("a", 0.08)
    for window_s in (0.24, 0.48, 0.96):
        clock.t += window_s / 3
        board.heard("a", window_s)
    clock.t += 0.96 / 3 - 0.01  # the fifth window (0.96 s) nearly made
    assert board._clocks["a"].speed(clock.t, POLICY) == pytest.approx(3.0)
    assert board.shared_speed() == pytest.approx(1.5) and board.admit().admit


# ---- the decoder batcher orders by deadline ----------------------------------------------------------------------

class SlowDecoder(ToneDecoder):
    """Records which windows each call held (by their first code)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls: list[list[int]] = []

    def decode(self, items):
        self.calls.append([it.codes[0] for it in items])
        time.sleep(self.delay_s)
        return super().decode(items)


def window(tag: int) -> DecodeItem:
    return DecodeItem((tag,) + (1,) * 9, (0,) * 32)


async def test_the_batcher_decodes_the_most_pressing_windows_first():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    for name, ahead in (("far", 8.0), ("near", 0.25), ("mid", 2.0)):
        board.open(name)
        board.heard(name, ahead)
    dec = SlowDecoder(0.02)
    with ThreadPoolExecutor(1) as pool:
        batcher = DecodeBatcher(dec, pool, max_batch=2, deadlines=board)
        await asyncio.gather(batcher.decode(window(0), "warm-up"), batcher.decode(window(1), "far"),
                             batcher.decode(window(2), "mid"), batcher.decode(window(3), "near"))
    # all four queued before the worker ran: near (due in 50 ms) and mid (1.8 s) first; far (7.8 s) counts as due at
    # the wait bound (2 s), as does the warm-up's window (no stream), and they keep their queue order
    assert dec.calls == [[3, 2], [0, 1]], dec.calls


async def test_the_batcher_cuts_a_batch_for_a_pressing_window():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("near")
    board.heard("near", 0.21)  # due in 10 ms
    dec = SlowDecoder(0.0)
    with ThreadPoolExecutor(1) as pool:
        batcher = DecodeBatcher(dec, pool, max_batch=8, deadlines=board)
        for batch, seconds in ((1, 0.01), (2, 0.05), (4, 0.2), (8, 0.4)):
            batcher.stats.cost.note(batch, seconds)
        await asyncio.gather(batcher.decode(window(0), "near"), *(batcher.decode(window(k), "other")
                                                                   for k in range(1, 8)))
    # near is due in 10 ms, so it waits at most the 100 ms bound: 2 windows (50 ms), not 8 (400 ms)
    assert dec.calls[0] == [0, 1] and sum(map(len, dec.calls)) == 8 and batcher.stats.capped == 1, dec.calls


def live_and_new(clock: Clock) -> DeadlineBoard:
    """"live" plays (its next audio overdue by the strict count); "new" waits for its first audio."""
    board = DeadlineBoard(POLICY, clock)
    board.open("live")
    board.heard("live", 0.1)
    board.open("new")
    assert board.awaiting_first() == 1 and board.awaits_first("new") and not board.awaits_first("live")
    return board


@pytest.mark.parametrize("streams, first", [(16, [9, 1, 2]), (0, [1, 2, 9])])
async def test_a_window_before_its_streams_first_audio_goes_first_among_few_streams(streams, first):
    board = live_and_new(Clock(0.0))  # live is due before new by deadline: only the first-audio rule puts new first
    dec = SlowDecoder(0.0)
    with ThreadPoolExecutor(1) as pool:
        batcher = DecodeBatcher(dec, pool, max_batch=1, deadlines=board, first_audio_hold_s=0.0,
                                first_audio_streams=streams)
        await asyncio.gather(batcher.decode(window(1), "live"), batcher.decode(window(2), "live"),
                             batcher.decode(window(9), "new"))
    assert [c[0] for c in dec.calls] == first, dec.calls


async def test_the_decoder_holds_other_windows_until_the_first_window_comes():
    board = live_and_new(Clock(0.0))
    dec = SlowDecoder(0.0)
    with ThreadPoolExecutor(1) as pool:
        batcher = DecodeBatcher(dec, pool, max_batch=1, deadlines=board, first_audio_hold_s=5.0)

        async def first_window_later() -> None:
            await asyncio.sleep(0.1)
            assert dec.calls == []  # live's window is held while new's first window is made
            await batcher.decode(window(9), "new")
            board.heard("new", 0.08)  # as the pipeline does once the chunk is handed on

        t = time.perf_counter()
        await asyncio.gather(batcher.decode(window(1), "live"), first_window_later())
    assert [c[0] for c in dec.calls] == [9, 1] and time.perf_counter() - t < 2.0
    assert 0.08 < batcher.held_s < 2.0


@pytest.mark.parametrize("case", ["bound", "crowd", "at risk", "no first audio pending"])
async def test_the_hold_is_bounded_and_off_in_crowds_at_risk_or_with_no_new_stream(case):
    clock = Clock(0.0)
    board = live_and_new(clock)
    hold = 0.3 if case == "bound" else 5.0
    if case == "at risk":
        clock.t = 0.5  # live's 0.1 s of audio ran out: it is close to running dry
        assert board.at_risk()
    if case == "no first audio pending":
        board.heard("new", 0.1)
    dec = SlowDecoder(0.0)
    with ThreadPoolExecutor(1) as pool:
        batcher = DecodeBatcher(dec, pool, deadlines=board, first_audio_hold_s=hold,
                                first_audio_streams=1 if case == "crowd" else 16)
        t = time.perf_counter()
        await batcher.decode(window(1), "live")
        took = time.perf_counter() - t
    if case == "bound":
        assert 0.25 < took < 2.0 and batcher.held_s >= 0.25
    else:
        assert took < 1.0 and batcher.held_s < 1.0


# ---- the graph lane's admission -------------------------------------------------------------------------------

def lane_job(request_id: str) -> LaneJob:
    return LaneJob(tuple(range(8)), SamplingOptions(max_tokens=5), (1, 2), lambda *e: None, request_id,
                   request_of(request_id))


def test_the_lane_seats_a_stream_near_underrun_before_a_new_one_before_a_far_ahead_one():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    sched = LaneScheduler(LaneShapes.of(4, 512), stop_ids=(9,), allowed=(1, 2))
    sched.deadlines = board
    for name in ("far", "near"):
        board.open(name)
        sched.add(lane_job(sentence_id(name, 0)))
    sched.admit()  # both first sentences hold rows
    clock.t = 0.1
    board.heard("far", 6.0)
    board.heard("near", 0.4)
    assert sched.busy_rows == 2  # rows 2 and 3 are free
    clock.t = 0.2
    sched.add(lane_job(sentence_id("far", 1)))
    board.open("new")
    sched.add(lane_job(sentence_id("new", 0)))
    sched.add(lane_job(sentence_id("near", 1)))
    seated = [job.request_id for plan in sched.admit() for job in plan.jobs]
    assert sorted(seated) == ["near-1", "new-0"]  # two free rows: the far-ahead stream's sentence waits
    assert [job.request_id for job in sched.waiting] == ["far-1"]


def test_the_lane_keeps_a_requests_sentences_in_order_and_its_caps():
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    sched = LaneScheduler(LaneShapes.of(128, 512), stop_ids=(9,), allowed=(1, 2))
    sched.deadlines = board
    for k in range(ADMIT_NEW + 3):
        board.open(f"r{k}")
        sched.add(lane_job(sentence_id(f"r{k}", 0)))
        sched.add(lane_job(sentence_id(f"r{k}", 1)))
    seated = [job.request_id for plan in sched.admit() for job in plan.jobs]
    firsts = [s for s in seated if s.endswith("-0")]
    assert len(firsts) == ADMIT_NEW
    for s in seated:
        if s.endswith("-1"):  # a later sentence is seated only with (or after) its first
            assert s[:-2] + "-0" in seated


def test_without_a_board_the_lane_admits_as_before():
    sched = LaneScheduler(LaneShapes.of(2, 512), stop_ids=(9,), allowed=(1, 2))
    for name in ("a", "b", "c"):
        sched.add(lane_job(sentence_id(name, 0)))
    seated = [job.request_id for plan in sched.admit() for job in plan.jobs]
    assert sorted(seated) == ["a-0", "b-0"]


def test_a_stream_whose_consumer_does_not_read_blocks_no_one():
    """A client that never reads leaves its stream's audio waiting in the engine: not the engine's lateness."""
    clock = Clock(0.0)
    board = DeadlineBoard(POLICY, clock)
    board.open("stalled")
    board.heard("stalled", 0.3)
    board.hold("stalled", True)
    clock.t = 5.0
    assert board.admit().admit and board.pressing() == 0
    board.hold("stalled", False)
    assert not board.admit().admit


def test_a_batch_far_past_the_largest_measured_goes_uncut_as_before_any_call():
    """A lone stream's calls (one window each) say little of a crowd's: extrapolated from them, a sudden 48 windows
    would be cut to a handful per call."""
    cost = BatchCost()
    cost.note(1, 0.004)
    assert cost.cap(slack_s=0.05, most=48, bound_s=0.1) == 48
    assert cost.cap(slack_s=0.05, most=4, bound_s=0.1) == 4
    cost.note(2, 0.05)
    assert cost.cap(slack_s=0.05, most=8, bound_s=0.1) == 4  # within reach: 8 windows would take 200 ms


def test_past_the_largest_measured_batch_the_cap_follows_its_rate():
    cost = BatchCost()
    cost.note(16, 0.1)
    assert cost.cap(slack_s=0.32, most=64, bound_s=0.1) == 51  # 51 windows at 6.25 ms each
    assert cost.cap(slack_s=0.05, most=64, bound_s=0.1) == 16
