"""Provides describe_platform(): what a deterministic engine's bytes depend on besides the checkpoint and the
settings (export manifests record it). Imports torch only where an engine already did."""
from __future__ import annotations

from typing import Any


def config_dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def describe_platform(synth: Any) -> str:
    """What a deterministic engine's bytes depend on besides the checkpoint and the settings: where the LLM and the
    decoder compute and the versions of what computes there, e.g. "cuda <GPU name> sm90, driver <version>, CUDA
    <version>, cuDNN <version>, torch <version>, lane 128x2048" or "cpu x86_64 AVX512, 2 threads, torch <version>"."""
    import platform
    import sys

    if "torch" not in sys.modules:  # the fake engine
        return "fake"
    import torch

    parts = []
    gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    if gpu:
        major, minor = torch.cuda.get_device_capability()
        parts += [f"cuda {torch.cuda.get_device_name()} sm{major}{minor}", f"driver {_nvidia_driver()}",
                  f"CUDA {torch.version.cuda}", f"cuDNN {torch.backends.cudnn.version()}"]
    if not gpu or not str(synth.decoder.device).startswith("cuda"):  # the CPU computes too
        parts += [f"cpu {platform.machine()} {torch.backends.cpu.get_cpu_capability()}",
                  f"{torch.get_num_threads()} threads"]
        decoder_dtype = _decoder_dtype(synth)
        if decoder_dtype != torch.float32:  # fp32 (left unsaid, as before) renders other bytes
            parts.append(f"decoder {config_dtype_name(decoder_dtype)}")
    if getattr(synth.generator, "quantize", "none") != "none":  # fp32 (left unsaid, as before) renders other bytes
        parts.append(f"LLM {synth.generator.llm_path()}")
    parts.append(f"torch {torch.__version__}")
    from engine.factory import _lanes

    parts += [f"lane {lane.rows}x{lane.max_len}" for lane in _lanes(synth.generator)]
    return ", ".join(parts)


def _decoder_dtype(synth: Any):
    import torch

    return getattr(synth.decoder, "dtype", torch.float32)  # a decoder without a dtype computes in fp32


def _nvidia_driver() -> str:
    """The NVIDIA driver's version (Linux: from /proc), else the CUDA driver API version torch reports."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
        return next(w for w in words if w[:1].isdigit() and w.count(".") >= 1)
    except (OSError, StopIteration):
        import torch

        return f"API {torch._C._cuda_getDriverVersion()}"  # type: ignore[attr-defined]  # private: not in torch's stubs


def export_identity(synth: Any) -> dict[str, Any]:
    """What an export's bytes depend on besides its plan: the engine's description (backend, checkpoint), sample
    rate, platform and pause between sentences (voiceapp.cli.export.engine_checked; a Ray worker sends its own)."""
    return {"describe": synth.describe(), "sample_rate": synth.sample_rate, "platform": describe_platform(synth),
            "pause_s": synth.join.pause_s}
