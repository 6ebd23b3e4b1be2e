"""Provides TorchTokenGenerator: a KV-cached transformers loop (prefill + decode_one_token) behind TokenGenerator.

The fallback backend when vLLM is not available (CPU, Apple, small GPUs). One request = one DynamicCache; every
forward pass runs on a single-worker executor owned by the generator, so the event loop never blocks and device
calls stay serialized while several streams interleave token by token. With int8 (or int4) weights on the CPU,
requests' caches are rows of one shared buffer (`rows`), and the decode steps of the requests live at once run as
one forward: a step reads every weight once, however many rows it carries.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, cast

import torch
from engine.backends.qwen2_checkpoint import Qwen2Weights, read_config
from engine.backends.qwen2_static import StaticQwen2
from engine.backends.qwen2_static import supported as static_supported
from engine.config import QUANTIZE, SamplingOptions
from engine.errors import GenerationError, MissingExtra, ModelFormatError, ModelNotFound
from engine.events import EventSink, Notice, ignore_events
from engine.prompt import Prompt
from engine.rows import Asked, RowSteps, consecutive
from engine.tokens import TokenIds

if TYPE_CHECKING:
    from engine.backends.qwen2_ort import OrtQwen2


def pick_device() -> torch.device:
    """cuda if available, else mps, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device: torch.device) -> torch.dtype:
    """bf16 on cuda, fp32 elsewhere. Never fp16: Spark's LLM produces garbage in fp16."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32



TRANSFORMERS_EXTRA = "pip install 'voiceapp[transformers]'"
"""How to add transformers: an optional extra, left out of the user install on a CPU, where the LLM's weights and
tokenizer are read without it."""

STATIC_CACHE_STEP = 256
"""Positions a request's static cache holds beyond its prompt at first; it doubles when a stream outgrows it."""
ROWS_GRACE_S = 0.003
"""How long a waiting row step waits for the other requests of the shared rows to ask for theirs: they ask within
an event-loop turn of their last token, so this bounds only a consumer that stopped reading (well under a step)."""


# ---- sampling (pure functions on a 1-D logits vector) -------------------------------------------------------

def top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates surviving top-k then top-p, most likely first: (logits [K], vocab ids [K]).

    top_k 0 disables top-k, top_p 1.0 disables top-p. Top-p keeps the smallest prefix whose probability mass
    reaches top_p, and always at least the most likely token. Filtering the top-k first means the sort and
    softmax run over k values, not the whole 166k vocabulary.
    """
    if top_k and top_k < logits.numel():
        values, indices = torch.topk(logits, top_k)  # sorted, descending
    elif top_p < 1.0:
        values, indices = torch.sort(logits, descending=True)
    else:
        return logits, torch.arange(logits.numel(), device=logits.device)
    if top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # [K]: mass of strictly more likely candidates
        keep = mass_before < top_p
        keep[0] = True
        values, indices = values[keep], indices[keep]
    return values, indices


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float | torch.Tensor) -> torch.Tensor:
    """`logits` with vLLM's repetition penalty applied (upstream Orpheus samples through vLLM): where `seen` (a bool
    mask of `logits`' shape: the ids in the prompt or drawn so far, each counted once however often) is set, a
    positive logit is divided by `penalty` and any other multiplied by it; elsewhere, and with `penalty` 1.0, the
    logit is left exactly as it is. `penalty`: a number, or per row ([B, 1] for logits [B, A]). The same rule as
    transformers' RepetitionPenaltyLogitsProcessor. It comes before temperature, top-k and top-p, as in vLLM's
    sampler; a masked (-inf) logit stays -inf. Pure: the torch generator and the graph lane (inside its captured
    steps) both apply it."""
    scale = torch.where(seen, penalty, 1.0)
    return torch.where(logits > 0, logits / scale, logits * scale)


def sample_token(logits: torch.Tensor, opts: SamplingOptions, generator: torch.Generator) -> int:
    """Pick the next id from (already masked) logits [V]: greedy at temperature 0, else top-k/top-p multinomial."""
    if opts.temperature == 0:
        return int(torch.argmax(logits))
    values, indices = top_k_top_p(logits / opts.temperature, opts.top_k, opts.top_p)
    probs = torch.softmax(values, dim=-1)
    choice = torch.multinomial(probs, 1, generator=generator)
    return int(indices[choice])


def _static_from_checkpoint(path: Path, device: torch.device, dtype: torch.dtype) -> StaticQwen2:
    """StaticQwen2 over a checkpoint's LLM weights, read without transformers."""
    weights = Qwen2Weights.from_checkpoint(path)
    try:
        return StaticQwen2(weights, weights.config.max_position_embeddings, device, dtype, own_cache=False)
    except (RuntimeError, ValueError) as err:  # tensors of the wrong shape or count: one user-facing line
        raise ModelFormatError(f"cannot load the LLM from {path}: {err}") from err


