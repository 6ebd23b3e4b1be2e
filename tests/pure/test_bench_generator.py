"""The bench's fixed-length wrapper: stop ids leave the allowed set, once per set (the same tuple every time)."""
from __future__ import annotations

import asyncio

from engine.bench import FixedLengthGenerator
from engine.config import SamplingOptions
from engine.prompt import Prompt, semantic_allowed_ids
from engine.tokens import TokenIds

IDS = TokenIds()


class Seen:
    """A generator that records what it was given and yields one token."""

    def __init__(self) -> None:
        self.prompts: list[Prompt] = []
        self.opts: list[SamplingOptions] = []

    async def stream(self, prompt, opts, request_id):
        self.prompts.append(prompt)
        self.opts.append(opts)
        yield [1]


def test_stop_ids_leave_the_allowed_set_once_per_set() -> None:
    inner = Seen()
    gen = FixedLengthGenerator(inner, 250, IDS.stop_ids)
    allowed = semantic_allowed_ids(IDS)

    async def run(rid: str, prompt: Prompt) -> list[list[int]]:
        return [d async for d in gen.stream(prompt, SamplingOptions(max_tokens=9), rid)]

    for rid in ("a-0", "a-1", "b-0"):
        asyncio.run(run(rid, Prompt((1, 2, 3), allowed)))
    first = inner.prompts[0].allowed_ids
    assert not set(first) & IDS.stop_ids and len(first) == len(allowed) - len(IDS.stop_ids & set(allowed))
    assert all(p.allowed_ids is first for p in inner.prompts)  # one tuple: generators recognise it by identity
    assert all(o.max_tokens == 250 for o in inner.opts) and set(gen.times) == {"a-0", "a-1", "b-0"}
    asyncio.run(run("c-0", Prompt((1, 2, 3), None)))
    assert inner.prompts[-1].allowed_ids is None
