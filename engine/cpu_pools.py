"""Provides how an engine on the CPU shares the cores: torch's pool (the decoder) and the int8 LLM's own pool, and
the decoder's precision there. Imports torch only inside `cpu_decodes_bf16`."""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.config import EngineConfig


CPU_LLM_ROWS = 4
"""Requests whose int8 (or int4) LLM steps run as one forward: a lone listener's sentence and the next one beside
it, twice over for two listeners (docs/cpu.md, "Two sentences a step"). A deterministic engine steps each alone."""


@dataclass(frozen=True, slots=True)
class CpuPools:
    """How an engine whose LLM runs on the CPU shares the cores between torch (the decoder; a process-wide count)
    and the int8 LLM's own ONNX Runtime pool, which steps while torch decodes."""

    torch: int | None
    """torch's intra-op threads (None: torch's default, all cores)."""
    llm: int | None
    """The int8 LLM's threads (None: torch's count)."""
    llm_spins: bool
    """The LLM's threads spin between the step's kernels instead of sleeping: a step is a few hundred kernels, and
    waking a sleeping pool for each costs more than the kernel on many cores; spinning on cores the decoder needs
    would starve it, so only where the two pools do not overlap."""


SPLIT_CORES = 8
"""From this many cores up the LLM and the decoder get separate halves, the LLM's spinning (docs/cpu.md,
"Cores"); below it both use every core and the LLM's threads sleep, since spinning threads would take the
decoder's few cores."""


def cpu_pools(config: EngineConfig, cores: int) -> CpuPools:
    """The pools for `cores` usable cores: what the user set, else halves from SPLIT_CORES up (one pool for an fp32
    LLM, which steps in torch's)."""
    if config.quantize == "none":
        return CpuPools(config.threads, None, False)
    if config.threads is not None or config.llm_threads is not None:
        llm = config.llm_threads or config.threads
        spins = config.threads is not None and llm is not None and config.threads + llm <= cores
        return CpuPools(config.threads, llm, spins)
    if cores < SPLIT_CORES:
        return CpuPools(None, None, False)
    return CpuPools(cores - cores // 2, cores // 2, True)


def usable_cores() -> int:
    """Cores this process may run on (its affinity, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_decoder_dtype(config: EngineConfig) -> str:
    """The CPU decoder's precision: the one asked for, else bf16 where the CPU multiplies bf16 natively and the user
    did not ask for full precision, else fp32. bf16 halves the bytes its convolutions and activations move and
    doubles the products per instruction; its error against fp32 is bounded (decoder_agreement.FULL_BOUND_DB)."""
    if config.decoder_dtype != "auto":
        return config.decoder_dtype
    return "bf16" if config.quantize != "none" and cpu_decodes_bf16() else "fp32"


def cpu_decodes_bf16() -> bool:
    """The CPU has bf16 dot-product instructions (x86 AVX512-BF16 or AMX); elsewhere bf16 would be emulated, slower
    than fp32, and the decoder stays in fp32 (ARM's bf16 paths are untested)."""
    import torch

    checks = (torch.cpu._is_avx512_bf16_supported, torch.cpu._is_amx_tile_supported)  # private, hence the guard
    try:
        return any(check() for check in checks)
    except (AttributeError, RuntimeError):
        return False
