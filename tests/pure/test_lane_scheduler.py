"""LaneScheduler, the graph lane's pure half: admission, rows, bursts, read-backs and ends, run against a stand-in
for the runner (no torch, no model). tests/model/test_graph_lane.py runs the whole lane on a tiny model."""
from __future__ import annotations

from collections import defaultdict

import pytest

from engine.config import SamplingOptions, request_of, sentence_id
from engine.lane_scheduler import (ADMIT, ADMIT_NEW, BURST, CROWD_BURSTS, LaneJob, LaneScheduler, LaneShapes, Prefill,
                                   Step)

ALLOWED = tuple(range(50, 60))
OTHER = tuple(range(70, 80))
STOP = 1002
"""The third token of row 1 (see Rows), a stop id where a test says so."""


class Rows:
    """Stands in for LaneRunner: the k-th token a row samples since its last prefill is 1000 * row + k, for every
    row of a launch (busy or not), and every launch's shape is logged."""

    def __init__(self, rows: int) -> None:
        self.sampled = [0] * rows
        self.ring: list[list[int]] = []
        self.shapes: list[tuple[str, int, int]] = []
        self.prefilled: list[list[str]] = []
        """Each prefill's request ids."""

    def prefill(self, plan: Prefill) -> None:
        for row in plan.rows:
            self.sampled[row] = 0
        self.prefilled.append([job.request_id for job in plan.jobs])
        self.record(("prefill", len(plan.jobs), plan.size))

    def decode(self, step: Step) -> None:
        for row in range(step.rows):
            self.sampled[row] += 1
        self.record(("decode", step.rows, step.span))

    def record(self, shape: tuple[str, int, int]) -> None:
        self.shapes.append(shape)
        self.ring.append([1000 * row + k for row, k in enumerate(self.sampled)])

    def read(self, count: int) -> list[list[int]]:
        return self.ring[len(self.ring) - count:]


class Inbox:
    """Makes jobs and keeps what each is handed, by request id."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple]] = defaultdict(list)

    def job(self, request_id: str, max_tokens: int = 5, prompt: int = 8, allowed: tuple[int, ...] = ALLOWED) -> LaneJob:
        return LaneJob(tuple(range(prompt)), SamplingOptions(max_tokens=max_tokens), allowed,
                       lambda *event: self.events[request_id].append(event), request_id, request_of(request_id))

    def tokens(self, request_id: str) -> list[int]:
        return [t for event in self.events[request_id] if event[0] == "tokens" for t in event[1]]

    def deltas(self, request_id: str) -> list[list[int]]:
        return [event[1] for event in self.events[request_id] if event[0] == "tokens"]

    def ended(self, request_id: str) -> bool:
        return self.events[request_id][-1] == ("end", None)


def scheduler(rows: int = 2, max_len: int = 256, stops: tuple[int, ...] = ()) -> LaneScheduler:
    return LaneScheduler(LaneShapes.of(rows, max_len), stops, ALLOWED)


def prefill(lane: LaneScheduler, device: Rows) -> list[Prefill]:
    plans = lane.admit()
    for plan in plans:
        device.prefill(plan)
        lane.launched(plan.jobs)
    return plans


def burst(lane: LaneScheduler, device: Rows) -> list[Step]:
    steps = []
    for step in lane.burst():
        device.decode(step)
        lane.launched(step.jobs)
        steps.append(step)
    return steps


def read(lane: LaneScheduler, device: Rows) -> None:
    launches = lane.take_unread()
    lane.deliver(launches, device.read(len(launches)))


def run(lane: LaneScheduler, device: Rows) -> None:
    """The lane's worker without launches ahead: admit (read at once), a burst (read), until no job is left."""
    for _ in range(1000):
        if not lane.jobs:
            return
        prefill(lane, device)
        read(lane, device)
        burst(lane, device)
        read(lane, device)
    raise AssertionError("the jobs never ended")


