"""Provides UtteranceFolds: an utterance's stream folded into one array (`render`) or played through a sink
(`speak`), for anything with a `synthesize(req, text_stream)` stream of AudioChunks: the in-process Synthesizer and
the warm server's client alike. A module of its own so that a client need not import the pipeline."""
from __future__ import annotations

import asyncio
from contextlib import aclosing, suppress
from time import perf_counter
from typing import TYPE_CHECKING, AsyncGenerator, AsyncIterable, AsyncIterator

import numpy as np

from engine.events import EventSink, Notice
from engine.pacing import Pacer, RequestPace

if TYPE_CHECKING:
    from engine.backends.base import AudioSink
    from engine.config import SynthesisRequest
    from engine.types import AudioChunk


class UtteranceFolds:
    """`render` and `speak` over the subclass's `synthesize`; the subclass sets `pacer` and `events`."""

    pacer: Pacer
    """How much of each sentence `speak` holds back from the sink (engine.pacing)."""
    events: EventSink
    """Where what happens is reported (engine.events)."""

    def synthesize(self, req: SynthesisRequest,
                   text_stream: AsyncIterable[str] | None = None) -> AsyncGenerator[AudioChunk, None]:
        """The utterance's chunks, as they come: the subclass's stream, which the folds below consume."""
        raise NotImplementedError

    async def render(self, req: SynthesisRequest, text_stream: AsyncIterable[str] | None = None) -> np.ndarray:
        """The whole utterance as one float32 array."""
        async with aclosing(self.synthesize(req, text_stream)) as chunks:
            parts = [chunk.samples async for chunk in chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    async def speak(self, req: SynthesisRequest, sink: AudioSink,
                    text_stream: AsyncIterable[str] | None = None) -> None:
        """Play through a sink (awaits its backpressure), then wait until the sink has played everything. Audio is
        written as it comes or, where the engine is slower than real time, each sentence from the moment it can
        play through without a gap (`pacer`), whether or not a chunk comes then."""
        pace = self.pacer.request()
        held: list[np.ndarray] = []
        try:
            async with aclosing(self.synthesize(req, text_stream)) as chunks:
                ahead = _Ahead(chunks)
                try:
                    while not isinstance(chunk := await ahead.next(pace.release_at()), _End):
                        if chunk is None:  # the held sentence's moment came before its next chunk
                            pace.release()
                            await self._release(held, sink, pace)
                            continue
                        held.append(chunk.samples)
                        if not pace.arrived(chunk.seconds, chunk.sentence_end, perf_counter(), chunk.planned_s,
                                            chunk.made_at):
                            await self._release(held, sink, pace)
                            if chunk.sentence_end and self.pacer.holds_sentences:
                                sink.allow_pause()  # the next sentence may be held back a while: silence until then
                finally:
                    await ahead.cancel()
            await self._release(held, sink, pace)
            await sink.drain()
        except BaseException:
            sink.clear()
            raise

    async def _release(self, held: list[np.ndarray], sink: AudioSink, pace: RequestPace) -> None:
        """Write the held chunks, telling the pacer how long the sink kept us waiting."""
        message = self.pacer.notice()
        if message is not None:
            self.events(Notice(message))
        for samples in held:
            t = perf_counter()
            await sink.write(samples)
            pace.blocked(perf_counter() - t)
        held.clear()


class _End:
    """The type of _END, the mark of a stream's end."""


_END = _End()
"""`_Ahead.next`'s answer once the stream has ended."""


class _Ahead:
    """A chunk stream read one chunk ahead, so that waiting for the next chunk can end at a deadline without losing
    it: the pending read goes on and the next call picks it up."""

    def __init__(self, chunks: AsyncIterator[AudioChunk]) -> None:
        self._chunks = chunks
        self._pending: asyncio.Task | None = None

    async def next(self, deadline: float | None) -> AudioChunk | _End | None:
        """The next chunk, _END after the last, or None if `deadline` (perf_counter's clock) came first."""
        if deadline is None and self._pending is None:
            return await self._read()
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._read())
        if deadline is not None:
            done, _ = await asyncio.wait({self._pending}, timeout=max(0.0, deadline - perf_counter()))
            if not done:
                return None
        pending, self._pending = self._pending, None
        return await pending

    async def _read(self) -> AudioChunk | _End:
        return await anext(self._chunks, _END)

    async def cancel(self) -> None:
        """Stop a read still pending (the stream is being closed)."""
        if self._pending is not None:
            self._pending.cancel()
            with suppress(asyncio.CancelledError):
                await self._pending
            self._pending = None
