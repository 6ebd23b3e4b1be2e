"""voiceapp.cluster.export.SentenceRenderer without Ray, as Ray Data drives it (Workers.options: two calls at once
on one actor, from two threads): the next batch's sentences render while the current batch's last one does, on the
one engine and within its one gate of `jobs`, to the same audio as batches rendered one after another; a failed
sentence reaches its call, and the worker closes its engine and loop. The fake engine renders; a wrapper holds each
sentence until the test lets it go, so the order is the test's, not the clock's."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from engine.errors import GenerationError
from engine.factory import EngineConfig
from tests.export.test_export_plan import make_plan
from voiceapp.cli.export import export_config
from voiceapp.cluster.export import SentenceRenderer

WAIT_S = 20.0


class Held:
    """Wraps a renderer's engine: each sentence (by index) starts, then waits until `release(index)`, then
    renders on the real engine. Records starts and ends, and the most sentences ever in the engine at once."""

    def __init__(self, renderer: SentenceRenderer, fail: int | None = None) -> None:
        self.renderer, self.fail = renderer, fail
        self.index = {s.text: i for i, s in enumerate(renderer.plans[0].sentences)}
        self.events: list[tuple[str, int]] = []
        self.inside = self.most = 0
        self._go: dict[int, asyncio.Event] = {}
        self._changed = threading.Condition()
        real = renderer.synth.render

        async def render(request):
            i = self.index[request.text]
            self._note("start", i, +1)
            try:
                await self._gate(i).wait()
                if i == self.fail:
                    raise GenerationError(f"sentence {i} failed")
                return await real(request)
            finally:
                self._note("end", i, -1)

        renderer.synth.render = render  # type: ignore[method-assign]

    def _gate(self, i: int) -> asyncio.Event:
        return self._go.setdefault(i, asyncio.Event())

    def _note(self, what: str, i: int, step: int) -> None:
        with self._changed:
            self.events.append((what, i))
            self.inside += step
            self.most = max(self.most, self.inside)
            self._changed.notify_all()

    def release(self, i: int) -> None:
        self.renderer.loop.call_soon_threadsafe(lambda: self._gate(i).set())

    def started(self) -> list[int]:
        with self._changed:
            return [i for what, i in self.events if what == "start"]

    def ended(self) -> list[int]:
        with self._changed:
            return [i for what, i in self.events if what == "end"]

    def wait_for(self, done) -> None:
        with self._changed:
            assert self._changed.wait_for(done, WAIT_S), self.events

    def wait_started(self, wanted: list[int]) -> None:
        """Block until exactly `wanted` have started, in that order (then a moment more: none other follows)."""
        self.wait_for(lambda: len(self.started()) >= len(wanted))
        time.sleep(0.2)  # a sentence the gate wrongly let in would have started by now
        assert self.started() == wanted, self.events


def call(pool: ThreadPoolExecutor, renderer: SentenceRenderer, indices: list[int]) -> Future:
    """One Ray Data call: a batch of book 0's sentences, on a thread of the actor's."""
    return pool.submit(renderer, {"book": np.zeros(len(indices), int), "index": np.array(indices)})


@pytest.fixture
def renderer():
    plan = make_plan()
    worker = SentenceRenderer([plan], export_config(EngineConfig(backend="fake")), jobs=2)
    yield worker
    worker.close()


def test_the_next_batch_renders_while_the_last_sentence_of_this_one_does(renderer):
    held = Held(renderer)
    with ThreadPoolExecutor(2) as pool:
        first = call(pool, renderer, [0, 1, 2])
        held.wait_started([0, 1])  # the gate: two at once
        second = call(pool, renderer, [3, 4])
        held.wait_started([0, 1])  # the second batch waits at the same gate
        held.release(0)
        held.wait_started([0, 1, 2])  # first come, first served: the first batch's last sentence goes first
        held.release(1)
        held.wait_started([0, 1, 2, 3])  # the overlap: batch 2 takes the row while batch 1's last one renders
        assert not first.done()
        for i in (2, 3, 4):
            held.release(i)
        overlapped = first.result(WAIT_S), second.result(WAIT_S)
    assert held.events.index(("start", 3)) < held.events.index(("end", 2))
    assert held.most == 2  # never more than `jobs` in the engine, whichever batch

    one_by_one = SentenceRenderer(renderer.plans, export_config(EngineConfig(backend="fake")), jobs=2)
    try:
        alone = one_by_one({"book": np.zeros(3, int), "index": np.array([0, 1, 2])}), \
            one_by_one({"book": np.zeros(2, int), "index": np.array([3, 4])})
    finally:
        one_by_one.close()
    assert [b["index"] for b in overlapped] == [[0, 1, 2], [3, 4]]
    assert [b["samples"] for b in overlapped] == [b["samples"] for b in alone]  # the same audio, overlapped or not
    assert all(len(s) > 0 for b in overlapped for s in b["samples"])


def test_a_failed_sentence_ends_its_batch_and_the_other_batch_renders(renderer):
    held = Held(renderer, fail=1)
    with ThreadPoolExecutor(2) as pool:
        first = call(pool, renderer, [0, 1, 2])
        held.wait_started([0, 1])
        second = call(pool, renderer, [3, 4])
        held.release(1)
        with pytest.raises(GenerationError, match="sentence 1 failed"):
            first.result(WAIT_S)
        # the failure cancelled the rest of its batch: their rows go to the other batch, whose two both render
        held.wait_for(lambda: {3, 4} <= set(held.started()))
        assert set(held.started()) - {3, 4} <= set(held.ended()) and held.inside == 2, held.events
        held.release(3)
        held.release(4)
        assert second.result(WAIT_S)["index"] == [3, 4]


def test_close_ends_the_engine_loop_and_its_thread(renderer):
    thread = renderer._thread
    assert thread.is_alive() and thread.daemon
    renderer.close()
    assert not thread.is_alive() and renderer.loop.is_closed()
    renderer.close()  # twice: nothing left to do