def test_a_job_needing_more_positions_than_a_row_holds_is_refused_before_it_queues() -> None:
    lane, inbox = scheduler(max_len=256), Inbox()
    lane.add(inbox.job("fits-0", max_tokens=248, prompt=8))  # 256 positions: the row's last is its last token's
    with pytest.raises(ValueError, match="a prompt of 8 ids and a budget of 249 tokens need 257 positions; its "
                                         "rows hold 256"):
        lane.add(inbox.job("long-0", max_tokens=249, prompt=8))
    assert [job.request_id for job in lane.waiting] == ["fits-0"]


def test_a_lone_job_gets_its_first_token_at_once_then_a_burst_per_read_until_its_limit() -> None:
    lane, device, inbox = scheduler(), Rows(2), Inbox()
    lane.add(inbox.job("a", max_tokens=5))
    run(lane, device)
    assert inbox.events["a"] == [("tokens", [0], False), ("tokens", [1, 2], False), ("tokens", [3, 4], True),
                                 ("end", None)]
    assert device.shapes == [("prefill", 1, 32)] + [("decode", 1, 128)] * 4  # never a step past its limit
    assert lane.served == 1 and lane.load == 0 and lane.busy_rows == 0


def test_rows_run_side_by_side_and_a_freed_row_is_reused() -> None:
    """Two rows, three jobs: the first two share a prefill and steps; the third waits for the first row that frees
    (its own tokens start again at that row's prefill)."""
    lane, device, inbox = scheduler(rows=2), Rows(2), Inbox()
    for request_id, n in (("a", 3), ("b", 6), ("c", 4)):
        lane.add(inbox.job(request_id, max_tokens=n))
    run(lane, device)
    assert inbox.tokens("a") == [0, 1, 2] and inbox.tokens("c") == [0, 1, 2, 3]  # c took row 0 after a
    assert inbox.tokens("b") == [1000, 1001, 1002, 1003, 1004, 1005]
    assert device.prefilled == [["a", "b"], ["c"]] and device.shapes[0] == ("prefill", 2, 32)
    assert all(inbox.ended(r) for r in "abc") and lane.row_jobs == [None, None]


def test_a_stop_id_ends_the_job_with_it_and_frees_its_row() -> None:
    """Row 1 samples STOP as its third token: its job gets the tokens up to and with the stop, then the end, and a
    waiting job takes the row; the other row's job runs to its limit."""
    lane, device, inbox = scheduler(rows=2, stops=(STOP,)), Rows(2), Inbox()
    for request_id in ("a", "b", "c"):
        lane.add(inbox.job(request_id, max_tokens=10))
    run(lane, device)
    assert inbox.tokens("a") == list(range(10))
    assert inbox.tokens("b") == [1000, 1001, STOP] and inbox.tokens("c") == [1000, 1001, STOP]
    assert inbox.deltas("b")[-1][-1] == STOP and all(inbox.ended(r) for r in "abc")
    assert device.prefilled == [["a", "b"], ["c"]] and lane.served == 3


def test_an_aborted_job_gets_nothing_more_and_its_row_frees_at_once() -> None:
    lane, device, inbox = scheduler(rows=1), Rows(1), Inbox()
    running, waiting = inbox.job("a", max_tokens=50), inbox.job("b", max_tokens=3)
    lane.add(running)
    prefill(lane, device)
    read(lane, device)
    burst(lane, device)
    lane.add(waiting)
    lane.abort("a")  # its burst is in flight: nobody reads it
    read(lane, device)
    assert inbox.events["a"] == [("tokens", [0], False), ("end", None)] and lane.busy_rows == 0
    assert lane.served == 0 and running.ended
    lane.add(later := inbox.job("c", max_tokens=3))
    lane.abort("c")  # still waiting: it never gets a row
    run(lane, device)
    assert inbox.events["c"] == [("end", None)] and later.row == -1
    assert inbox.tokens("b") == [0, 1, 2] and device.prefilled == [["a"], ["b"]]


