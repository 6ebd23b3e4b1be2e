"""Provides typed, validated configuration: per-request knobs separate from model and device config."""
from __future__ import annotations

from dataclasses import dataclass, field
from uuid import uuid4

MODEL_ENV = "VOICEAPP_MODEL"
"""The checkpoint folder used when --model is not given."""
QUANTIZE = ("none", "int8", "int4")
"""The CPU LLM's weights: fp32, or int8 / int4 through ONNX Runtime (engine.backends.qwen2_ort; int4 opt-in)."""
DECODER_AUTOTUNE = ("batch1", "all", "none")
"""GPU decoder graphs captured with cuDNN's timed algorithms: batch-1 ones only, all, or none (fixed ones).
See engine.backends.bicodec.BiCodecDecoder._pick_algorithms for what each measured."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


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

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class SynthesisRequest:
    """One thing to say."""

    text: str
    """Raw user text; normalized and split by the synthesizer."""
    voice: str = "default"
    """Voice preset name (see assets/voices)."""
    options: SamplingOptions = field(default_factory=SamplingOptions)
    """Sampling knobs for every sentence of this request."""
    request_id: str = field(default_factory=lambda: uuid4().hex)
    """Unique id carried by every event and chunk of this request."""


def sentence_id(request_id: str, index: int) -> str:
    """The token generator's request id for sentence `index` of a synthesis request."""
    return f"{request_id}-{index}"


def request_of(generator_id: str) -> str:
    """The synthesis request a sentence's generator id belongs to (itself when it is not a sentence id)."""
    head, sep, tail = generator_id.rpartition("-")
    return head if sep and tail.isdigit() else generator_id
