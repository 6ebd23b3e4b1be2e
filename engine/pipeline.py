"""Provides the Synthesizer: text -> sentences -> tokens -> windowed decode -> crossfaded audio chunks.

`synthesize()` is the only path; `render()` and `speak()` are folds over it. Depends on Protocols only.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from contextlib import aclosing, contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator, AsyncIterable, Callable, Iterator, Literal

import numpy as np

from engine.backends.base import CodecDecoder, DeadlineScheduled, DecodeItem, TokenGenerator
from engine.batching import FIRST_AUDIO_HOLD_S, DecodeBatcher, lengths_for
from engine.config import JoinConfig, SamplingOptions, SynthesisRequest, sentence_id
from engine.crossfade import fade_edges
from engine.engine_api import describe_engine, device_status, lane_status
from engine.deadlines import DeadlineBoard, Verdict
from engine.errors import GenerationError, InputError, VoiceError
from engine.families.base import CodeParser, Grammar
from engine.folds import UtteranceFolds
from engine.events import (ChunkDecoded, EventSink, FirstAudio, FirstToken, RequestFailed, RequestFinished,
                           RequestStarted, SentenceFinished, SentenceStarted, ignore_events)
from engine.pacing import Pacer
from engine.prompt import Prompt
from engine.text import SentenceSplitter, is_speakable, normalize, text_pieces
from engine.types import AudioChunk
from engine.voices import GlobalsCache, MemoryGlobalsCache, Voice, VoiceBank, available_voice
from engine.windowed_decode import WindowedDecode
from engine.windowing import Window, WindowSchedule

def sentence_seed(seed: int | None, index: int) -> int | None:
    """Per-sentence seed: each sentence is reproducible on its own, whatever the generation order."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


class _TokenFeed:
    """One sentence's generation running in the background, its deltas queued for the decoder loop."""

    def __init__(self, generator: TokenGenerator, prompt: Prompt, opts: SamplingOptions, request_id: str) -> None:
        self.request_id = request_id
        self.max_tokens = opts.max_tokens
        """The sentence's token cap: the most codes (so audio) it can make."""
        self.queue: asyncio.Queue[list[int] | BaseException | None] = asyncio.Queue()
        self._generator = generator
        self.task = asyncio.create_task(self._run(prompt, opts))

    async def _run(self, prompt: Prompt, opts: SamplingOptions) -> None:
        try:
            async for delta in self._generator.stream(prompt, opts, self.request_id):
                self.queue.put_nowait(list(delta))
            self.queue.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # handed to the consumer, which raises it in its own context
            self.queue.put_nowait(err)

    async def get(self) -> list[int] | None:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def get_nowait(self) -> list[int] | None | Literal[False]:
        """Next delta if one is queued, else False."""
        if self.queue.empty():
            return False
        item = self.queue.get_nowait()
        if isinstance(item, BaseException):
            raise item
        return item

    async def stop(self) -> None:
        if not self.task.done():
            self.task.cancel()
            await self._generator.abort(self.request_id)
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass


@dataclass
class _Progress:
    """Per-request counters."""

    t0: float
    chunks: int = 0
    samples: int = 0
    tokens: int = 0
    first_token: bool = False
    first_audio: bool = False


@dataclass
class _SentenceStats:
    """What a sentence's rendering found, for its SentenceFinished event."""

    tokens: int = 0
    hit_limit: bool = False


class _AheadRender:
    """A sentence's audio rendered in the background before its turn (a lone request's next sentence), so its
    windows decode while their tokens arrive, batched with the current sentence's, instead of one after another
    once the current sentence has played out, after its last token. The pieces wait in
    memory (10 s of audio is 640 kB)."""

    def __init__(self, pieces: AsyncGenerator[tuple[np.ndarray, bool], None], stats: _SentenceStats) -> None:
        self.stats = stats
        self.queue: asyncio.Queue[tuple[np.ndarray, bool, float] | BaseException | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(pieces))

    async def _run(self, pieces: AsyncGenerator[tuple[np.ndarray, bool], None]) -> None:
        try:
            async with aclosing(pieces) as it:
                async for samples, final in it:
                    self.queue.put_nowait((samples, final, time.perf_counter()))
            self.queue.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # raised in the consumer's context when it reaches this sentence
            self.queue.put_nowait(err)

    async def parts(self) -> AsyncGenerator[tuple[np.ndarray, bool, float | None], None]:
        """(samples, final, when they were made) of each window, as they come."""
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            await self.stop()

    async def stop(self) -> None:
        if not self.task.done():
            self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass


