"""Provides typed, validated configuration: per-request knobs separate from model and device config."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a `say` through a warm server makes a request without reading voices
    from engine.voices import VoiceBank
    from engine.windowing import WindowSchedule

MODEL_ENV = "VOICEAPP_MODEL"
"""The checkpoint folder used when --model is not given."""
QUANTIZE = ("none", "int8", "int4")
"""The CPU LLM's weights: fp32, or int8 / int4 through ONNX Runtime (engine.backends.qwen2_ort; int4 opt-in)."""
DECODER_AUTOTUNE = ("batch1", "all", "none")
"""GPU decoder graphs captured with cuDNN's timed algorithms: batch-1 ones only, all, or none (fixed ones).
See engine.backends.bicodec.BiCodecDecoder._pick_algorithms for how each picks."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


DECODER_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""Codec decoder precisions by name, each with its torch dtype's name (`getattr(torch, ...)`). fp16 has 3 more
mantissa bits than bf16 and a narrower range (up to 65,504); a GPU's tensor cores have the same peak rate for both.
Which one a GPU runs by default is the family's (ModelFamily.gpu_decoder_dtype)."""


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Per-request sampling knobs; defaults are the upstream reference's."""

    temperature: float = 0.8
    """Softmax temperature; 0 means greedy."""
    top_k: int = 50
    """Keep only the k most likely tokens (0 disables)."""
    top_p: float = 0.95
    """Nucleus sampling mass (1.0 disables)."""
    max_tokens: int = 3000
    """Hard cap on generated tokens (3000 semantic tokens = 60 s of audio)."""
    seed: int | None = None
    """Seed for this request's sampler; same seed, prompt and model give the same tokens."""
    repetition_penalty: float = 1.0
    """vLLM's repetition penalty (1.0: none): the logit of every id already in the prompt or drawn is divided by it
    where positive, multiplied by it where not, before temperature (engine.backends.torch_gen.repetition_penalty)."""

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(0 < self.repetition_penalty < math.inf,
               f"repetition_penalty must be a number > 0 (1.0: none), got {self.repetition_penalty}")


@dataclass(frozen=True, slots=True)
class SynthesisRequest:
    """One thing to say."""

    text: str
    """Raw user text; normalized and split by the synthesizer."""
    voice: str = "default"
    """Voice preset name (see assets/voices)."""
    options: SamplingOptions = field(default_factory=SamplingOptions)
    """Sampling knobs for every sentence of this request."""
    request_id: str = field(default_factory=lambda: new_request_id())
    """Unique id carried by every event and chunk of this request."""


def new_request_id() -> str:
    """A fresh request id: 32 random hex digits (os.urandom: the uuid module would import platform, which a `say`
    through a warm server does not need)."""
    return os.urandom(16).hex()


def sentence_id(request_id: str, index: int) -> str:
    """The token generator's request id for sentence `index` of a synthesis request."""
    return f"{request_id}-{index}"


def request_of(generator_id: str) -> str:
    """The synthesis request a sentence's generator id belongs to (itself when it is not a sentence id)."""
    head, sep, tail = generator_id.rpartition("-")
    return head if sep and tail.isdigit() else generator_id


@dataclass(frozen=True, slots=True)
class JoinConfig:
    """How sentences are joined."""

    pause_s: float = 0.18
    """Silence between sentences: a short natural pause."""
    fade_s: float = 0.004
    """Fade at each sentence edge so joins never click (4 ms is below audibility as a fade)."""
    max_sentence_chars: int = 280
    """Longer sentences are split at clause boundaries (what the model handles well)."""


