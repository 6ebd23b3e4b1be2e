"""The VllmTokenGenerator plumbing (vLLM thread, channels, coalesced wake-ups, abort on cancel) against a fake
engine with AsyncLLM's generate() shape. Runs on CPU without vLLM: it tests our code, not vLLM's."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from engine.backends.vllm_gen import GIB, VllmTokenGenerator, memory_fraction
from engine.config import SamplingOptions
from engine.errors import GenerationError
from engine.prompt import Prompt
from engine.tokens import TokenIds

IDS = TokenIds()


@dataclass
class _Completion:
    token_ids: list[int]


@dataclass
class _Output:
    outputs: list[_Completion]
    finished: bool


class FakeEngine:
    """generate(): one token per `step_s` (the prompt's last id + k), stop id when `stop_at` is reached; records
    aborts the way AsyncLLM does (cancellation of the generate() consumer)."""

    def __init__(self, step_s: float = 0.002, stop_at: int | None = None, fail_at: int | None = None) -> None:
        self.step_s, self.stop_at, self.fail_at = step_s, stop_at, fail_at
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.params: list[object] = []

    async def generate(self, prompt, params, request_id):
        self.running.add(request_id)
        self.params.append(params)
        try:
            for k in range(params.max_tokens):
                await asyncio.sleep(self.step_s)
                if self.fail_at is not None and k == self.fail_at:
                    raise RuntimeError("engine core died")
                stop = self.stop_at is not None and k == self.stop_at
                token = IDS.im_end if stop else prompt[-1] + k
                yield _Output([_Completion([token])], stop or k == params.max_tokens - 1)
                if stop:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise
        finally:
            self.running.discard(request_id)

    def shutdown(self) -> None:
        pass


def make(engine: FakeEngine) -> VllmTokenGenerator:
    gen = VllmTokenGenerator.attached(lambda: engine, IDS)
    gen._prompt = lambda ids: list(ids)
    gen._params = lambda prompt, opts: opts
    return gen


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def gen(engine):
    g = make(engine)
    yield g
    g.close_now()


async def collect(gen, n=20, rid="r", stop_at=None):
    out = []
    async for delta in gen.stream(Prompt((1, 2, 1000)), SamplingOptions(max_tokens=n), rid):
        out += delta
    return out


async def test_streams_every_token_in_order(gen):
    assert await collect(gen, 30) == [1000 + k for k in range(30)]


async def test_stop_id_is_the_last_token():
    engine = FakeEngine(stop_at=5)
    gen = make(engine)
    try:
        assert await collect(gen, 30) == [1000, 1001, 1002, 1003, 1004, IDS.im_end]
    finally:
        gen.close_now()


async def test_many_concurrent_streams(gen):
    results = await asyncio.gather(*(collect(gen, 40, f"r{i}") for i in range(64)))
    assert all(r == [1000 + k for k in range(40)] for r in results)
    assert not gen._live


async def test_consumer_break_aborts_the_request(gen, engine):
    stream = gen.stream(Prompt((1000,)), SamplingOptions(max_tokens=10_000), "early")
    seen = 0
    async for delta in stream:
        seen += len(delta)
        if seen >= 5:
            break
    await stream.aclose()
    for _ in range(200):
        if engine.aborted:
            break
        await asyncio.sleep(0.005)
    assert engine.aborted and engine.aborted[0].startswith("early#") and not engine.running


async def test_abort_ends_the_stream_quietly(gen, engine):
    got = []

    async def consume():
        async for delta in gen.stream(Prompt((1000,)), SamplingOptions(max_tokens=10_000), "abort-me"):
            got.extend(delta)

    task = asyncio.ensure_future(consume())
    while len(got) < 3:
        await asyncio.sleep(0.002)
    await gen.abort("abort-me")
    await asyncio.wait_for(task, 2)
    assert len(got) < 10_000 and engine.aborted
    await gen.abort("unknown-id")  # ignored


async def test_cancelled_consumer_task_aborts(gen, engine):
    task = asyncio.ensure_future(collect(gen, 10_000, "cancel-me"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if engine.aborted:
            break
        await asyncio.sleep(0.005)
    assert engine.aborted


async def test_engine_failure_is_a_generation_error():
    gen = make(FakeEngine(fail_at=3))
    try:
        with pytest.raises(GenerationError, match="engine core died"):
            await collect(gen, 30)
    finally:
        gen.close_now()


def test_works_from_successive_event_loops(gen):
    for _ in range(3):
        assert asyncio.run(collect(gen, 5)) == [1000 + k for k in range(5)]


async def test_slow_consumer_gets_merged_deltas(gen):
    merged = []
    async for delta in gen.stream(Prompt((1000,)), SamplingOptions(max_tokens=50), "slow"):
        merged.append(delta)
        await asyncio.sleep(0.02)
    assert sum(len(d) for d in merged) == 50 and len(merged) < 50


async def test_closed_generator_refuses():
    gen = make(FakeEngine())
    gen.close_now()
    with pytest.raises(GenerationError):
        await collect(gen, 3)


def test_memory_fraction():
    total = 80 * GIB
    assert memory_fraction(78 * GIB, total, 12 * GIB, 24 * GIB) == pytest.approx(24 / 80, abs=1e-3)
    assert memory_fraction(30 * GIB, total, 12 * GIB, 24 * GIB) == pytest.approx(18 / 80, abs=1e-3)
    with pytest.raises(GenerationError, match="not enough free GPU memory"):
        memory_fraction(14 * GIB, total, 12 * GIB, 24 * GIB)


def test_id_runs():
    from engine.backends.vllm_gen import id_runs

    assert id_runs((5, 3, 4, 10, 11, 7, 4)) == ((3, 6), (7, 8), (10, 12))
    assert id_runs(tuple(range(100, 8292)) + (7,)) == ((7, 8), (100, 8292))


class PriorityEngine(FakeEngine):
    """Also records each request's `priority` (vLLM's priority policy: smaller first), None where none was given."""

    def __init__(self) -> None:
        super().__init__()
        self.priorities: dict[str, int | None] = {}

    def generate(self, prompt, params, request_id, priority=None):
        self.priorities[request_id.split("#")[0]] = priority
        return super().generate(prompt, params, request_id)


async def test_each_sentence_is_submitted_with_its_streams_deadline_as_priority():
    from engine.config import sentence_id
    from engine.deadlines import DeadlineBoard

    now = [10.0]
    board = DeadlineBoard(clock=lambda: now[0])
    for name, ahead in (("near", 0.3), ("far", 6.0)):
        board.open(name)
        board.heard(name, ahead)
    engine = PriorityEngine()
    gen = VllmTokenGenerator.attached(lambda: engine, IDS, by_deadline=True)
    gen._prompt, gen._params = (lambda ids: list(ids)), (lambda prompt, opts: opts)
    try:
        await collect(gen, 3, "unfollowed")
        gen.follow(board)
        now[0] = 10.05
        await collect(gen, 3, sentence_id("far", 1))
        await collect(gen, 3, sentence_id("near", 1))
        await collect(gen, 3, "warm-up")
    finally:
        gen.close_now()
    p = engine.priorities
    assert p["unfollowed"] is None  # no board: vLLM's default
    # due - the board's clock at follow(), in ms: near at 10.1 (0.1 s of slack), far capped at the wait bound
    assert p["near-1"] == 100 and p["far-1"] == round((10.05 + board.policy.max_wait_s - 10.0) * 1000)
    assert p["near-1"] < p["far-1"] <= p["warm-up"]
