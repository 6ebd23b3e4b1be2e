"""engine.pauses: the collector's runs counted and timed by generation, recent long ones kept, and off again."""
import gc

import pytest

from engine.pauses import GcPauses


def _cycles(n: int = 1000) -> None:
    junk = [[] for _ in range(n)]
    for a, b in zip(junk, junk[1:]):  # cycles: only the collector frees them
        a.append(b)
        b.append(a)


def test_gc_pauses_are_timed_by_generation() -> None:
    with GcPauses() as pauses:
        _cycles()
        gc.collect()
    assert pauses.runs[2] >= 1 and pauses.longest_ms[2] >= 0
    assert any(gen == 2 for _, gen, _ in pauses.recent)
    assert pauses not in gc.callbacks
    full = pauses.runs[2]
    gc.collect()  # off: not counted
    assert pauses.runs[2] == full


def test_only_runs_of_at_least_least_ms_are_kept_and_status_says_the_counts() -> None:
    ticks = iter([0.0, 0.001, 1.0, 1.5])
    pauses = GcPauses(least_ms=100.0, clock=lambda: next(ticks))
    pauses("start", {"generation": 0})
    pauses("stop", {"generation": 0})  # 1 ms: counted, not kept
    pauses("start", {"generation": 2})
    pauses("stop", {"generation": 2})  # 500 ms: kept
    assert pauses.runs == [1, 0, 1] and list(pauses.recent) == [(1.0, 2, 500.0)]
    status = pauses.status()
    assert status["runs"] == [1, 0, 1] and status["longest_ms"] == [1.0, 0.0, 500.0] and status["frozen"] >= 0


def test_loop_lag_keeps_late_wakes() -> None:
    from engine.pauses import TICK_S, LoopLag

    lag = LoopLag(least_ms=20.0)
    lag.note(1.0, 1.0 + TICK_S + 0.001)  # 1 ms late: only the longest moves
    lag.note(2.0, 2.0 + TICK_S + 0.1)
    assert lag.late == 1 and [at for at, _ in lag.recent] == [2.0] and lag.longest_ms == pytest.approx(100.0)
    assert lag.status() == {"late": 1, "longest_ms": 100.0}


def test_loop_lag_sees_a_callback_that_blocks_the_loop() -> None:
    import asyncio
    import time

    from engine.pauses import LoopLag

    async def main() -> LoopLag:
        lag = LoopLag(least_ms=30.0).start()
        await asyncio.sleep(0.02)
        time.sleep(0.08)  # a blocking call on the loop
        await asyncio.sleep(0.02)
        lag.stop()
        return lag

    lag = asyncio.run(main())
    assert lag.late >= 1 and lag.longest_ms >= 50


def test_loop_lag_times_the_loop_only_while_streams_are_live() -> None:
    """A server idle for hours does not wake 200 times a second: with `busy` false the watcher only looks again
    now and then, and a loop held meanwhile (no stream's audio waits on it) is not counted."""
    import asyncio
    import time

    from engine.pauses import LoopLag

    live = {"now": False}

    async def main() -> tuple[int, int]:
        lag = LoopLag(least_ms=30.0, busy=lambda: live["now"]).start()
        await asyncio.sleep(0.02)
        time.sleep(0.08)  # held while idle
        await asyncio.sleep(0.02)
        idle = lag.late
        live["now"] = True
        await asyncio.sleep(0.3)  # the watcher's idle look comes round and it starts timing
        time.sleep(0.08)  # held while a stream is live
        await asyncio.sleep(0.02)
        lag.stop()
        return idle, lag.late

    idle, busy = asyncio.run(main())
    assert idle == 0 and busy >= 1


def test_full_collections_are_held_while_young_ones_run_and_come_back_after() -> None:
    from engine.pauses import full_collections_held

    before, built = gc.get_threshold(), []
    with GcPauses() as pauses, full_collections_held():
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > before[2]
        for _ in range(before[1] * before[2] + 5):  # young collections enough to set off a full one without
            _cycles(before[0] + 1)  # the hold, and survivors enough for it to be worth it
            built.append([[] for _ in range(50)])
    assert pauses.runs[0] > 0 and pauses.runs[2] == 0
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), full_collections_held():
        raise RuntimeError("a failing step")
    assert gc.get_threshold() == before


def test_overlapping_holds_that_end_out_of_order_put_the_threshold_back_once_both_end() -> None:
    from contextlib import ExitStack

    from engine.pauses import NO_FULL_COLLECTION, full_collections_held

    before = gc.get_threshold()
    first, second = ExitStack(), ExitStack()
    first.enter_context(full_collections_held())
    second.enter_context(full_collections_held())
    first.close()  # the first to start ends first: the second still holds
    assert gc.get_threshold()[2] == NO_FULL_COLLECTION
    second.close()
    assert gc.get_threshold() == before