def is_device(name: str, mps: bool = False) -> bool:
    """Whether `name` is a device an engine may be put on: auto, cpu, cuda, cuda:N (and mps where `mps`)."""
    kind, sep, index = name.partition(":")
    if sep:
        return kind == "cuda" and index.isdigit()
    return name in ("auto", "cpu", "cuda") or (mps and name == "mps")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to build the engine."""

    model: str | None = None
    """Checkpoint directory; None = VOICEAPP_MODEL, then the Hugging Face cache."""
    backend: str = "auto"
    """Token generator: auto (vLLM on CUDA if installed, else torch) | torch | vllm | fake."""
    device: str = "auto"
    """Where the engine computes: auto | cpu | cuda | cuda:N | mps. A GPU named by index ("cuda:1") takes the LLM
    (graph lane, torch generator) and, unless `decoder_device` says otherwise, the decoder: one engine per GPU in one
    machine. vLLM takes no device (it runs on the process's current GPU), so an engine on another GPU runs without
    it; a process whose CUDA_VISIBLE_DEVICES names one GPU (a Ray replica) has it as plain "cuda"."""
    decoder_device: str = "auto"
    """Codec decoder device: auto (the engine's GPU if present and not slower than the CPU) | cpu | cuda | cuda:N."""
    decoder_dtype: str = "auto"
    """Codec decoder precision: auto or a DECODER_DTYPES name. auto: on CUDA the family's gpu_decoder_dtype (fp32
    where deterministic); on the CPU bf16 where it multiplies bf16 natively (`cpu_decodes_bf16`) unless `quantize`
    is none, else fp32."""
    threads: int | None = None
    """CPU threads for torch (None = torch's default)."""
    llm_threads: int | None = None
    """Threads of the int8 LLM's own pool (ONNX Runtime), which steps while torch decodes. None with `threads`
    None: `cpu_pools` shares the cores out; else `threads`."""
    quantize: str = "auto"
    """The LLM's weights where the torch generator runs it on the CPU: auto (int8 where ONNX Runtime is installed)
    | none (fp32) | int8 (engine.backends.qwen2_ort, converted once per checkpoint into the user cache, faster
    than fp32 where the step is bound by reading weights) | int4 (the same with 4-bit weights: faster still, opt-in,
    since its agreement with fp32 is outside int8's bound; docs/cpu.md). An LLM on a GPU is never quantised."""
    schedule: WindowSchedule | None = None
    """Streaming decode windows, in the decoder's frames; None: the model family's (ModelFamily.schedule)."""
    join: JoinConfig = field(default_factory=JoinConfig)
    voices: VoiceBank | None = None
    """Voice bank; None = builtin presets + the user's voices."""
    cache_dir: str | None = None
    """Root of the speaker-globals cache; None = the user cache dir."""
    decoder_autotune: str = "none"
    """Which captured GPU decoder graphs get cuDNN's timed (autotuned) algorithms: none (default: cuDNN's fixed
    ones, since the timing is redone in every process and costs start-up) | batch1 (the lone stream's windows) |
    all (every batch, for crowds). See BiCodecDecoder.autotune."""
    lane_rows: int | None = 2
    """Most streams the graph lane steps at once. 2 (default) for the in-process front ends, which serve one
    listener: a request has at most two sentences generating (the one playing and the next), side by side;
    another request meanwhile waits for a row or goes to vLLM. 12 graphs to capture (its decode steps run the
    fused kernels: one graph per row count) and 0.1 GB of KV cache. None sizes the lane to the GPU for crowds
    (`voicectl serve`, the bench): the largest row bucket whose KV cache fits the family's share of its memory
    (`rows_for`, ModelFamily.lane; up to 512 rows on a large data-centre GPU), with a graph to capture for every
    row bucket, so a longer start-up."""
    graph_lane: bool = True
    """With vLLM: streams run on an in-process CUDA-graph copy of the LLM (engine.backends.graph_gen), each
    stream's sentences as rows of one batch whose step is one graph launch instead of a vLLM engine step; a lane
    of 32 rows or more keeps every stream (the rest wait for a row), a smaller one hands its streams to vLLM once
    vLLM is busy. A `deterministic` engine has a lane of its own kind (see there)."""
    deterministic: bool = False
    """Same bytes for a sentence whatever else runs beside it and in whichever process (export, --resume). On a GPU:
    a graph lane of fixed shapes (GraphLane `fixed_shapes`: plain tensor code, nothing compiled or autotuned, so
    the kernels are chosen alike in every process) in front of the torch generator for what it cannot take, never
    vLLM (its batches change a sentence's arithmetic); the decoder with cuDNN's fixed algorithms and no graphs
    (an export decodes whole sentences). On the CPU: the torch generator, which steps each request alone."""
    one_listener: bool = False
    """The front end serves one listener (`say`, the TUI, piped text). With backend auto and the graph lane on a
    GPU, the lane's rows carry everything it hears, so vLLM, which would only lengthen start-up, is not started.
    The torch generator stands behind the lane for what the lane cannot take; the lane never hands a stream over
    to it."""
    freeze_heap: bool = True
    """Once the engine is loaded, hide what the process holds from the cyclic garbage collector (gc.freeze). A
    full collection otherwise walks every object of torch, transformers and vLLM with all threads stopped, long
    enough to leave the graph lane's stream empty under a first crowd of streams. Objects created later are
    collected as ever."""
    warm_up: bool | None = None
    """Before the engine is handed over, one short untimed request runs through it (Synthesizer.warm_up), so that
    the first request a user hears does not pay the process's first-use costs, for a little start-up.
    None: where the decoder runs on the GPU (on the CPU a request's compute dwarfs those costs, and the warm-up
    would cost a CPU machine seconds of start-up)."""

    def __post_init__(self) -> None:
        for name in ("device", "decoder_device"):
            if not is_device(getattr(self, name), mps=name == "device"):
                raise ValueError(f"unknown {name} {getattr(self, name)!r} (auto, cpu, cuda or cuda:N)")
        if self.backend not in ("auto", "torch", "vllm", "fake"):
            raise ValueError(f"unknown backend {self.backend!r}")
        if self.quantize not in ("auto", *QUANTIZE):
            raise ValueError(f"unknown quantize {self.quantize!r}")
        if self.decoder_dtype not in ("auto", *DECODER_DTYPES):
            raise ValueError(f"unknown decoder dtype {self.decoder_dtype!r}")
        if self.decoder_autotune not in DECODER_AUTOTUNE:
            raise ValueError(f"unknown decoder autotune policy {self.decoder_autotune!r}")
        if self.lane_rows is not None and self.lane_rows < 1:
            raise ValueError(f"lane_rows must be at least 1, not {self.lane_rows}")
