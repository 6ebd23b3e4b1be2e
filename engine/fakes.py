"""Provides deterministic CPU fakes that run the real pipeline: a scripted token generator and a tone decoder.

For unit tests of pipeline logic and for `--backend fake` demos; real-model tests use synthetic checkpoints.
"""
from __future__ import annotations

import asyncio
import random
from typing import AsyncIterator, Sequence

import numpy as np

from engine.backends.base import DecodeItem
from engine.config import SamplingOptions
from engine.prompt import Prompt
from engine.tokens import TokenIds


class ScriptedGenerator:
    """Emits `tokens_per_sentence` semantic ids (seeded from opts.seed and the prompt), then `<|im_end|>`.

    Honours `prompt.allowed_ids` (samples from them instead) and `opts.max_tokens`; `delay_s` per token
    simulates a model's speed. With `serial`, the tokens of all streams take turns (one lock, first come first
    served) and each holds it for `delay_s`: an engine of a fixed throughput, 1 / delay_s tokens a second shared by
    every stream, so it keeps up with a known number of streams (the load benchmark's tests).
    """

    concurrent_streams = False
    """Its streams do not share a batch: each request's sentences go one after another."""

    def __init__(self, token_ids: TokenIds, tokens_per_sentence: int = 60, delay_s: float = 0.0,
                 serial: bool = False) -> None:
        self.token_ids, self.tokens_per_sentence, self.delay_s = token_ids, tokens_per_sentence, delay_s
        self.serial = serial
        self._turn: asyncio.Lock | None = None
        self.started: list[str] = []
        self.aborted: set[str] = set()
        self.steps = 0

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        self.started.append(request_id)
        rng = random.Random(hash((opts.seed, prompt.ids)) if opts.seed is not None else None)
        ids = self.token_ids
        pool: Sequence[int] = prompt.allowed_ids or range(ids.semantic_base, ids.semantic_base + 8192)
        stops = ids.stop_ids  # a property that builds its set: once, not per id
        can_stop = prompt.allowed_ids is None or bool(stops & set(prompt.allowed_ids))
        pool = [t for t in pool if t not in stops] or list(pool)
        for n in range(opts.max_tokens):
            if request_id in self.aborted:
                return
            if self.delay_s and self.serial:
                self._turn = self._turn or asyncio.Lock()
                async with self._turn:
                    await asyncio.sleep(self.delay_s)
            elif self.delay_s:
                await asyncio.sleep(self.delay_s)
            else:
                await asyncio.sleep(0)
            self.steps += 1
            if n == self.tokens_per_sentence and can_stop:
                yield [ids.im_end]
                return
            yield [rng.choice(pool)]

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    async def close(self) -> None:
        pass


def fixed_throughput(token_ids: TokenIds, tokens_per_s: float, streams: int) -> ScriptedGenerator:
    """A serial ScriptedGenerator fast enough for `streams` streams in real time and no more, for a model writing
    `tokens_per_s` tokens a second of audio."""
    return ScriptedGenerator(token_ids, delay_s=1 / (tokens_per_s * streams), serial=True)


class ToneDecoder:
    """Each code becomes `samples_per_code` samples of a tone whose pitch depends only on that code, so
    windowed decode is exact (and every seam mismatch the pipeline introduces is visible)."""

    sample_rate = 16000
    samples_per_code = 320
    device = "cpu"
    batch_limit = 128
    """Any number of windows decodes in one call; this many keeps a call short."""
    fixed_shapes = False
    """Windows of any length decode together: none is widened."""

    def decode(self, items: Sequence[DecodeItem]) -> list[np.ndarray]:
        return [self._one(item) for item in items]

    def warmup(self, lengths: Sequence[int], batches: Sequence[int], background: bool = False) -> float:
        return 0.0  # nothing to capture

    def _one(self, item: DecodeItem) -> np.ndarray:
        stop = len(item.codes) if item.keep_stop is None else item.keep_stop
        codes = np.asarray(item.codes[item.keep_start:stop], np.float64)
        freqs = 110.0 + (codes % 64) * 8.0 + (sum(item.global_tokens) % 50)
        n = np.arange(self.samples_per_code) / self.sample_rate
        pcm = 0.3 * np.sin(2 * np.pi * freqs[:, None] * n[None, :])  # [codes, samples_per_code]
        return pcm.reshape(-1).astype(np.float32)