async def _made_now(pieces: AsyncGenerator[tuple[np.ndarray, bool], None],
                    ) -> AsyncGenerator[tuple[np.ndarray, bool, float | None], None]:
    """A sentence's windows rendered in its turn: made as they are handed on (AudioChunk.made_at None)."""
    async with aclosing(pieces) as it:
        async for samples, final in it:
            yield samples, final, None


class Synthesizer(UtteranceFolds):
    """Streams speech for requests. One instance per loaded model; safe for concurrent requests."""

    def __init__(self, generator: TokenGenerator, decoder: CodecDecoder, grammar: Grammar, voices: VoiceBank,
                 globals_cache: GlobalsCache | MemoryGlobalsCache | None = None,
                 *, schedule: WindowSchedule = WindowSchedule(), join: JoinConfig = JoinConfig(),
                 events: EventSink = ignore_events, eager_lookahead: bool = False,
                 decode_batch: int | None = None, model_info: Any = None, pacer: Pacer | None = None,
                 devices: tuple[str, ...] = ()) -> None:
        """`decode_batch`: most windows in one decoder call (None: what the decoder takes, its `batch_limit`); 1
        makes a window's samples independent of what it would have been batched with (a deterministic engine).
        `devices`: where the LLM and the decoder compute (default: the decoder's device)."""
        self.generator, self.decoder = generator, decoder
        self.grammar = grammar
        """The checkpoint's prompt format and token grammar (its family's: engine.families)."""
        self.model_info = model_info
        """The checkpoint this engine runs (engine.families.base.Checkpoint; None for the fake engine)."""
        self.pacer = pacer or Pacer()
        self.devices = devices or (str(decoder.device),)
        """The devices this engine computes on ("cuda:1", "cpu"), for its status."""
        self.voices, self.globals_cache = voices, globals_cache
        self.schedule, self.join, self.events = schedule, join, events
        self.eager_lookahead = eager_lookahead
        """Start the next sentence's generation at the current one's first audio (batching backends, where a
        second request costs little) instead of when the current one's generation ends (CPU)."""
        self.sample_rate = decoder.sample_rate
        self.active_requests = 0
        """Requests being synthesized now (picks the busy window schedule)."""
        self.deadlines = DeadlineBoard()
        """When each live request's next audio is due (engine.deadlines): the decoder batcher and the generator
        order their queues by it, and the front ends ask it whether one more stream fits (`admit`)."""
        self._decode_pool = ThreadPoolExecutor(1, thread_name_prefix="decode")
        # Only a GPU's decoder (fixed shapes) holds its queue for a first window: its calls take milliseconds where
        # the streams it holds back are made seconds ahead; a CPU decoder's calls are those streams' real-time budget.
        self.batcher = DecodeBatcher(decoder, self._decode_pool, max_batch=decode_batch or decoder.batch_limit,
                                     one_length=decoder.fixed_shapes, deadlines=self.deadlines,
                                     first_audio_hold_s=FIRST_AUDIO_HOLD_S if decoder.fixed_shapes else 0.0)
        """Gathers windows of concurrent streams into one decoder call (engine.batching)."""
        self._shape_lengths: tuple[int, ...] = ()
        """Standard window lengths to widen windows to (decoders that batch or graph-capture equal shapes)."""
        self.use_schedule(schedule)
        self._globals_lock = asyncio.Lock()
        self._follow(generator)

    def swap_generator(self, generator: TokenGenerator) -> TokenGenerator:
        """Hand the next sentences to `generator` (a server's tuned one); sentences already generating finish on
        the one they started on. Returns the generator it replaced, for the caller to close once idle."""
        old, self.generator = self.generator, generator
        self._follow(generator)
        return old

    def admit(self) -> Verdict:
        """Whether one more request may start now without pushing a live one into an underrun (the front ends ask
        before they start one: engine.deadlines DeadlineBoard.admit). Always, on an engine whose pacer holds
        sentences back (slower than real time by measure or by design): there no listener is played in real time
        from its first audio, so no deadline is missed."""
        if self.pacer.holds_sentences:
            return Verdict(True)
        return self.deadlines.admit()

    def capacity(self) -> float | None:
        """Streams this engine carries in real time as far as its live ones show (engine.deadlines)."""
        return self.deadlines.capacity()

    def _follow(self, generator: TokenGenerator) -> None:
        """A generator that schedules by deadline orders its queue by this engine's board."""
        if isinstance(generator, DeadlineScheduled):
            generator.follow(self.deadlines)

    def use_schedule(self, schedule: WindowSchedule) -> tuple[int, ...]:
        """Plan the sentences that start from now on with `schedule` (those rendering keep theirs), their windows
        widened to its standard lengths. Returns those lengths, empty where the decoder takes any shape; a decoder
        that captures one graph per shape must be warmed up for them (CodecDecoder.warmup) before they come."""
        self.schedule = schedule
        self._shape_lengths = lengths_for(schedule) if self.decoder.fixed_shapes else ()
        return self._shape_lengths

    @contextmanager
    def scheduled(self, schedule: WindowSchedule) -> Iterator[tuple[int, ...]]:
        """`use_schedule` for the length of a with-block (a benchmark's variant); the schedule before comes back
        after it."""
        before = self.schedule
        try:
            yield self.use_schedule(schedule)
        finally:
            self.use_schedule(before)

    # ---- voices -------------------------------------------------------------------------------------

    async def voice_globals(self, name: str) -> tuple[int, ...]:
        """The voice's conditioning (Spark: its 32 speaker globals): stored, cached for this checkpoint, or
        computed once now with the LLM. Empty for a family whose voices need none (Orpheus names the voice in the
        prompt)."""
        return await self._conditioning(self.voices.get(name))

    async def _conditioning(self, voice: Voice) -> tuple[int, ...]:
        stored = self.grammar.stored_conditioning(voice, getattr(self.model_info, "checkpoint_hash", None))
        if stored is not None:
            return stored
        async with self._globals_lock:
            cached = self.globals_cache.get(voice) if self.globals_cache else None
            if cached is None:
                cached = await self.grammar.conditioning(voice, self._sample)
                if self.globals_cache:
                    self.globals_cache.put(voice, cached)
            return cached

    async def _sample(self, prompt: Prompt, n: int, seed: int, request_id: str) -> list[int]:
        opts = SamplingOptions(max_tokens=n, seed=seed)
        out: list[int] = []
        async for delta in self.generator.stream(prompt, opts, request_id):
            out += delta
        return out[:n]

    # ---- the primitive ------------------------------------------------------------------------------

    async def synthesize(self, req: SynthesisRequest,
                         text_stream: AsyncIterable[str] | None = None) -> AsyncGenerator[AudioChunk, None]:
        """Stream audio for `req.text` (or, if given, for text arriving on `text_stream`, sentence by sentence)."""
        progress = _Progress(t0=time.perf_counter())
        self.events(RequestStarted(req.request_id))
        self.active_requests += 1
        self.deadlines.open(req.request_id)
        cancelled = True
        try:
            voice = self.voices.get(req.voice)
            globals_ = await self._conditioning(voice)
            # aclosing: an abandoned stream must stop generation now, not whenever the GC finalizes it.
            async with aclosing(self._chunks(req, text_stream, voice, globals_, progress)) as chunks:
                async for chunk in chunks:
                    self.deadlines.hold(req.request_id, True)  # until the consumer asks for more
                    yield chunk
                    self.deadlines.hold(req.request_id, False)
            cancelled = False
        except VoiceError as err:
            self.events(RequestFailed(req.request_id, str(err)))
            raise
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as err:
            message = describe_failure(err)
            self.events(RequestFailed(req.request_id, message))
            raise GenerationError(message) from err
        finally:
            self.active_requests -= 1
            self.deadlines.close(req.request_id)
            wall = time.perf_counter() - progress.t0
            audio = progress.samples / self.sample_rate
            self.events(RequestFinished(req.request_id, audio_s=audio, wall_s=wall,
                                        rtf=wall / audio if audio else float("inf"), tokens=progress.tokens,
                                        cancelled=cancelled))

    async def _chunks(self, req: SynthesisRequest, text_stream: AsyncIterable[str] | None, voice: Voice,
                      globals_: tuple[int, ...], progress: _Progress) -> AsyncGenerator[AudioChunk, None]:
        sentences = _SentenceSource(req.text, text_stream, self.join.max_sentence_chars, self.grammar.normalize)
        feeds: list[tuple[int, _TokenFeed, _AheadRender | None]] = []
        index = 0

        def lookahead() -> None:
            """Start the next sentence's generation (and, for a lone request, its audio) if its text is here."""
            nonlocal index
            text = sentences.next_nowait()
            if text is None:
                return
            feed = self._start(req, text, index, voice, globals_)
            ahead = None
            if self._alone():
                stats = _SentenceStats()
                ahead = _AheadRender(self._render(req, index, feed, stats, globals_, progress, None, ahead=True),
                                     stats)
            feeds.append((index, feed, ahead))
            index += 1

        try:
            while True:
                if not feeds:
                    self.deadlines.hold(req.request_id, True)  # waiting for its text is not the engine's lateness
                    text = await sentences.next()
                    self.deadlines.hold(req.request_id, False)
                    if text is None:
                        break
                    feeds.append((index, self._start(req, text, index, voice, globals_), None))
                    index += 1
                i, feed, ahead = feeds.pop(0)
                planned_s = (feed.max_tokens // self.grammar.tokens_per_code * self.decoder.samples_per_code
                             / self.sample_rate)
                self.events(SentenceStarted(req.request_id, i, planned_s))
                if i > 0:
                    yield self._pause_chunk(req, i, progress)
                if ahead is None:
                    stats = _SentenceStats()
                    parts = _made_now(self._render(req, i, feed, stats, globals_, progress,
                                                   start_next=lookahead if not feeds else None))
                else:
                    if not feeds:
                        lookahead()  # its audio is (being) rendered already: the next one may start now
                    stats, parts = ahead.stats, ahead.parts()
                async with aclosing(parts) as pieces:
                    async for samples, final, made_at in pieces:
                        yield self._emit(req, i, samples, final, progress, planned_s=planned_s, made_at=made_at)
                self.events(SentenceFinished(req.request_id, i, tokens=stats.tokens, hit_limit=stats.hit_limit))
            if index == 0:
                raise InputError("nothing to say: the text has no speakable words")
        finally:
            for _, feed, ahead in feeds:
                if ahead is not None:
                    await ahead.stop()
                await feed.stop()
            await sentences.close()

    def _crowded(self) -> bool:
        """More requests than `WindowSchedule.busy_streams`: a sentence takes the busy windows."""
        return self.active_requests > self.schedule.busy_streams

    def _windows(self, schedule: WindowSchedule, globals_: tuple[int, ...]) -> WindowedDecode:
        return WindowedDecode(schedule, globals_, self.decoder.samples_per_code, self._shape_lengths)

    def _alone(self) -> bool:
        """A lone listener on a batching backend (`WindowSchedule.solo_streams`): its next sentence generates
        and decodes side by side with the current one."""
        return self.eager_lookahead and self.active_requests <= self.schedule.solo_streams

    def _start(self, req: SynthesisRequest, text: str, index: int, voice: Voice,
               globals_: tuple[int, ...]) -> _TokenFeed:
        prompt = self.grammar.prompt(text, voice, globals_)
        opts = replace(self.grammar.sampling(req.options), seed=sentence_seed(req.options.seed, index),
                       max_tokens=min(req.options.max_tokens, self.grammar.token_cap(text)))
        return _TokenFeed(self.generator, prompt, opts, sentence_id(req.request_id, index))

    async def _render(self, req: SynthesisRequest, index: int, feed: _TokenFeed, stats: _SentenceStats,
                      globals_: tuple[int, ...], progress: _Progress,
                      start_next: Callable[[], None] | None,
                      ahead: bool = False) -> AsyncGenerator[tuple[np.ndarray, bool], None]:
        """One sentence's audio, (samples, final) per decoded window. `start_next` starts the next sentence's
        generation: once this one's is done, or (eager_lookahead, for batching backends) already at its first
        audio, so that a stream keeps one request in the generator until it has sound, and the next one is
        ready long before it is needed; for a lone request (`WindowSchedule.solo_streams`) at once, side by
        side with this one (and its audio is rendered ahead too: `_AheadRender`, with `ahead`'s schedule).
        Not when busy: generation is then the shared bottleneck, and every stream's next sentence would compete
        with the first sentences that still need their next windows."""
        parser = self.grammar.parser()
        busy = self._crowded()
        # A request's first sentence on an engine that may lag (the pacer probes it) generates alone: its own speed
        # decides when it plays, and a sentence stepping beside it would slow it just then; its next one starts
        # once it is generated.
        alone_first = index == 0 and self.pacer.probe_first
        early = self._alone() and not alone_first
        schedule = self.schedule.ahead() if ahead else self.schedule.busy() if busy else self.schedule
        windows = self._windows(schedule, globals_)
        codes: list[Any] = []
        done, first_chunk = False, True
        fade = int(self.join.fade_s * self.sample_rate)
        try:
            while True:
                done = self._take_queued(feed, parser, codes, progress, done, req.request_id)
                if first_chunk and not (busy or ahead) and self._crowded():
                    # no window planned yet, and a crowd came meanwhile (requests that arrive together start one
                    # by one): this sentence is one of it, on the windows that keep up with a crowd's slower steps
                    busy, windows = True, self._windows(self.schedule.busy(), globals_)
                at_first_audio = self.eager_lookahead and not busy and not first_chunk and not alone_first
                if start_next is not None and (done or early or at_first_audio):
                    start_next()
                    start_next = None
                window = windows.next_window(len(codes), done)
                if window is None:
                    if done:
                        break
                    delta = await feed.get()
                    done = self._consume(delta, parser, codes, progress, req.request_id)
                    continue
                pcm = await self._decode(req, index, window, windows.item(window, codes))
                out = windows.join(window, pcm)
                out = fade_edges(out, fade if first_chunk else 0, fade if window.final else 0)
                first_chunk = False
                yield out, window.final
        finally:
            await feed.stop()
        stats.tokens, stats.hit_limit = parser.code_count, not parser.done

    def _take_queued(self, feed: _TokenFeed, parser: CodeParser, codes: list[Any], progress: _Progress,
                     done: bool, request_id: str) -> bool:
        """Consume every delta already queued, so each window sees the newest codes."""
        while not done:
            delta = feed.get_nowait()
            if delta is False:
                break
            done = self._consume(delta, parser, codes, progress, request_id)
        return done

    def _consume(self, delta: list[int] | None, parser: CodeParser, codes: list[Any], progress: _Progress,
                 request_id: str) -> bool:
        if delta is None:
            return True
        if not progress.first_token:
            progress.first_token = True
            self.events(FirstToken(request_id, time.perf_counter() - progress.t0))
        new = parser.feed(delta)
        codes += new
        progress.tokens += len(new)
        return parser.done

    async def _decode(self, req: SynthesisRequest, index: int, window: Window, item: DecodeItem) -> np.ndarray:
        t = time.perf_counter()
        pcm = await self.batcher.decode(item, req.request_id)
        final_codes = window.emit_stop - window.tail - window.emit_start
        self.events(ChunkDecoded(req.request_id, index, codes=final_codes,
                                 samples=final_codes * self.decoder.samples_per_code, decode_s=time.perf_counter() - t))
        return pcm

    def _emit(self, req: SynthesisRequest, index: int, samples: np.ndarray, last: bool, progress: _Progress,
              pause: bool = False, planned_s: float | None = None, made_at: float | None = None) -> AudioChunk:
        chunk = AudioChunk(req.request_id, samples, self.sample_rate, index, progress.chunks, last, pause,
                           planned_s, made_at)
        progress.chunks += 1
        progress.samples += len(samples)
        self.deadlines.heard(req.request_id, len(samples) / self.sample_rate)
        if not progress.first_audio and not pause:
            progress.first_audio = True
            self.events(FirstAudio(req.request_id, time.perf_counter() - progress.t0))
        return chunk

    def _pause_chunk(self, req: SynthesisRequest, index: int, progress: _Progress) -> AudioChunk:
        silence = np.zeros(int(self.join.pause_s * self.sample_rate), np.float32)
        return self._emit(req, index, silence, False, progress, pause=True)

    async def warm_up(self, voice: str | None = None) -> float:
        """One short request through the whole pipeline, its audio and events dropped (nothing is listening yet):
        the process's first-use costs (threads started, per-thread GPU handles, first graph launches, lazy
        imports and allocations) fall on it rather than on the first request a user hears. Two sentences, so that
        the next sentence's side-by-side path runs too; the first long enough for a first window and a last one.
        Returns its seconds. Call it before any other request: events of requests meanwhile are dropped too.
        `voice` None: the default voice, or where the bank has none by that name (a benchmark's or a user's own
        bank) the first by name (voices.available_voice); an empty bank fails with VoiceNotFound."""
        t0 = time.perf_counter()
        voice = available_voice("default", self.voices.all(), self.voices.default) if voice is None else voice
        schedule = self.schedule
        tokens = schedule.first_new + schedule.right_context(0) + schedule.new
        req = SynthesisRequest(WARM_UP_TEXT, voice=voice, options=SamplingOptions(max_tokens=tokens, seed=0),
                               request_id="warm-up")
        events, self.events = self.events, ignore_events
        try:
            async with aclosing(self.synthesize(req)) as chunks:
                async for _ in chunks:
                    pass
        finally:
            self.events = events
        return time.perf_counter() - t0

    def describe(self) -> dict[str, Any]:
        """engine.engine_api.Engine.describe: backend, checkpoint and pacing."""
        return describe_engine(self)

    def status(self) -> dict[str, Any]:
        """engine.engine_api.Engine.status: each device's memory, the decoder's calls (the longest, the latest slow
        ones, the time its queue waited for first windows) and the graph lane's counters."""
        stats = self.batcher.stats
        decoder = {"calls": stats.calls, "windows": stats.items, "longest_ms": round(stats.longest_s * 1e3, 1),
                   "held_for_first_audio_ms": round(self.batcher.held_s * 1e3, 1),
                   "slow": [[round(took * 1e3, 1), windows, list(lengths)]
                            for _, took, windows, lengths in list(stats.slow)[-SLOW_SHOWN:]]}
        return {"devices": [device_status(d) for d in self.devices], "decoder": decoder, **lane_status(self.generator)}

    async def close(self) -> None:
        await self.generator.close()
        self._decode_pool.shutdown(wait=False, cancel_futures=True)


