"""Provides UtteranceFolds: an utterance's stream folded into one array (`render`) or played through a sink
(`speak`), for anything with a `synthesize(req, text_stream)` stream of AudioChunks: the in-process Synthesizer and
the warm server's client alike. A module of its own so that a client need not import the pipeline."""
from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING, AsyncIterable

import numpy as np

if TYPE_CHECKING:
    from engine.backends.base import AudioSink
    from engine.config import SynthesisRequest


class UtteranceFolds:
    """`render` and `speak` over the subclass's `synthesize`."""

    async def render(self, req: SynthesisRequest, text_stream: AsyncIterable[str] | None = None) -> np.ndarray:
        """The whole utterance as one float32 array."""
        async with aclosing(self.synthesize(req, text_stream)) as chunks:  # type: ignore[attr-defined]
            parts = [chunk.samples async for chunk in chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    async def speak(self, req: SynthesisRequest, sink: AudioSink,
                    text_stream: AsyncIterable[str] | None = None) -> None:
        """Play through a sink (awaits its backpressure), then wait until the sink has played everything."""
        try:
            async with aclosing(self.synthesize(req, text_stream)) as chunks:  # type: ignore[attr-defined]
                async for chunk in chunks:
                    await sink.write(chunk.samples)
            await sink.drain()
        except BaseException:
            sink.clear()
            raise
