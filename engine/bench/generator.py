"""The bench's fixed workload: its sentence, its voice's globals, and a generator wrapper that forces every
sentence to the same token count and records when each token came. Pure."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from engine.config import SamplingOptions
from engine.prompt import Prompt

SENTENCE = ("The benchmark sentence is long enough to be a realistic thing to say, with a clause or two, "
            "and it ends here.")
BENCH_GLOBALS = tuple((k * 131 + 7) % 4096 for k in range(32))
"""Stored speaker globals of the benchmark voice (any 32 codes do for random weights)."""


@dataclass
class TokenTimes:
    """When one generation request produced its tokens (perf_counter seconds)."""

    start: float
    deltas: list[tuple[float, int]] = field(default_factory=list)
    """(time, cumulative token count) per delta."""

    def time_of(self, n: int) -> float | None:
        for t, count in self.deltas:
            if count >= n:
                return t
        return None

    @property
    def tokens(self) -> int:
        return self.deltas[-1][1] if self.deltas else 0

    def rate(self) -> float | None:
        """Tokens/s from the first delta to the last (decode speed, prefill excluded)."""
        if len(self.deltas) < 2:
            return None
        (t0, c0), (t1, c1) = self.deltas[0], self.deltas[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


class FixedLengthGenerator:
    """TokenGenerator wrapper: exactly `tokens` tokens per request (stop ids removed from the allowed ids), and a
    record of when each delta came (`times`)."""

    def __init__(self, inner: Any, tokens: int, stop_ids: frozenset[int]) -> None:
        self.inner, self.tokens, self.stop_ids = inner, tokens, stop_ids
        self.times: dict[str, TokenTimes] = {}
        self._filtered: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        """(allowed set, it without stop ids) of the last request: every sentence brings the same set, and
        filtering the ~8k ids per sentence would load the event loop the streams share, and give the
        generator a new tuple each time instead of the one it has checked."""

    @property
    def concurrent_streams(self) -> bool:
        return self.inner.concurrent_streams

    def _without_stops(self, allowed: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if allowed is None:
            return None
        if allowed is not self._filtered[0]:
            self._filtered = (allowed, tuple(t for t in allowed if t not in self.stop_ids))
        return self._filtered[1]

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        allowed = self._without_stops(prompt.allowed_ids)
        rec = self.times[request_id] = TokenTimes(time.perf_counter())
        count = 0
        async for delta in self.inner.stream(replace(prompt, allowed_ids=allowed),
                                             replace(opts, max_tokens=self.tokens), request_id):
            count += len(delta)
            rec.deltas.append((time.perf_counter(), count))
            yield delta

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def close(self) -> None:
        await self.inner.close()
