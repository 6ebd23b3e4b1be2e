"""Helpers for tests of the graph lane (tests/model on the CPU, tests/gpu on a GPU): a crowd of streams that all
wait before the lane admits any of them."""
from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable, TypeVar

from engine.config import SamplingOptions
from engine.prompt import Prompt

T = TypeVar("T")


async def arriving_together(lane, monkeypatch, hold: Prompt, crowd: Callable[[], Awaitable[T]], count: int) -> T:
    """`crowd()`'s result, where `crowd` starts `count` streams on `lane` that all wait before the lane admits any:
    a one-token stream of `hold` keeps the lane's worker in its prefill until they have arrived, then leaves its
    row (so the lane's first prefill, of `hold`, is one prompt)."""
    entered, gate = threading.Event(), threading.Event()
    prefill = lane.runner.prefill

    def held(*args) -> None:
        if not entered.is_set():
            entered.set()
            gate.wait()
        prefill(*args)

    monkeypatch.setattr(lane.runner, "prefill", held)
    holder = asyncio.ensure_future(_drain(lane.stream(hold, SamplingOptions(temperature=0, max_tokens=1), "hold")))
    while not entered.is_set():
        await asyncio.sleep(0.001)
    streams = asyncio.ensure_future(crowd())
    while lane.load < count + 1:
        await asyncio.sleep(0.001)
    gate.set()
    await holder
    return await streams


async def _drain(stream) -> None:
    async for _ in stream:
        pass