def test_a_job_with_another_allowed_set_waits_until_the_rows_are_empty() -> None:
    """Every row steps with one allowed set (the runner's head): a job with another is admitted alone, once the
    rows have emptied, and so are the jobs behind it."""
    lane, device, inbox = scheduler(rows=2), Rows(2), Inbox()
    lane.add(inbox.job("a", max_tokens=4))
    lane.add(inbox.job("b", max_tokens=2, allowed=OTHER))
    lane.add(inbox.job("c", max_tokens=2))
    allowed = []
    for _ in range(20):
        allowed += [plan.allowed for plan in prefill(lane, device)]
        read(lane, device)
        burst(lane, device)
        read(lane, device)
    assert device.prefilled == [["a"], ["b"], ["c"]] and allowed == [ALLOWED, OTHER, ALLOWED]
    assert [len(inbox.tokens(r)) for r in "abc"] == [4, 2, 2] and lane.load == 0


def test_new_requests_are_admitted_before_later_sentences() -> None:
    """Twenty two-sentence requests at once on 64 rows: the first admission seats every first sentence (prefills of
    8 + 8 + 4 prompts) and no second one; the second sentences follow, at most ADMIT per admission."""
    lane, inbox = scheduler(rows=64), Inbox()
    for i in range(20):
        for k in range(2):
            lane.add(inbox.job(sentence_id(f"r{i}", k)))
    first = lane.admit()
    assert [len(plan.jobs) for plan in first] == [8, 8, 4]
    assert [job.request_id for plan in first for job in plan.jobs] == [sentence_id(f"r{i}", 0) for i in range(20)]
    later = [lane.admit() for _ in range(3)]
    assert [sum(len(plan.jobs) for plan in plans) for plans in later] == [ADMIT, ADMIT, 20 - 2 * ADMIT]
    assert [job.request_id for plans in later for plan in plans for job in plan.jobs] == \
        [sentence_id(f"r{i}", 1) for i in range(20)]


def test_a_crowd_of_new_requests_is_seated_at_most_admit_new_at_a_time() -> None:
    lane, inbox = scheduler(rows=128), Inbox()
    for i in range(ADMIT_NEW + 10):
        lane.add(inbox.job(f"r{i}"))
    assert sum(len(plan.jobs) for plan in lane.admit()) == ADMIT_NEW
    assert lane.busy_rows == ADMIT_NEW and len(lane.waiting) == 10


def test_prompts_of_similar_lengths_share_a_prefill_of_a_captured_batch_size() -> None:
    """Seven prompts of 5 to 41 ids on eight rows: prefills of 4 + 2 + 1, shortest first, each padded to the bucket
    of its longest."""
    lane, inbox = scheduler(rows=8), Inbox()
    for i in reversed(range(7)):
        lane.add(inbox.job(f"r{i}", prompt=5 + 6 * i))
    plans = lane.admit()
    assert [(len(plan.jobs), plan.size) for plan in plans] == [(4, 32), (2, 64), (1, 64)]
    assert [len(ids) for plan in plans for ids in plan.prompts] == [5 + 6 * i for i in range(7)]
    assert sorted(row for plan in plans for row in plan.rows) == list(range(7))


def test_a_steps_span_covers_the_positions_its_tokens_read() -> None:
    """Token k of a job feeds token k - 1 at position n + k - 1: a prompt of 126 ids steps over 128 positions for
    its next two tokens, then over 256."""
    lane, device, inbox = scheduler(rows=1), Rows(1), Inbox()
    lane.add(inbox.job("a", max_tokens=6, prompt=126))
    run(lane, device)
    assert [span for kind, _, span in device.shapes if kind == "decode"] == [128, 128, 256, 256, 256]


