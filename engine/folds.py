"""Provides UtteranceFolds: an utterance's stream folded into one array (`render`) or played through a sink
(`speak`), for anything with a `synthesize(req, text_stream)` stream of AudioChunks: the in-process Synthesizer and
the warm server's client alike. A module of its own so that a client need not import the pipeline."""
from __future__ import annotations

from contextlib import aclosing
from time import perf_counter
from typing import TYPE_CHECKING, AsyncIterable

import numpy as np

from engine.events import Notice
from engine.pacing import Pacer, RequestPace

if TYPE_CHECKING:
    from engine.backends.base import AudioSink
    from engine.config import SynthesisRequest


class UtteranceFolds:
    """`render` and `speak` over the subclass's `synthesize`; the subclass sets `pacer` and `events`."""

    pacer: Pacer
    """How much of each sentence `speak` holds back from the sink (engine.pacing)."""

    async def render(self, req: SynthesisRequest, text_stream: AsyncIterable[str] | None = None) -> np.ndarray:
        """The whole utterance as one float32 array."""
        async with aclosing(self.synthesize(req, text_stream)) as chunks:  # type: ignore[attr-defined]
            parts = [chunk.samples async for chunk in chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    async def speak(self, req: SynthesisRequest, sink: AudioSink,
                    text_stream: AsyncIterable[str] | None = None) -> None:
        """Play through a sink (awaits its backpressure), then wait until the sink has played everything. Audio is
        written as it comes or, where the engine is slower than real time, each sentence once enough of it is there
        to play through without a gap (`pacer`)."""
        pace = self.pacer.request()
        held: list[np.ndarray] = []
        try:
            async with aclosing(self.synthesize(req, text_stream)) as chunks:  # type: ignore[attr-defined]
                async for chunk in chunks:
                    held.append(chunk.samples)
                    if not pace.arrived(chunk.seconds, chunk.sentence_end, perf_counter(), chunk.planned_s):
                        await self._release(held, sink, pace)
                        if chunk.sentence_end and self.pacer.holds_sentences:
                            sink.allow_pause()  # the next sentence may be held back a while: silence until then
            await self._release(held, sink, pace)
            await sink.drain()
        except BaseException:
            sink.clear()
            raise

    async def _release(self, held: list[np.ndarray], sink: AudioSink, pace: RequestPace) -> None:
        """Write the held chunks, telling the pacer how long the sink kept us waiting."""
        message = self.pacer.notice()
        if message is not None:
            self.events(Notice(message))  # type: ignore[attr-defined]
        for samples in held:
            t = perf_counter()
            await sink.write(samples)
            pace.blocked(perf_counter() - t)
        held.clear()