# ---- the generator -------------------------------------------------------------------------------------------

@dataclass(slots=True, eq=False)
class _Request:
    """Per-stream state, owned by one `stream()` call and dropped when it ends."""

    opts: SamplingOptions
    generator: torch.Generator
    """This request's RNG: same seed -> same ids, however streams interleave."""
    allowed: torch.Tensor | None
    """Allowed vocabulary ids [A] (None = whole vocabulary); logits are computed for these rows only."""
    head: Any
    """Output-embedding rows of the allowed ids [A, H]: 8195 of 166000 rows for globals-prefixed prompts,
    which removes ~95% of the LM-head work per step (the head is a third of the 0.5B model's FLOPs). With int8
    weights, a callable hidden -> logits over those rows (qwen2_ort.OrtHead)."""
    seen: torch.Tensor | None = None
    """Which of the logits' ids (allowed ids, or the vocabulary) the prompt holds or were drawn: the repetition
    penalty's mask; None where the request has no penalty (1.0)."""
    cache: Any = None
    """A transformers DynamicCache, a _StaticCache, or a _RowCache (a row of the shared rows)."""
    pos: int = 0
    """Position of the next token to feed (= tokens in the cache)."""
    aborted: bool = False


@dataclass(slots=True, eq=False)
class _StaticCache:
    """One request's keys and values for the static forward; grows (doubling) as the stream gets longer."""

    keys: torch.Tensor
    values: torch.Tensor

    def fit(self, length: int, model: StaticQwen2 | OrtQwen2) -> tuple[torch.Tensor, torch.Tensor]:
        axis = getattr(model, "cache_axis", 2)  # positions: [layers, kv, positions, D] in StaticQwen2's caches
        self.keys, self.values = _grown(self.keys, self.values, length, axis, model.new_cache)
        return self.keys, self.values