SLOW_SHOWN = 8
"""Slow decoder calls status lists (ms, windows, their code lengths), the latest."""
WARM_UP_TEXT = "Warming up. Ready now."
"""`Synthesizer.warm_up`'s text: two short sentences."""


FEED_CHARS = 4096
"""A whole text is split and normalized this many characters at a time, as its sentences are needed: first sound
does not wait for the rest of a long text, and the engine's event loop (every other stream's too) is never held
for more than one piece. Done whole, one megabyte took 4.2 s (0.3 s splitting, 3.9 s normalizing) on a 2-core
machine before its first sentence could start."""


class _SentenceSource:
    """Normalized, speakable sentences from a string and/or from text arriving on an async stream, produced as
    they are asked for (the splitter gives the same sentences however the text is cut into pieces)."""

    def __init__(self, text: str, stream: AsyncIterable[str] | None, max_chars: int,
                 normalize: Callable[[str], str] = normalize) -> None:
        self._splitter = SentenceSplitter(max_chars=max_chars)
        self._normalize = normalize
        """The family's sentence normalizer (Grammar.normalize)."""
        self._raw: deque[str] = deque()
        """Split sentences not yet normalized."""
        self._pieces: Iterator[str] = text_pieces(text, FEED_CHARS)
        """The text not yet split, a piece at a time."""
        self._stream = stream.__aiter__() if stream is not None else None
        self._flushed = False

    def _feed_text(self) -> bool:
        """Split the next piece of the text; False once all of it is fed."""
        piece = next(self._pieces, None)
        if piece is None:
            return False
        self._raw.extend(self._splitter.feed(piece))
        return True

    def _finish(self) -> None:
        if not self._flushed:
            self._flushed = True
            self._raw.extend(self._splitter.flush())

    def next_nowait(self) -> str | None:
        """The next sentence available without waiting for the stream (None: none yet, or the end)."""
        while True:
            while not self._raw:
                if self._feed_text():
                    continue
                if self._stream is None and not self._flushed:
                    self._finish()
                    continue
                return None
            text = self._normalize(self._raw.popleft())
            if is_speakable(text):
                return text

    async def next(self) -> str | None:
        """The next sentence, waiting for streamed text if need be (None: the end)."""
        while True:
            text = self.next_nowait()
            if text is not None or self._stream is None or self._flushed:
                return text
            try:
                piece = await self._stream.__anext__()
            except StopAsyncIteration:
                self._finish()
                continue
            # the text before it is all fed (next_nowait found no sentence): a large piece is fed a piece at a time too
            self._pieces = text_pieces(piece, FEED_CHARS)

    async def close(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


def describe_failure(err: BaseException) -> str:
    """One line for an unexpected backend failure (out of memory gets a hint)."""
    text = f"{type(err).__name__}: {err}".splitlines()[0]
    if "out of memory" in text.lower():
        return f"out of GPU memory while synthesizing ({text}); close other GPU programs or use --device cpu"
    return f"synthesis failed: {text}"
