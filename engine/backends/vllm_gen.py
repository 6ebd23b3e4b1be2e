"""Provides VllmTokenGenerator: vLLM's AsyncLLM in-process (its engine core in a child process) behind TokenGenerator.

The AsyncLLM lives on its own event loop in a daemon thread ("vllm-loop"): vLLM binds its output handler and
ZMQ sockets to the loop that first uses them, while our callers (CLI, TUI, tests) come and go with their own
loops. Each request is pumped on the vLLM loop and its token deltas cross to the caller's loop through a
channel; wake-ups are coalesced per caller loop, so one engine step costs one cross-thread call, not one per
stream. Prompts go in as token ids (no tokenizer in vLLM), outputs come back as DELTA token ids.

Start-up (model load, torch.compile, CUDA graphs; ~1 min cold, less with vLLM's compile cache) and a warm-up
over the batch sizes real traffic uses happen in the constructor, reported through `Notice` events, so no
request pays a lazy compile. Failures to start raise ImportError (vLLM not installed) or GenerationError
(no/unsupported GPU, out of memory, engine crash): the factory then falls back to the torch generator.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import os
import threading
import time
from collections import deque
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, AsyncIterator, Sequence

from engine.config import SamplingOptions, request_of
from engine.deadlines import DeadlineBoard
from engine.errors import GenerationError, one_line
from engine.events import EventSink, Notice, ignore_events
from engine.prompt import Prompt

GIB = 1 << 30
ALLOWED_RUNS_KEY = "voiceapp_allowed_runs"
"""SamplingParams.extra_args key: the request's allowed ids as [[lo, hi), ...] (engine.backends.vllm_logits)."""
LOGITS_PROCESSORS = ["engine.backends.vllm_logits:AllowedRunsLogitsProcessor"]
WARMUP_BATCHES = (1, 8, 32, 64, 128)
"""Concurrent request counts warmed up at start (what the benchmark and real traffic use)."""
MIN_COMPUTE_CAPABILITY = (8, 0)
"""bf16 needs Ampere or newer (fp16 breaks Spark's LLM, so older GPUs fall back to the torch generator)."""


def memory_fraction(free: int, total: int, reserve: int, want: int) -> float:
    """vLLM's `gpu_memory_utilization` (a fraction of the whole card): what it wants (`want` bytes: weights,
    activations, CUDA graphs, KV cache), but never more than what is free minus `reserve` (the BiCodec decoder's
    weights, CUDA graphs and workspace, in this process). Raises GenerationError when too little is left."""
    room = free - reserve
    if room < min(want, 4 * GIB):
        raise GenerationError(f"not enough free GPU memory for vLLM: {free / GIB:.1f} GiB free, "
                              f"{reserve / GIB:.1f} GiB kept for the decoder (close other GPU programs)")
    return round(min(room, want) / total, 4)