def test_bursts_are_longer_for_a_crowd_and_end_when_no_row_wants_a_step() -> None:
    lane, device, inbox = scheduler(rows=64), Rows(64), Inbox()
    assert lane.bursts == CROWD_BURSTS
    lane.add(inbox.job("one", max_tokens=100))
    prefill(lane, device)
    assert len(burst(lane, device)) == BURST
    for i in range(31):
        lane.add(inbox.job(f"r{i}", max_tokens=100))
    while lane.busy_rows < 32:
        prefill(lane, device)
    assert len(burst(lane, device)) == BURST  # up to 32 rows: short bursts, so a newcomer's prefill waits less
    lane.add(inbox.job("r32", max_tokens=100))
    prefill(lane, device)
    assert lane.busy_rows == 33 and len(burst(lane, device)) == 8  # past 32 rows: bursts of eight
    short, device = scheduler(rows=2), Rows(2)
    short.bursts = ((8, 5), (None, 8))
    short.add(inbox.job("s", max_tokens=3))
    prefill(short, device)
    assert len(burst(short, device)) == 2  # its prefill and two steps make its three tokens


def test_steps_run_the_smallest_row_bucket_holding_the_highest_busy_row() -> None:
    lane, device, inbox = scheduler(rows=8), Rows(8), Inbox()
    for request_id, n in (("a", 2), ("b", 2), ("c", 8)):
        lane.add(inbox.job(request_id, max_tokens=n))
    run(lane, device)
    rows = [rows for kind, rows, _ in device.shapes if kind == "decode"]
    assert rows == [4] * 7  # c sits in row 2: four rows even once a and b are done


def test_fixed_shapes_run_every_row_over_every_position_and_one_prompt_a_prefill() -> None:
    shapes = LaneShapes.of(3, 384, fixed=True)
    assert (shapes.spans, shapes.row_buckets, shapes.prefill_batches) == ((384,), (3,), (1,))
    assert shapes.prefills == LaneShapes.of(3, 384).prefills == (32, 64, 128, 256)
    lane, device, inbox = LaneScheduler(shapes, (), ALLOWED), Rows(3), Inbox()
    for i in range(5):
        lane.add(inbox.job(f"r{i}", max_tokens=10 + 5 * i, prompt=6 + 30 * i))
    run(lane, device)
    assert {shape for shape in device.shapes if shape[0] == "decode"} == {("decode", 3, 384)}
    assert {batch for kind, batch, _ in device.shapes if kind == "prefill"} == {1}
    assert [len(inbox.tokens(f"r{i}")) for i in range(5)] == [10 + 5 * i for i in range(5)]


def test_shapes_follow_the_lane_size() -> None:
    shapes = LaneShapes.of(6, 300)
    assert shapes.spans == (128, 256, 300) and shapes.row_buckets == (1, 2, 4, 6)
    assert shapes.prefills == (32, 64, 128, 256) and shapes.prefill_batches == (1, 2, 4)


def test_a_failure_hands_every_job_the_error_and_empties_the_rows() -> None:
    lane, device, inbox = scheduler(rows=1), Rows(1), Inbox()
    lane.add(inbox.job("a", max_tokens=9))
    lane.add(inbox.job("b"))
    prefill(lane, device)
    burst(lane, device)
    err = RuntimeError("boom")
    lane.fail(err)
    assert inbox.events["a"] == [("error", err), ("end", None)] and inbox.events["b"] == [("error", err), ("end", None)]
    assert lane.load == 0 and not lane.waiting and lane.row_jobs == [None] and lane.take_unread() == []


def test_the_router_reads_the_requests_on_the_lane() -> None:
    lane, inbox = scheduler(rows=2), Inbox()
    for request_id in (sentence_id("a", 0), sentence_id("a", 1), sentence_id("b", 0)):
        lane.add(inbox.job(request_id))
    assert lane.groups() == {"a", "b"} and lane.load == 3
    taken_back = inbox.job("c")
    lane.add(taken_back)
    lane.withdraw(taken_back)  # the lane was closed: no worker will see it
    assert lane.load == 3 and taken_back not in lane.waiting