def _grown(keys: torch.Tensor, values: torch.Tensor, length: int, axis: int,
           new: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`keys` and `values` where they hold `length` positions along `axis`; else new ones from `new(positions)`, of
    twice their positions (at least `length`), with what they held copied in."""
    capacity = keys.shape[axis]
    if length <= capacity:
        return keys, values
    grown = new(max(length, 2 * capacity))
    for old, fresh in zip((keys, values), grown):
        fresh.narrow(axis, 0, capacity).copy_(old)
    return grown


_Step = tuple[int, asyncio.Future[int | None]]
"""What a row step needs of its request: its last token, and where its next token goes."""


class _SharedRows:
    """The caches of up to `rows` requests side by side ([layers, rows, kv, C, D] each, OrtQwen2.new_rows), one slot
    per request: requests in consecutive slots step as one forward (OrtQwen2.forward_rows). When a request outgrows
    the positions, they double for every row. Who holds which slot and who steps in the next forward is `steps`'
    decision (engine.rows, shared with the graph lane's scheduler); the generator runs what it decides."""

    def __init__(self, rows: int) -> None:
        self.steps: RowSteps[_Request, _Step] = RowSteps(rows)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def fit(self, length: int, model: OrtQwen2) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of every row, holding at least `length` positions."""
        def new(positions: int) -> tuple[torch.Tensor, torch.Tensor]:
            return model.new_rows(len(self.steps.table), positions)

        if self.keys is None or self.values is None:
            self.keys, self.values = new(length)
        else:
            self.keys, self.values = _grown(self.keys, self.values, length, 3, new)
        return self.keys, self.values


@dataclass(slots=True, eq=False)
class _RowCache:
    """One request's cache as a slot of the shared rows."""

    rows: _SharedRows
    slot: int = -1

    def fit(self, length: int, model: OrtQwen2) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.rows.fit(length, model)
        return keys[:, self.slot], values[:, self.slot]

    def release(self, req: _Request | None = None) -> None:
        """Its slot is free, and (`req` given) no row step waits for that request."""
        if req is None:
            self.rows.steps.table.free(self.slot, self)
        else:
            self.rows.steps.leave(req, self.slot, self)


def import_transformers(needed_for: str) -> Any:
    """The transformers package, or one line naming its extra where this install lacks it."""
    try:
        import transformers
    except ImportError:
        raise MissingExtra(f"{needed_for} needs transformers, which is not installed here: "
                           f"{TRANSFORMERS_EXTRA}") from None
    return transformers


class TorchTokenGenerator:
    """TokenGenerator over a transformers causal LM with an explicit KV-cached incremental loop."""

    def __init__(self, model_or_dir: Any, token_ids: TokenIds, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, threads: int | None = None,
                 lazy: bool = False, quantize: str = "none", quantized_dir: Path | None = None,
                 events: EventSink = ignore_events, llm_threads: int | None = None,
                 llm_spins: bool = False, rows: int = 1) -> None:
        """`model_or_dir`: a checkpoint folder (on the CPU, read straight into the static forward; elsewhere
        transformers' model) or a transformers model (stepped through its own forward, as given).
        `lazy`: load the model on the first request, not now (a fallback most processes never use).
        `quantize` "int8" (or "int4"): a checkpoint on the CPU steps through ONNX Runtime with quantised weights
        (engine.backends.qwen2_ort), converted once into `quantized_dir` (one folder per checkpoint); `events` hears
        the conversion's progress and which forward was picked; `llm_threads` sizes ONNX Runtime's pool (None:
        torch's thread count) and `llm_spins` lets it spin between kernels (factory.cpu_pools). `rows`: with int8
        (or int4) weights, the most requests whose decode steps run as one forward (1: each alone, so that a
        request's tokens never depend on what steps beside it: a batch's rows round differently)."""
        if quantize not in QUANTIZE:
            raise ValueError(f"quantize must be one of {QUANTIZE}, not {quantize!r}")
        if threads is not None:
            torch.set_num_threads(threads)
        if dtype == torch.float16:
            raise ValueError("float16 is not supported (Spark's LLM needs bf16 or fp32)")
        self.device = torch.device(device) if device is not None else pick_device()
        self.token_ids = token_ids
        self._stop_ids = token_ids.stop_ids
        self.model: Any = None
        """The transformers model, where steps run through its forward (None where `static` holds the weights)."""
        self.static: StaticQwen2 | OrtQwen2 | None = None
        """The model as engine.backends.qwen2_static runs it: fused projections over per-request caches, faster
        than transformers' forward, for a checkpoint on the CPU: read straight into it (transformers is never
        imported). With `quantize` int8, the same steps through qwen2_ort.OrtQwen2 (docs/cpu.md)."""
        self.quantize, self._quantized_dir, self.events = quantize, quantized_dir, events
        self._llm_threads, self._llm_spins = llm_threads, llm_spins
        self._source: tuple[Any, torch.dtype | None] | None = (model_or_dir, dtype)
        """What to load (the constructor's arguments), until loaded."""
        self._loaded = False
        self._rows = rows
        self._shared: _SharedRows | None = None
        """The shared rows, where requests step together (`rows` > 1 with int8 or int4 weights)."""
        self._heads: dict[tuple[int, ...], tuple[torch.Tensor, Any]] = {}
        if not lazy:
            self._load_once()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-gen")
        self._requests: dict[str, list[_Request]] = {}
        """Live streams by request id (a list: a reused id must not make a stream unabortable)."""
        self._grace: asyncio.TimerHandle | None = None
        self._dropping = threading.RLock()
        """A request's cache is set on the worker and dropped on the event loop: one at a time, or a slot could be
        lost."""

    def _load_once(self) -> None:
        """Load the model (once) as the constructor's arguments asked."""
        if self._loaded or self._source is None:
            return
        model_or_dir, dtype = self._source
        owned = isinstance(model_or_dir, (str, Path))
        # a checkpoint we load ourselves, on the CPU, in an architecture the static forward runs
        static = owned and self.device.type == "cpu" and static_supported(read_config(Path(model_or_dir)))
        int8 = self._quantized_from_checkpoint(model_or_dir) if self.quantize != "none" else None
        if int8 is not None:
            self.static, self.dtype = int8, torch.float32
        elif static:
            self.dtype = dtype or pick_dtype(self.device)
            self.static = _static_from_checkpoint(Path(model_or_dir), self.device, self.dtype)
        else:
            self.model = self._load(model_or_dir, dtype)
            self.dtype = self.model.dtype
        self._vocab_size = (self.static.vocab_size if self.static is not None
                            else self.model.get_output_embeddings().weight.shape[0])
        if self.static is not None:  # the restricted head every Spark request asks for, built before the first one
            self._restricted_head(self.token_ids.audio_ids)
        if self._rows > 1 and self.quantize != "none":
            self._shared = _SharedRows(self._rows)
        if self.device.type == "cpu" and owned:
            self.events(Notice(f"LLM on the CPU: {self.llm_path()}"))
            if self.quantize == "int4":
                self.events(Notice("int4 weights are not checked against the model's own: if speech sounds wrong, "
                                   "use --quantize int8"))
        self._source, self._loaded = None, True

    def _quantized_from_checkpoint(self, model_or_dir: Any) -> OrtQwen2 | None:
        """The int8 (or int4) model of a checkpoint on the CPU, converted on first use (progress and the outcome as
        notices); None (and `quantize` none) where the conversion cannot be written."""
        from engine.backends import qwen2_ort

        q = self.quantize
        if not isinstance(model_or_dir, (str, Path)) or self.device.type != "cpu" or self._quantized_dir is None:
            raise ValueError(f"quantize {q} needs a checkpoint directory, the CPU and a quantized_dir")
        llm_dir = Path(model_or_dir)
        if not static_supported(read_config(llm_dir)):
            raise ModelFormatError(f"the LLM in {llm_dir} is not Spark's Qwen2: no {q} path (--quantize none)")
        path = qwen2_ort.cached_path(self._quantized_dir, q)
        if path.is_file() and not qwen2_ort.intact(path):  # truncated, altered, or from before digests
            self.events(Notice(f"the {q} LLM {path.name} in {path.parent} does not match its digest; "
                               f"converting it again"))
            path.unlink(missing_ok=True)
        if not path.is_file():
            t0 = time.perf_counter()
            self.events(Notice(f"converting the LLM to {q} for the CPU (once for this checkpoint) into {path.parent}"))
            try:
                qwen2_ort.convert(llm_dir, path, progress=self._conversion_progress, quantize=q)
            except OSError as err:  # a read-only or full cache folder: fp32 still works
                self.events(Notice(f"cannot write the {q} LLM ({err.strerror or err}); it computes in fp32"))
                self.quantize = "none"
                return None
            self.events(Notice(f"LLM converted to {q} in {time.perf_counter() - t0:.1f} s"))
        return qwen2_ort.load(path, llm_dir, threads=self._llm_threads or torch.get_num_threads(),
                              spin=self._llm_spins)

    def llm_path(self) -> str:
        """How the LLM computes, in words (for notices and a deterministic export's platform)."""
        if self.quantize != "none":
            from engine.backends import qwen2_ort

            return qwen2_ort.describe(self.quantize)
        kind = "static forward" if self.static is not None else "transformers forward"
        return f"{str(self.dtype).removeprefix('torch.')} weights, {kind}"

    def _conversion_progress(self, done: int, total: int) -> None:
        """A notice at each quarter of the layers converted."""
        if done < total and done * 4 // total != (done - 1) * 4 // total:
            self.events(Notice(f"converting the LLM to {self.quantize}: {done} of {total} layers"))

    def _load(self, model_or_dir: Any, dtype: torch.dtype | None) -> torch.nn.Module:
        if isinstance(model_or_dir, (str, Path)):
            path = Path(model_or_dir)
            if not (path / "config.json").is_file():
                raise ModelNotFound(f"no LLM checkpoint (config.json) in {path}; download the model first")
            transformers = import_transformers(f"the LLM on {self.device.type} (transformers' forward)")
            transformers.utils.logging.disable_progress_bar()  # the engine never prints; front ends show progress
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or pick_dtype(self.device))
            except Exception as e:  # missing shards, bad safetensors, unknown architecture: one user-facing error
                raise ModelFormatError(f"cannot load the LLM from {path}: {e}") from e
        else:
            model = model_or_dir
            if model.dtype == torch.float16 and dtype is None:
                raise ValueError("float16 is not supported (Spark's LLM needs bf16 or fp32)")
        model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        return model.eval()

    # -- the two forward passes (gpt-fast shape); run on the worker thread ----------------------------------

    @property
    def concurrent_streams(self) -> bool:
        """Requests step together (the shared rows): a second stream costs the first little, so the pipeline may
        start a sentence's next one beside it (Synthesizer's eager_lookahead)."""
        return self._shared is not None

    @torch.inference_mode()
    def prefill(self, prompt_ids: tuple[int, ...] | list[int],
                head: Any = None) -> tuple[torch.Tensor, Any]:
        """Run the whole prompt; return the last position's logits (fp32; [V], or [A] over `head`'s rows)
        and the filled cache (a slot of the shared rows while one is free)."""
        if self.static is not None:
            n = len(prompt_ids)
            cache = self._new_cache(n + STATIC_CACHE_STEP)
            ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
            positions = torch.arange(n, device=self.device)
            try:
                kv = cache.fit(n, self._row_model) if isinstance(cache, _RowCache) else cache.fit(n, self.static)
                hidden = self.static.forward(ids, positions, n, kv)[-1]
            except BaseException:
                if isinstance(cache, _RowCache):
                    cache.release()
                raise
            return self._logits(hidden, head), cache
        from transformers import DynamicCache

        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)  # [1, S]
        dynamic = DynamicCache(config=self.model.config)
        return self._forward(input_ids, None, dynamic, head), dynamic

    @torch.inference_mode()
    def decode_one_token(self, last_id: int, cache: Any, pos: int,
                         head: Any = None) -> torch.Tensor:
        """Feed one token at position `pos` (appending to `cache` in place); return the next logits (fp32)."""
        if self.static is not None:
            ids = torch.tensor([last_id], dtype=torch.long, device=self.device)
            positions = torch.tensor([pos], dtype=torch.long, device=self.device)
            hidden = self.static.forward(ids, positions, pos + 1, cache.fit(pos + 1, self.static))[0]
            return self._logits(hidden, head)
        input_ids = torch.tensor([[last_id]], dtype=torch.long, device=self.device)  # [1, 1]
        position_ids = torch.tensor([[pos]], dtype=torch.long, device=self.device)  # [1, 1]
        return self._forward(input_ids, position_ids, cache, head)

    @property
    def _row_model(self) -> OrtQwen2:
        """The model of the shared rows: they exist with int8 or int4 weights only (qwen2_ort.OrtQwen2)."""
        return cast("OrtQwen2", self.static)

    @property
    def _static_model(self) -> StaticQwen2 | OrtQwen2:
        """The model of the static forward (or int8 steps), where the generator runs one."""
        if self.static is None:
            raise RuntimeError("this generator runs the transformers forward: it has no static model")
        return self.static

    def _new_cache(self, length: int) -> _StaticCache | _RowCache:
        """A slot of the shared rows while one is free, else a cache of its own (the request steps alone)."""
        shared = self._shared
        if shared is not None:
            cache = _RowCache(shared)
            slot = shared.steps.seat(cache)
            if slot is not None:
                cache.slot = slot
                shared.fit(length, self._row_model)
                return cache
        return _StaticCache(*self._static_model.new_cache(length))

    def _logits(self, hidden: torch.Tensor, head: Any) -> torch.Tensor:
        if callable(head):  # OrtQwen2's int8 rows
            return head(hidden)
        weight = self._static_model.output if head is None else head
        return (weight @ hidden).float()

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, cache: Any,
                 head: torch.Tensor | None) -> torch.Tensor:
        if head is None:
            out = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)
            return out.logits[0, -1].float()
        hidden = self.model.base_model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                                       use_cache=True).last_hidden_state[0, -1]  # [H]
        return (head @ hidden).float()  # [A]

    def _next(self, req: _Request, logits: torch.Tensor) -> int:
        if req.seen is not None:
            logits = repetition_penalty(logits, req.seen, req.opts.repetition_penalty)
        token = sample_token(logits, req.opts, req.generator)
        if req.seen is not None:
            req.seen[token] = True
        return int(req.allowed[token]) if req.allowed is not None else token

    @torch.inference_mode()
    def _first_step(self, req: _Request, prompt_ids: tuple[int, ...]) -> int | None:
        logits, cache = self.prefill(prompt_ids, req.head)
        with self._dropping:
            if req.aborted:  # its stream ended while the prompt ran: the cache (a slot, maybe) goes now
                req.cache = cache
                self._drop(req)
                return None
            req.cache, req.pos = cache, len(prompt_ids)
        return self._next(req, logits)

    @torch.inference_mode()
    def _step(self, req: _Request, last_id: int) -> int | None:
        cache = req.cache
        if req.aborted or cache is None:  # aborted while this job waited in the queue: no forward pass
            return None
        logits = self.decode_one_token(last_id, cache, req.pos, req.head)
        req.pos += 1
        return self._next(req, logits)

    @torch.inference_mode()
    def _step_rows(self, steps: list[tuple[_Request, int]]) -> list[int | None]:
        """Each request's next token (None where it was aborted meanwhile): those in consecutive slots of the shared
        rows as one forward, one alone as `_step`."""
        tokens: list[int | None] = [None] * len(steps)
        caches = [req.cache for req, _ in steps]  # a stream's end may drop one meanwhile (on the event loop)
        live = [i for i, cache in enumerate(caches) if isinstance(cache, _RowCache) and not steps[i][0].aborted]
        for run in consecutive(live, lambda i: cast(_RowCache, caches[i]).slot):
            if len(run) == 1:
                tokens[run[0]] = self._step(*steps[run[0]])
                continue
            reqs = [steps[i][0] for i in run]
            first, spans = caches[run[0]].slot, [req.pos + 1 for req in reqs]
            keys, values = caches[run[0]].rows.fit(max(spans), self.static)
            ids = torch.tensor([steps[i][1] for i in run], dtype=torch.long)
            rows = slice(first, first + len(run))
            hidden = self._row_model.forward_rows(ids, spans, (keys[:, rows], values[:, rows]))
            for i, req, logits in zip(run, reqs, self._row_logits(hidden, reqs)):
                req.pos += 1
                tokens[i] = self._next(req, logits)
        return tokens

    def _row_logits(self, hidden: torch.Tensor, reqs: list[_Request]) -> list[torch.Tensor]:
        """Each row's logits: one call of the head where every row restricts it alike (one read of its rows)."""
        head = reqs[0].head
        if callable(head) and all(req.head is head for req in reqs):
            return list(head(hidden))
        return [self._logits(h, req.head) for h, req in zip(hidden, reqs)]

    def _restricted_head(self, allowed_ids: tuple[int, ...]) -> tuple[torch.Tensor, Any]:
        """(ids [A], output-embedding rows [A, H]) for an allowed set, cached per set."""
        cached = self._heads.get(allowed_ids)
        if cached is None:
            if not allowed_ids or min(allowed_ids) < 0 or max(allowed_ids) >= self._vocab_size:
                raise ValueError(f"allowed_ids must be non-empty ids in 0..{self._vocab_size - 1}")
            ids = torch.tensor(allowed_ids, dtype=torch.long, device=self.device)
            if self.static is not None:
                cached = (ids, self.static.head_rows(ids))
            else:
                cached = (ids, self.model.get_output_embeddings().weight.index_select(0, ids).contiguous())
            self._heads[allowed_ids] = cached
        return cached

    # -- TokenGenerator ---------------------------------------------------------------------------------------

    def _new_request(self, prompt: Prompt, opts: SamplingOptions) -> _Request:
        generator = torch.Generator(device=self.device)
        if opts.seed is None:
            generator.seed()
        else:
            generator.manual_seed(opts.seed)
        allowed = head = None
        if prompt.allowed_ids is not None:
            allowed, head = self._restricted_head(tuple(prompt.allowed_ids))
        seen = None if opts.repetition_penalty == 1.0 else self._seen(prompt.ids, allowed)
        return _Request(opts=opts, generator=generator, allowed=allowed, head=head, seen=seen)

    def _seen(self, prompt_ids: tuple[int, ...], allowed: torch.Tensor | None) -> torch.Tensor:
        """The repetition penalty's mask over a request's logits ([A] for `allowed`, else [V]) with its prompt's ids
        set (a prompt id outside the allowed set has no logit to penalise)."""
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        if allowed is not None:
            return torch.isin(allowed, ids)
        seen = torch.zeros(self._vocab_size, dtype=torch.bool, device=self.device)
        seen[ids] = True
        return seen

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        """Yield `[id]` as each token is sampled; the stop id (if reached) is the last delta.

        Tokens are computed on demand: nothing runs ahead of the consumer, so when it stops iterating
        (break + aclose, task cancelled) or `abort()` is called, at most the one forward pass already
        in flight completes, and its token is dropped.
        """
        if not prompt.ids:
            raise ValueError("empty prompt")
        loop = asyncio.get_running_loop()
        if not self._loaded:
            await loop.run_in_executor(self._executor, self._load_once)
        req = self._new_request(prompt, opts)
        self._requests.setdefault(request_id, []).append(req)
        try:
            token = await self._run(loop, self._first_step, req, prompt.ids)
            if isinstance(req.cache, _RowCache):
                req.cache.rows.steps.join(req)
            for generated in range(1, opts.max_tokens + 1):
                if req.aborted or token is None:
                    return
                yield [token]
                if token in self._stop_ids or generated == opts.max_tokens:
                    return
                token = await self._decode(loop, req, token)
        finally:
            self._drop(req)
            self._forget(request_id, req)
            self._launch_rows(loop)  # the others' steps no longer wait for this one

    async def _run(self, loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> Any:
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except RuntimeError as e:
            raise self._failure(e) from e

    def _failure(self, error: BaseException) -> BaseException:
        """What a forward pass's error becomes for the stream: out of memory as GenerationError."""
        if isinstance(error, RuntimeError) and "out of memory" in str(error).lower():
            return GenerationError(f"out of memory while generating tokens on {self.device}")
        return error

    async def _decode(self, loop: asyncio.AbstractEventLoop, req: _Request, token: int) -> int | None:
        """The request's next token after `token`: in the shared rows, stepped with the other requests'
        (`_launch_rows`); else alone."""
        cache = req.cache
        if not isinstance(cache, _RowCache):
            return await self._run(loop, self._step, req, token)
        waiter: asyncio.Future[int | None] = loop.create_future()
        cache.rows.steps.ask(req, (token, waiter))
        self._launch_rows(loop)
        return await waiter

    def _launch_rows(self, loop: asyncio.AbstractEventLoop, grace_over: bool = False) -> None:
        """Run the row steps the shared rows' scheduler picks (engine.rows.RowSteps: once every request stepping in
        them asked, or ROWS_GRACE_S after the first asked) as one job on the worker; start the grace timer where
        they wait for it."""
        if grace_over:
            self._grace = None
        if self._shared is None:
            return
        steps = self._shared.steps
        batch = steps.next_forward(grace_over)
        if batch is None:
            if steps.waits() and self._grace is None:
                self._grace = loop.call_later(ROWS_GRACE_S, self._launch_rows, loop, True)
            return
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        job = loop.run_in_executor(self._executor, self._step_rows,
                                   [(asked.request, asked.payload[0]) for asked in batch])
        job.add_done_callback(lambda done: self._rows_done(loop, batch, done))

    def _rows_done(self, loop: asyncio.AbstractEventLoop, batch: list[Asked[_Request, _Step]],
                   job: asyncio.Future) -> None:
        """Hand each waiting stream its token (or the step's error), then run the steps asked for meanwhile."""
        if self._shared is not None:
            self._shared.steps.done()
        error = job.exception() if not job.cancelled() else asyncio.CancelledError()
        for i, waiter in enumerate(asked.payload[1] for asked in batch):
            if waiter.done():  # its stream was cancelled while it waited
                continue
            if error is not None:
                waiter.set_exception(self._failure(error))
            else:
                waiter.set_result(job.result()[i])
        self._launch_rows(loop)

    def _drop(self, req: _Request) -> None:
        """End a request: no more forward passes, its cache (or slot of the shared rows) freed now."""
        with self._dropping:
            cache, req.aborted, req.cache = req.cache, True, None
        if isinstance(cache, _RowCache):
            cache.release(req)

    def _forget(self, request_id: str, req: _Request) -> None:
        live = self._requests.get(request_id, [])
        if req in live:
            live.remove(req)
        if not live:
            self._requests.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Stop the stream(s) with this id: each ends before its next forward pass; caches are dropped now."""
        for req in self._requests.get(request_id, []):
            self._drop(req)

    async def close(self) -> None:
        """Abort every stream and stop the worker thread (waits for the forward pass in flight)."""
        for live in self._requests.values():
            for req in live:
                self._drop(req)
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)


async def measure_throughput(gen: Any, prompt: Prompt, n_tokens: int, seed: int = 0) -> float:
    """Decode rate in tokens/s of one `n_tokens` stream, after a 2-token warm-up stream.

    Timed from the first token to the last, so the prefill (time to first token) is not in the rate.
    Stop ids are not special-cased: a real model may stop early; the rate uses the tokens that came out.
    """
    async for _ in gen.stream(prompt, SamplingOptions(max_tokens=2, seed=seed), "throughput-warmup"):
        pass
    count, first = 0, 0.0
    async for delta in gen.stream(prompt, SamplingOptions(max_tokens=n_tokens, seed=seed), "throughput"):
        if count == 0:
            first = time.perf_counter()
        count += len(delta)
    elapsed = time.perf_counter() - first
    if count < 2 or elapsed <= 0:
        raise ValueError("need at least 2 generated tokens to measure a decode rate")
    return (count - 1) / elapsed