@functools.lru_cache(maxsize=64)
def id_runs(ids: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Token ids as sorted, merged half-open runs ((lo, hi), ...) (the semantic set + stop ids is 2-3 runs)."""
    runs: list[list[int]] = []
    for t in sorted(set(ids)):
        if runs and t == runs[-1][1]:
            runs[-1][1] = t + 1
        else:
            runs.append([t, t + 1])
    return tuple((lo, hi) for lo, hi in runs)


class _Waker:
    """Coalesces cross-thread wake-ups for one consumer event loop: many channels made ready during one vLLM
    step cost one `call_soon_threadsafe`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._ready: list[_Channel] = []
        self._scheduled = False

    def notify(self, channel: "_Channel") -> None:  # vLLM thread
        with self._lock:
            self._ready.append(channel)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # consumer loop closed: nobody is listening any more
            pass

    def _flush(self) -> None:  # consumer loop
        with self._lock:
            ready, self._ready, self._scheduled = self._ready, [], False
        for channel in ready:
            channel.wake()


class _Channel:
    """One request's outputs, from the vLLM thread to the consumer's loop. Items: ("tokens", ids, finished),
    ("error", exception) or ("end", None) (aborted)."""

    def __init__(self, waker: _Waker) -> None:
        self.items: deque[tuple[str, Any, bool]] = deque()
        self._waker = waker
        self._waiter: asyncio.Future[None] | None = None

    def push(self, kind: str, payload: Any = None, finished: bool = False) -> None:  # vLLM thread
        self.items.append((kind, payload, finished))
        self._waker.notify(self)

    def wake(self) -> None:  # consumer loop
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[tuple[str, Any, bool]]:
        while not self.items:
            self._waiter = self._waker.loop.create_future()
            if self.items:  # pushed between the check and the waiter
                break
            await self._waiter
        out = []
        while self.items:
            out.append(self.items.popleft())
        return out


class VllmTokenGenerator:
    """TokenGenerator over vLLM's AsyncLLM (bf16, CUDA graphs, continuous batching)."""

    concurrent_streams = True
    """Runs many streams at once in one batch: the pipeline may start a request's next sentence early."""

    def __init__(self, info: Any, *, events: EventSink = ignore_events, max_num_seqs: int = 256,
                 max_model_len: int = 4096, decoder_reserve_gib: float = 12.0, want_gib: float = 24.0,
                 gpu_memory_utilization: float | None = None, warmup_batches: Sequence[int] = WARMUP_BATCHES,
                 enforce_eager: bool = False, start_timeout_s: float = 900.0, by_deadline: bool = True,
                 **engine_kwargs: Any) -> None:
        """`by_deadline`: vLLM's priority scheduling, each sentence's priority its stream's due time once the
        engine's board is followed (`follow`); False: vLLM's first come, first served."""
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # our process already holds a CUDA context
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
        # vLLM logs to stdout by default, which would corrupt `say --json` / `status --json` and anything piped
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        # Allowed ids go through our logits processor (engine.backends.vllm_logits), which vLLM 0.26 runs on its
        # V1 model runner only (its V2 runner also caps allowed_token_ids at 1024 ids; we need 8195).
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        import torch
        import vllm  # noqa: F401  (ImportError -> the factory falls back to torch)

        if not torch.cuda.is_available():
            raise GenerationError("vLLM needs a CUDA GPU and none is available")
        capability = torch.cuda.get_device_capability()
        if capability < MIN_COMPUTE_CAPABILITY:
            raise GenerationError(f"vLLM backend needs a GPU with bf16 (compute capability 8.0+), found "
                                  f"{capability[0]}.{capability[1]}")
        if gpu_memory_utilization is None:
            free, total = torch.cuda.mem_get_info()
            gpu_memory_utilization = memory_fraction(free, total, int(decoder_reserve_gib * GIB),
                                                     int(want_gib * GIB))
        self.gpu_memory_utilization = gpu_memory_utilization
        self.info = info
        self._setup(info.token_ids, events, max_num_seqs)
        self._by_deadline = by_deadline
        if by_deadline:
            engine_kwargs.setdefault("scheduling_policy", "priority")
        engine_args = dict(model=str(info.llm_dir), skip_tokenizer_init=True, dtype="bfloat16",
                           gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                           max_num_seqs=max_num_seqs, enable_prefix_caching=True, enforce_eager=enforce_eager,
                           disable_log_stats=True,
                           logits_processors=LOGITS_PROCESSORS,
                           **engine_kwargs)
        t0 = time.perf_counter()
        events(Notice(f"starting vLLM on {torch.cuda.get_device_name()} (model load, compile, CUDA graphs; "
                      f"about a minute the first time), {gpu_memory_utilization:.0%} of GPU memory"))
        try:
            self._call(self._start(engine_args), start_timeout_s)
        except Exception as err:
            self._stop_thread()
            _reraise(err)
        self.start_s = time.perf_counter() - t0
        events(Notice(f"vLLM ready in {self.start_s:.0f} s"))
        if warmup_batches:
            try:
                self.warmup(warmup_batches)
            except Exception as err:
                self.close_now()
                _reraise(err)

    def _setup(self, token_ids: Any, events: EventSink, max_num_seqs: int) -> None:
        """State shared by the real constructor and `attached` (tests): ids, bookkeeping, the vLLM thread."""
        self.events = events
        self.token_ids = token_ids
        self._stop_ids = sorted(token_ids.stop_ids)
        self._default_allowed = token_ids.audio_ids
        self.max_num_seqs = max_num_seqs
        self.warmup_s: dict[int, float] = {}
        self.start_s = 0.0
        self._ids = itertools.count()
        self._live: dict[str, dict[str, ConcurrentFuture[None]]] = {}
        self._wakers: dict[int, _Waker] = {}
        self._llm: Any = None
        self._by_deadline = False
        """Submit with a priority (the engine runs vLLM's priority policy)."""
        self._deadlines: DeadlineBoard | None = None
        """The streams' due times a sentence's priority comes from (`follow`)."""
        self._epoch = time.perf_counter()
        """Priorities are milliseconds of the board's clock after this (vLLM takes an int, smaller first)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()

    @classmethod
    def attached(cls, make_engine: Any, token_ids: Any, *, max_num_seqs: int = 256,
                 events: EventSink = ignore_events, by_deadline: bool = False) -> "VllmTokenGenerator":
        """A generator around an engine object built by `make_engine()` on the vLLM thread (anything with
        AsyncLLM's `generate(prompt, params, request_id)` and `shutdown()`, and its `priority` keyword with
        `by_deadline`); for tests of the plumbing."""
        self = cls.__new__(cls)
        self.info = None
        self._setup(token_ids, events, max_num_seqs)
        self._by_deadline = by_deadline

        async def build() -> None:
            self._llm = make_engine()

        self._call(build(), 60)
        return self

    # ---- the vLLM loop ---------------------------------------------------------------------------------------

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the vLLM loop from a thread that is not it; wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self, engine_args: dict[str, Any]) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_args)
        self._llm = AsyncLLM.from_engine_args(args)

    def _params(self, prompt: Prompt, opts: SamplingOptions) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        extra: dict[str, Any] = {}
        if prompt.allowed_ids is not None:
            extra[ALLOWED_RUNS_KEY] = id_runs(prompt.allowed_ids)
        return SamplingParams(
            n=1, temperature=opts.temperature, top_k=opts.top_k, top_p=opts.top_p, max_tokens=opts.max_tokens,
            repetition_penalty=opts.repetition_penalty, seed=opts.seed, stop_token_ids=list(self._stop_ids),
            extra_args=extra or None,
            output_kind=RequestOutputKind.DELTA, detokenize=False, skip_special_tokens=False)

    def _prompt(self, ids: Sequence[int]) -> Any:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=list(ids))

    def follow(self, board: DeadlineBoard) -> None:
        """Submit each sentence with its stream's due time as its priority (engine.backends.base
        DeadlineScheduled), where the engine runs vLLM's priority policy."""
        self._deadlines = board
        self._epoch = board.clock()

    def _priority(self, request_id: str) -> dict[str, int]:
        """generate()'s priority argument for a sentence of `request_id`: its stream's deadline key in whole
        milliseconds (vLLM serves smaller first, ties in arrival order); none without a board."""
        board = self._deadlines
        if board is None or not self._by_deadline:
            return {}
        now = board.clock()
        return {"priority": round((board.key(request_of(request_id), now) - self._epoch) * 1000)}

    async def _pump(self, ids: tuple[int, ...], params: Any, vid: str, channel: _Channel,
                    priority: dict[str, int] | None = None) -> None:
        """On the vLLM loop: stream one request into its channel. Cancelled -> generate() aborts it in vLLM."""
        try:
            async for out in self._llm.generate(self._prompt(ids), params, vid, **(priority or {})):
                completion = out.outputs[0]
                channel.push("tokens", list(completion.token_ids), out.finished)
                if out.finished:
                    return
            channel.push("tokens", [], True)
        except asyncio.CancelledError:
            channel.push("end")
            raise
        except BaseException as err:  # noqa: BLE001 - raised again in the consumer
            channel.push("error", err)

    # ---- TokenGenerator --------------------------------------------------------------------------------------

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        """Yield new token ids as vLLM produces them (deltas that arrived together are merged); the stop id, if
        reached, is in the last delta. Leaving the loop early (break, cancel, `abort`) aborts the request."""
        if not prompt.ids:
            raise ValueError("empty prompt")
        if self._llm is None:
            raise GenerationError("the vLLM engine is closed")
        params = self._params(prompt, opts)
        vid = f"{request_id}#{next(self._ids)}"
        loop = asyncio.get_running_loop()
        channel = _Channel(self._waker(loop))
        future = asyncio.run_coroutine_threadsafe(
            self._pump(prompt.ids, params, vid, channel, self._priority(request_id)), self._loop)
        self._live.setdefault(request_id, {})[vid] = future
        finished = False
        try:
            while not finished:
                tokens: list[int] = []
                for kind, payload, last in await channel.take():
                    if kind == "error":
                        raise _request_error(payload)
                    if kind == "end":
                        finished = True
                        break
                    tokens += payload
                    finished = finished or last
                if tokens:
                    yield tokens
        finally:
            live = self._live.get(request_id, {})
            live.pop(vid, None)
            if not live:
                self._live.pop(request_id, None)
            if not finished:
                future.cancel()  # cancels _pump on the vLLM loop: generate() aborts the request there

    def _waker(self, loop: asyncio.AbstractEventLoop) -> _Waker:
        waker = self._wakers.get(id(loop))
        if waker is None or waker.loop is not loop:
            self._wakers = {k: w for k, w in self._wakers.items() if not w.loop.is_closed()}
            waker = self._wakers[id(loop)] = _Waker(loop)
        return waker

    async def abort(self, request_id: str) -> None:
        """Abort every stream with this id (each ends quietly); unknown ids are ignored."""
        for future in list(self._live.get(request_id, {}).values()):
            future.cancel()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_now)

    def close_now(self) -> None:
        """Abort everything, shut the engine core down, stop the vLLM thread (blocking)."""
        for live in list(self._live.values()):
            for future in list(live.values()):
                future.cancel()
        llm, self._llm = self._llm, None
        if llm is not None and self._thread.is_alive():
            try:
                self._call(_shutdown(llm), 60)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        self._stop_thread()

    def _stop_thread(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    # ---- warm-up ---------------------------------------------------------------------------------------------

    def warmup(self, batches: Sequence[int] = WARMUP_BATCHES, tokens: int = 12) -> dict[int, float]:
        """Run `b` concurrent short requests for each b (seeded and unseeded, realistic prompts and sampling), so
        lazy compiles and first-use allocations happen now. Returns seconds per batch size."""
        batches = [b for b in batches if b <= self.max_num_seqs]
        t0 = time.perf_counter()
        self.events(Notice(f"warming up vLLM for {', '.join(map(str, batches))} concurrent streams"))
        for b in batches:
            t = time.perf_counter()
            self._call(self._warm_batch(b, tokens), 600)
            self.warmup_s[b] = time.perf_counter() - t
        self.events(Notice(f"vLLM warm-up done in {time.perf_counter() - t0:.1f} s "
                           f"({', '.join(f'{b}: {s:.2f} s' for b, s in self.warmup_s.items())})"))
        return dict(self.warmup_s)

    async def _warm_batch(self, b: int, tokens: int) -> None:
        async def one(i: int) -> None:
            # plain text ids of a sentence prompt's length (any family's vocabulary has them), then what a speech
            # prompt may generate: the same shapes and sampling path as real requests
            prompt = tuple(1000 + (7 * i + k) % 5000 for k in range(58 + i % 40))
            opts = SamplingOptions(max_tokens=tokens, seed=i if i % 2 == 0 else None)
            params = self._params(Prompt(prompt, self._default_allowed), opts)
            async for _ in self._llm.generate(self._prompt(prompt), params, f"warmup-{b}-{i}-{next(self._ids)}"):
                pass

        await asyncio.gather(*(one(i) for i in range(b)))


async def _shutdown(llm: Any) -> None:
    llm.shutdown()


def _reraise(err: BaseException) -> None:
    mapped = _start_error(err)
    if mapped is err:
        raise err
    raise mapped from err


def _start_error(err: BaseException) -> BaseException:
    """What the factory sees when the engine cannot start: ImportError stays; everything else is one
    GenerationError line (out of memory gets a hint)."""
    if isinstance(err, (ImportError, GenerationError)):
        return err
    text = one_line(err)
    if "memory" in text.lower():
        return GenerationError(f"vLLM could not start: out of GPU memory ({text})")
    return GenerationError(f"vLLM could not start ({text})")


def _request_error(err: BaseException) -> BaseException:
    if isinstance(err, (ValueError, GenerationError)):
        return err
    return GenerationError(f"vLLM failed: {type(err).__name__}: {err}")
