"""CPU probe: what the deadline scheduler (engine.deadlines) costs per decision, on the single-stream path and in
crowds. Pure Python, no GPU.

  python -m lab.deadline_cost  -> one JSON object: microseconds per call (median of 7 repeats)

What runs per window of one stream (the board's key as the window queues, `heard` and the two `hold`s as its chunk
goes out, the batcher's take of a lone window), per lane admission round with one job waiting (the old path: no
sort), and the same decisions with 64 / 256 / 384 streams live. Nothing of it runs per token.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import timeit

from engine.backends.base import DecodeItem
from engine.batching import DecodeBatcher
from engine.config import SamplingOptions, sentence_id
from engine.deadlines import DeadlineBoard
from engine.fakes import ToneDecoder
from engine.lane_scheduler import LaneJob, LaneScheduler, LaneShapes


def per_call_us(fn, number: int) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def board_with(streams: int) -> DeadlineBoard:
    board = DeadlineBoard()
    for k in range(streams):
        board.open(f"s{k}")
        board.heard(f"s{k}", 1.0 + k % 7 * 0.3)
    return board


def per_window(board: DeadlineBoard) -> float:
    """What one window of stream s0 adds: its key as it queues, then its chunk's heard and holds."""
    def window() -> None:
        board.key("s0", board.clock())
        board.hold("s0", True)
        board.hold("s0", False)
        board.heard("s0", 0.02)
    return per_call_us(window, 20000)


def batcher_take(board: DeadlineBoard, pending: int) -> float:
    """DecodeBatcher._take over `pending` queued windows (ordered by deadline, capped by the cost model)."""
    loop = asyncio.new_event_loop()
    batcher = DecodeBatcher(ToneDecoder(), max_batch=64, deadlines=board)
    for batch, seconds in ((1, 0.005), (8, 0.02), (32, 0.1), (64, 0.25)):
        batcher.stats.cost.note(batch, seconds)
    item = DecodeItem(tuple(range(24)), (0,) * 32)
    entries = [(item, loop.create_future(), board.key(f"s{k % max(1, board.live)}", 0.0),
                f"s{k % max(1, board.live)}") for k in range(pending)]

    def take() -> None:
        batcher._pending = list(entries)
        batcher._take()
    try:
        return per_call_us(take, 2000 if pending > 1 else 20000)
    finally:
        loop.close()


def lane_admit(board: DeadlineBoard | None, waiting: int, rows: int = 128) -> float:
    """LaneScheduler.admit with `waiting` jobs queued and every row free (the jobs are re-queued each call)."""
    sched = LaneScheduler(LaneShapes.of(rows, 4096), stop_ids=(1,), allowed=(2, 3))
    sched.deadlines = board
    jobs = [LaneJob(tuple(range(40)), SamplingOptions(max_tokens=250), (2, 3), lambda *e: None, sentence_id(f"s{k}", 0),
                    f"s{k}") for k in range(waiting)]

    def admit() -> None:
        sched.rows.clear()
        sched.waiting.clear()
        sched.waiting.extend(jobs)
        sched.admit()
    return per_call_us(admit, 200 if waiting > 1 else 5000)


def main() -> None:
    one, crowd = board_with(1), board_with(384)
    report = {
        "per_window_us_1": round(per_window(one), 2),
        "per_window_us_384": round(per_window(crowd), 2),
        "batcher_take_us_1": round(batcher_take(one, 1), 2),
        "batcher_take_us_64_pending": round(batcher_take(crowd, 64), 2),
        "lane_admit_us_1_waiting_board": round(lane_admit(one, 1), 2),
        "lane_admit_us_1_waiting_no_board": round(lane_admit(None, 1), 2),
        "lane_admit_us_64_waiting_board": round(lane_admit(board_with(64), 64), 2),
        "lane_admit_us_64_waiting_no_board": round(lane_admit(None, 64), 2),
        "admission_us_1_live": round(per_call_us(one.admit, 20000), 2),
        "admission_us_384_live": round(per_call_us(crowd.admit, 500), 2),
        "pressing_us_384_live": round(per_call_us(crowd.pressing, 500), 2),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
