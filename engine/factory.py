"""Provides build_synthesizer(): the ONLY place that picks concrete backends (lazy device imports)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from engine.config import SamplingOptions
from engine.errors import VoiceError
from engine.events import EventSink, Notice, ignore_events
from engine.pipeline import JoinConfig, Synthesizer
from engine.voices import GlobalsCache, VoiceBank
from engine.windowing import WindowSchedule


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to build the engine."""

    model: str | None = None
    """Checkpoint directory; None = VOICEAPP_MODEL, then the Hugging Face cache."""
    backend: str = "auto"
    """Token generator: auto (vLLM on CUDA if installed, else torch) | torch | vllm | fake."""
    device: str = "auto"
    """LLM device for the torch backend: auto | cpu | cuda | mps."""
    decoder_device: str = "auto"
    """BiCodec device: auto (GPU if present) | cpu | cuda."""
    threads: int | None = None
    """CPU threads for torch (None = torch's default)."""
    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    join: JoinConfig = field(default_factory=JoinConfig)
    voices: VoiceBank | None = None
    """Voice bank; None = builtin presets + the user's voices."""
    cache_dir: str | None = None
    """Root of the speaker-globals cache; None = the user cache dir."""

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "torch", "vllm", "fake"):
            raise ValueError(f"unknown backend {self.backend!r}")


def build_synthesizer(config: EngineConfig = EngineConfig(), events: EventSink = ignore_events) -> Synthesizer:
    """Load the model and wire a Synthesizer. Raises VoiceError subclasses with user-facing messages."""
    voices = config.voices or VoiceBank()
    if config.backend == "fake":
        return _build_fake(config, voices, events)
    from engine.model import load_model_info, resolve_model_dir

    info = load_model_info(resolve_model_dir(config.model))
    encode = _load_encoder(info)
    decoder = _build_decoder(info, config)
    generator = _build_generator(info, config, events)
    cache = GlobalsCache(info.checkpoint_hash, root=_path(config.cache_dir))
    synth = Synthesizer(generator, decoder, info.token_ids, encode, voices, cache, schedule=config.schedule,
                        join=config.join, events=events,
                        eager_lookahead=type(generator).__name__ == "VllmTokenGenerator")
    synth.model_info = info  # type: ignore[attr-defined]
    return synth


def _path(p: str | None):
    from pathlib import Path

    return Path(p) if p else None


def _build_fake(config: EngineConfig, voices: VoiceBank, events: EventSink) -> Synthesizer:
    from engine.fakes import ScriptedGenerator, ToneDecoder
    from engine.tokens import TokenIds

    ids = TokenIds()
    return Synthesizer(ScriptedGenerator(ids, delay_s=0.002), ToneDecoder(), ids,
                       lambda text: [ord(c) % 151643 for c in text], voices, None, schedule=config.schedule,
                       join=config.join, events=events)


def _load_encoder(info):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(info.llm_dir))
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _build_decoder(info, config: EngineConfig):
    from engine.backends.bicodec import BiCodecDecoder

    device = config.decoder_device
    if device == "auto":
        device = "cuda" if _cuda() else "cpu"
    return BiCodecDecoder(info.bicodec_dir, device=device, num_threads=config.threads)


def _build_generator(info, config: EngineConfig, events: EventSink):
    backend = config.backend
    if backend in ("auto", "vllm") and _cuda():
        try:
            from engine.backends.vllm_gen import VllmTokenGenerator

            return VllmTokenGenerator(info)
        except (ImportError, VoiceError, RuntimeError) as err:
            if backend == "vllm":
                raise
            events(Notice(f"vLLM unavailable ({str(err).splitlines()[0]}); using the torch generator"))
    from engine.backends.torch_gen import TorchTokenGenerator

    device = None if config.device == "auto" else config.device
    return TorchTokenGenerator(str(info.llm_dir), info.token_ids, device=device, threads=config.threads)
