"""Provides the Engine Protocol: what a server needs of an engine (stream a request's audio, its sample rate and
voices, what identifies it, its status, close), so that servers never reach into a Synthesizer's generator or
decoder. `engine.pipeline.Synthesizer` is the in-process engine; `voiceapp.cluster.serve.RayEngine` forwards to engine
replicas on a Ray cluster. Also `device_status`: one device's memory, for an engine's status. Pure (stdlib; torch
only where the process has imported it already)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.deadlines import Verdict

from engine.config import SynthesisRequest
from engine.types import AudioChunk
from engine.voices import Voice

BACKEND_NAMES = {"ScriptedGenerator": "fake", "TorchTokenGenerator": "torch", "VllmTokenGenerator": "vllm"}
"""Generator class -> the --backend value that builds it."""


class Voices(Protocol):
    """What a server reads of an engine's voices (engine.voices.VoiceBank is one)."""

    default: str
    """The voice "" and "default" mean (the family's own)."""

    def all(self) -> dict[str, Voice]:
        """Every voice by name."""
        ...

    def presets(self) -> dict[str, Voice]:
        """The voices the model family ships, not the user's own (engine.voices.preset_slots ranks them)."""
        ...


@runtime_checkable
class Engine(Protocol):
    """An engine a server serves."""

    sample_rate: int
    """Samples per second of every chunk `synthesize` yields."""
    voices: Voices
    """The voices a request may name."""

    def synthesize(self, req: SynthesisRequest,
                   text_stream: AsyncIterable[str] | None = None) -> AsyncGenerator[AudioChunk, None]:
        """The request's audio, chunk by chunk in playback order; text from `text_stream` follows the request's
        own. Raises engine.errors.VoiceError subclasses; closing the iterator aborts the request."""
        ...

    def describe(self) -> dict[str, Any]:
        """What identifies its output (the server's hello): "backend", "model" ({"path", "hash"} or None) and its
        pacing ("paced_start", "paced_windows_s", "paced_ahead_windows_s": engine.pacing)."""
        ...

    def admit(self) -> "Verdict":
        """Whether one more request may start now without pushing a live one into an underrun (front ends ask
        before they start one; engine.deadlines)."""
        ...

    def capacity(self) -> float | None:
        """Streams it carries in real time as far as it knows (None while nothing says)."""
        ...

    def status(self) -> dict[str, Any]:
        """What `voicectl status` shows of it: "devices" (one `device_status` per device it computes on) and
        whatever else it has to say (a graph lane's counters, a cluster's replicas)."""
        ...

    async def close(self) -> None:
        """Free what it holds; requests still running end."""
        ...


def device_status(device: Any) -> dict[str, Any]:
    """One device an engine computes on: {"device": "cuda:1", "name", "used_bytes", "total_bytes",
    "allocated_bytes"} for a CUDA device this process has initialised, {"device": "cpu"} otherwise (CUDA is never
    initialised just to ask)."""
    name = str(device)
    torch = sys.modules.get("torch")
    if not name.startswith("cuda") or torch is None or not torch.cuda.is_initialized():
        return {"device": name}
    dev = torch.device(name)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    return {"device": f"cuda:{index}", "name": torch.cuda.get_device_name(index), "used_bytes": total - free,
            "total_bytes": total, "allocated_bytes": torch.cuda.memory_allocated(index)}


def describe_engine(synth: Any) -> dict[str, Any]:
    """What identifies a Synthesizer's output: backend name, model family and checkpoint (absolute path, hash; None
    for the fake); and
    whether a client should learn its speed before playing a request (`paced_start`) and the windows its sentences
    come in (`paced_windows_s`, and `paced_ahead_windows_s` for a sentence rendered ahead of its turn:
    engine.pacing)."""
    gen = synth.generator
    name = type(getattr(gen, "primary", gen)).__name__  # a LaneRouter is named after the generator behind it
    info = getattr(synth, "model_info", None)  # a RemoteSynthesizer has none
    return {"backend": BACKEND_NAMES.get(name, name), "family": synth.grammar.family,
            "model": ({"path": str(Path(info.root).resolve()), "hash": info.checkpoint_hash}
                      if info is not None else None),
            "paced_start": synth.pacer.probe_first, "paced_windows_s": list(synth.pacer.windows_s),
            "paced_ahead_windows_s": list(synth.pacer.ahead_windows_s)}


def lane_status(generator: Any) -> dict[str, Any]:
    """The graph lane's counters for `voicectl status` ({} when the engine has no lane)."""
    if getattr(generator, "lane", None) is None:
        return {}
    return {"lane": {"on": bool(generator.enabled and not generator.failed), "streams": generator.lane_streams,
                     "handed_over": generator.handoffs, "failed": bool(generator.failed),
                     "fused": bool(getattr(generator.lane, "fused", False))}}
