"""Provides the row scheduling both LLM paths with rows share: RowTable (who holds which row of a batched KV cache)
and RowSteps (which of the CPU rows' requests step in the next forward). Pure (no torch), so the policy is tested on
scripted timelines: the graph lane's LaneScheduler (engine.lane_scheduler) seats its jobs in a RowTable, and the CPU
generator (engine.backends.torch_gen) asks a RowSteps whom to seat and whom to step, and only runs the forwards.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R", bound=Hashable)
P = TypeVar("P")


class RowTable(Generic[T]):
    """The rows of one batched cache and who holds each: a newcomer takes the lowest free row (so busy rows stay
    packed at the bottom, where the fewest rows cover them), and gives it back when it ends.

    Seating and freeing are atomic: the CPU rows seat on the forward's worker and free on the event loop."""

    def __init__(self, rows: int) -> None:
        self._held: list[T | None] = [None] * rows
        self._busy = 0
        """Rows held, kept as they change: the lane asks for it at every admission, cheaper than a count."""
        self._lock = threading.Lock()

    def seat(self, holder: T) -> int | None:
        """The lowest free row, now `holder`'s; None when every row is held."""
        with self._lock:
            if self._busy == len(self._held):
                return None
            row = self._held.index(None)
            self._held[row] = holder
            self._busy += 1
            return row

    def free(self, row: int, holder: T) -> bool:
        """Give `row` back if `holder` holds it (a row freed twice, or since given to another, stays as it is)."""
        with self._lock:
            if 0 <= row < len(self._held) and self._held[row] is holder:
                self._held[row] = None
                self._busy -= 1
                return True
            return False

    def clear(self) -> None:
        """Every row free (after a failure that lost every cache)."""
        with self._lock:
            self._held = [None] * len(self._held)
            self._busy = 0

    def holders(self) -> list[T | None]:
        """Who holds each row (None: free), as of now."""
        with self._lock:
            return list(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[T | None]:
        return iter(self.holders())

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def full(self) -> bool:
        return self._busy == len(self._held)


@dataclass(slots=True)
class Asked(Generic[R, P]):
    """A request's step, asked for and not yet run: `payload` is what the forward needs of it (its last token and
    where its token goes)."""

    request: R
    payload: P


@dataclass(slots=True)
class RowSteps(Generic[R, P]):
    """The CPU rows' requests and who steps in the next forward.

    A request seats in a row for its prompt (or, with every row held, runs alone on a cache of its own and never
    joins), then `joins` the stepping rows. Each of its decode steps is `ask`ed; the asked steps run as one forward
    once every stepping request has asked (so they keep stepping together, instead of one after another), or once
    the grace time since the first ask is over (a request whose reader went quiet holds up no one for longer), and
    never while a forward of the rows runs. A request `leave`s on every way out (its end, an abort, a cancelled
    stream, a failed prompt): its row is free and no step waits for it.

    Lives on the event loop's thread, except `seat` (the forward's worker) and the table, which is atomic."""

    rows: int
    table: RowTable[object] = field(init=False)
    stepping: set[R] = field(default_factory=set)
    """Requests past their prompt in a row: the next forward waits (the grace time at most) for each to ask."""
    asked: list[Asked[R, P]] = field(default_factory=list)
    """Steps asked for and not running yet, in the order they were asked."""
    running: bool = False
    """A forward of the rows is running: the steps asked meanwhile wait for it."""

    def __post_init__(self) -> None:
        self.table = RowTable(self.rows)

    def seat(self, holder: object) -> int | None:
        """A row for a new request's prompt (None: every row is held, it steps alone)."""
        return self.table.seat(holder)

    def join(self, request: R) -> None:
        """The request's prompt ran in its row: its steps are waited for from now on."""
        self.stepping.add(request)

    def leave(self, request: R, row: int | None = None, holder: object = None) -> None:
        """The request ends (however it ends): no step waits for it, and its `row` (held by `holder`) is free."""
        self.stepping.discard(request)
        if row is not None:
            self.table.free(row, holder)

    def ask(self, request: R, payload: P) -> None:
        self.asked.append(Asked(request, payload))

    def ready(self) -> bool:
        """Whether every stepping request has asked for its step (the next forward need not wait for anyone)."""
        asked = {id(a.request) for a in self.asked}
        return all(id(request) in asked for request in self.stepping)

    def next_forward(self, grace_over: bool) -> list[Asked[R, P]] | None:
        """The steps the next forward runs, now taken (then `done` once it ran); None when none runs now: a forward
        is running, nothing was asked, or some stepping request has not asked yet and the grace is not over (the
        caller starts the grace timer if it has not)."""
        if self.running or not self.asked or not (grace_over or self.ready()):
            return None
        batch, self.asked, self.running = self.asked, [], True
        return batch

    def waits(self) -> bool:
        """Whether asked steps wait for the grace time (for a stepping request that has not asked)."""
        return not self.running and bool(self.asked) and not self.ready()

    def done(self) -> None:
        """The forward of the rows ended (with tokens or an error)."""
        self.running = False


def consecutive(items: list[T], row: Callable[[T], int]) -> list[list[T]]:
    """`items` in row order, cut into runs of rows that follow one another: each run is one forward over a slice of
    the rows' cache."""
    runs: list[list[T]] = []
    for item in sorted(items, key=row):
        if runs and row(item) == row(runs[-1][-1]) + 1:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
