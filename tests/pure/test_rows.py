"""engine.rows: the row table both row paths seat in, and the CPU rows' step scheduler, on scripted timelines (no
torch, no model). tests/model/test_int8_llm.py runs the CPU rows on a tiny model; tests/pure/test_lane_scheduler.py
the graph lane's scheduler over the same table."""
from __future__ import annotations

from engine.lane_scheduler import LaneScheduler, LaneShapes
from engine.rows import RowSteps, RowTable, consecutive


class Req:
    """A request as the generator sees it (only its identity matters here)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def names(batch) -> list[str]:
    return [asked.request.name for asked in batch]


def seated(steps: RowSteps, *reqs: Req) -> list[int | None]:
    """Seat each request for its prompt; those that got a row join the stepping rows."""
    rows = []
    for req in reqs:
        row = steps.seat(req)
        if row is not None:
            steps.join(req)
        rows.append(row)
    return rows


def test_a_newcomer_takes_the_lowest_free_row_and_only_its_holder_frees_it() -> None:
    table: RowTable[Req] = RowTable(3)
    a, b, c, d, e = (Req(name) for name in "abcde")
    assert [table.seat(h) for h in (a, b, c, d)] == [0, 1, 2, None]
    assert table.full and table.busy == 3
    assert table.free(1, b) and table.seat(e) == 1
    assert not table.free(1, b) and table.busy == 3, "a stale holder freed the row given to another"
    assert table.holders() == [a, e, c]
    assert not table.free(-1, a) and not table.free(3, a)
    table.clear()
    assert list(table) == [None, None, None] and table.busy == 0 and not table.full


def test_a_step_waits_until_every_stepping_request_asked_then_they_step_as_one() -> None:
    steps: RowSteps[Req, int] = RowSteps(2)
    a, b = Req("a"), Req("b")
    assert seated(steps, a, b) == [0, 1]
    steps.ask(a, 7)
    assert steps.next_forward(grace_over=False) is None and steps.waits()
    steps.ask(b, 8)
    batch = steps.next_forward(grace_over=False)
    assert names(batch) == ["a", "b"] and [asked.payload for asked in batch] == [7, 8]
    assert not steps.asked and steps.running


def test_nothing_runs_beside_a_forward_and_the_grace_lets_a_step_go_alone() -> None:
    steps: RowSteps[Req, int] = RowSteps(2)
    a, b = Req("a"), Req("b")
    seated(steps, a, b)
    steps.ask(a, 1)
    steps.ask(b, 1)
    steps.next_forward(grace_over=False)
    steps.ask(a, 2)  # a's token came back first; b's reader is slow
    assert steps.next_forward(grace_over=True) is None, "a second forward ran beside the first"
    assert not steps.waits(), "the grace timer was asked for while the rows run"
    steps.done()
    assert steps.next_forward(grace_over=False) is None and steps.waits()
    assert names(steps.next_forward(grace_over=True)) == ["a"]
    steps.done()
    assert steps.next_forward(grace_over=True) is None and not steps.waits()


def test_a_request_beyond_the_rows_steps_alone_and_no_row_waits_for_it() -> None:
    steps: RowSteps[Req, int] = RowSteps(2)
    a, b, c = Req("a"), Req("b"), Req("c")
    assert seated(steps, a, b, c) == [0, 1, None]
    assert steps.stepping == {a, b}
    steps.ask(a, 1)
    steps.ask(b, 1)
    assert names(steps.next_forward(grace_over=False)) == ["a", "b"]


def test_a_request_that_leaves_frees_its_row_and_holds_up_no_step() -> None:
    """An end, an abort, a cancelled stream or a failed prompt all leave the same way."""
    steps: RowSteps[Req, int] = RowSteps(2)
    a, b, c = Req("a"), Req("b"), Req("c")
    seated(steps, a, b)
    steps.ask(a, 1)
    assert steps.next_forward(grace_over=False) is None
    steps.leave(b, 1, b)
    assert names(steps.next_forward(grace_over=False)) == ["a"]
    assert steps.table.holders() == [a, None]
    assert seated(steps, c) == [1]
    steps.leave(b, 1, b)  # its stream's end after its abort: c keeps the row
    assert steps.table.holders() == [a, c] and steps.stepping == {a, c}
    steps.leave(c)  # a prompt that failed before it joined and before it held a row
    assert steps.stepping == {a}


def test_one_row_steps_each_request_alone() -> None:
    """rows 1, a deterministic engine's: the second request gets no row, so no step ever carries two."""
    steps: RowSteps[Req, int] = RowSteps(1)
    a, b = Req("a"), Req("b")
    assert seated(steps, a, b) == [0, None]
    steps.ask(a, 1)
    assert names(steps.next_forward(grace_over=False)) == ["a"]


def test_steps_of_rows_that_follow_one_another_run_as_one_forward() -> None:
    assert consecutive([3, 0, 1, 5, 4], lambda row: row) == [[0, 1], [3, 4, 5]]
    assert consecutive([2], lambda row: row) == [[2]] and consecutive([], lambda row: row) == []
    by_row = {"x": 4, "y": 2, "z": 3}
    assert consecutive(["x", "y", "z"], by_row.__getitem__) == [["y", "z", "x"]]


def test_the_graph_lane_seats_its_jobs_in_the_same_table() -> None:
    lane = LaneScheduler(LaneShapes.of(2, 256), (), (1, 2))
    assert isinstance(lane.rows, RowTable) and lane.row_jobs == [None, None] and lane.busy_rows == 0
