"""The decoder on its own: precision per device and dtype, streaming seams, speed per window length and batch,
and the Snake and cuDNN-algorithm A/Bs. torch and the decoder are imported inside the functions."""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engine.backends.base import DecodeItem
from engine.config import DECODER_DTYPES
from engine.seams import seam_error_db
from engine.windowed_decode import WindowedDecode
from engine.windowing import WindowSchedule

def stream_decode(decoder: Any, codes: Sequence[int], globals_: Sequence[int], schedule: WindowSchedule,
                  lengths: Sequence[int] = ()) -> np.ndarray:
    """Decode `codes` exactly as the pipeline does while they stream in, one code at a time (its WindowedDecode:
    planner, widening, crossfade; no edge fades), returning the joined audio."""
    windows = WindowedDecode(schedule, globals_, decoder.samples_per_code, lengths)
    parts = []
    for available in range(1, len(codes) + 1):
        while (w := windows.next_window(available, available == len(codes))) is not None:
            (pcm,) = decoder.decode([windows.item(w, codes)])
            parts.append(windows.join(w, pcm))
    return np.concatenate(parts)


def rel_error(x: np.ndarray, ref: np.ndarray) -> float:
    """max|x - ref| / rms(ref)."""
    x64, r64 = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(x64 - r64)) / max(float(np.sqrt(np.mean(r64 ** 2))), 1e-12))


def decoder_accuracy(bicodec_dir: Path, schedules: dict[str, WindowSchedule], n_codes: int = 400, seed: int = 0,
                     devices: Sequence[tuple[str, str]] = (("cuda", "fp32"), ("cuda", "bf16"))) -> dict[str, Any]:
    """One-shot error of each (device, dtype) vs CPU fp32, and streaming seam error (dB vs the CPU fp32
    one-shot) for each schedule."""
    import torch

    from engine.backends.bicodec import BiCodecDecoder
    from engine.batching import lengths_for

    rng = np.random.default_rng(seed)
    codes = [int(c) for c in rng.integers(0, 8192, n_codes)]
    glob = [int(g) for g in rng.integers(0, 4096, 32)]
    cpu = BiCodecDecoder(bicodec_dir, device="cpu")
    ref = cpu.decode([DecodeItem(tuple(codes), tuple(glob))])[0]
    out: dict[str, Any] = {"codes": n_codes, "ref_rms": float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))}
    for name, sched in schedules.items():
        out[f"seam_db_cpu_fp32_{name}"] = seam_error_db(stream_decode(cpu, codes, glob, sched), ref)
    for device, dt in devices:
        dec = BiCodecDecoder(bicodec_dir, device=device, dtype=getattr(torch, DECODER_DTYPES[dt]))
        one = dec.decode([DecodeItem(tuple(codes), tuple(glob))])[0]
        out[f"rel_err_{device}_{dt}_vs_cpu_fp32"] = rel_error(one, ref)
        out[f"db_{device}_{dt}_vs_cpu_fp32"] = seam_error_db(one, ref)
        for name, sched in schedules.items():
            lengths = lengths_for(sched)
            dec.warmup(lengths, batches=(1,))
            streamed = stream_decode(dec, codes, glob, sched, lengths)
            out[f"seam_db_{device}_{dt}_{name}"] = seam_error_db(streamed, ref)
            out[f"seam_db_{device}_{dt}_{name}_vs_own_oneshot"] = seam_error_db(streamed, one)
        del dec
        torch.cuda.empty_cache()
    return out


def call_times(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of each of `repeats` calls of `fn`, after one untimed call (first-use costs: kernels built per
    shape, cuDNN autotuning)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _decode_ms(decoder: Any, codes: int, batch: int, repeats: int) -> float:
    """Median ms of one decode() of `batch` windows of `codes` codes, after one untimed call."""
    items = [DecodeItem(tuple((k * 37 + j) % 8192 for k in range(codes)), tuple(range(32))) for j in range(batch)]
    return statistics.median(call_times(lambda: decoder.decode(items), repeats)) * 1e3


def _speed_rows(decoder: Any, lengths: Sequence[int], batches: Sequence[int], repeats: int,
                **labels: Any) -> list[dict[str, Any]]:
    """One row per (length, batch): `labels`, then codes, batch and the median ms per decode() call."""
    return [{**labels, "codes": n, "batch": b, "ms": round(_decode_ms(decoder, n, b, repeats), 3)}
            for n in lengths for b in batches]


def decoder_speed(bicodec_dir: Path, lengths: Sequence[int], batches: Sequence[int] = (1, 8, 32, 64),
                  dtypes: Sequence[str] = ("fp32", "bf16"), repeats: int = 10) -> list[dict[str, Any]]:
    """ms per decode call, eager vs CUDA graph, for each (dtype, length, batch); x real time of the whole window."""
    import torch

    from engine.backends.bicodec import BiCodecDecoder

    rows = []
    for dt in dtypes:
        dec = BiCodecDecoder(bicodec_dir, device="cuda", dtype=getattr(torch, DECODER_DTYPES[dt]))
        dec.max_batch = max(batches)
        for mode in ("eager", "graph"):
            if mode == "graph":
                dec.warmup(lengths, batches)
            rows += [row | {"xrt": round(row["batch"] * row["codes"] * 0.02 / (row["ms"] / 1e3), 1)}
                     for row in _speed_rows(dec, lengths, batches, repeats, dtype=dt, mode=mode)]
        del dec
        torch.cuda.empty_cache()
    return rows


def decoder_snake(bicodec_dir: Path, lengths: Sequence[int], batches: Sequence[int] = (1, 8, 32, 64),
                  repeats: int = 10) -> dict[str, Any]:
    """fp32 CUDA-graph decode with Snake as eager PyTorch ops vs the fused Triton kernel (engine.backends.
    snake_fused), same fixed cuDNN algorithms in both: ms per call for each (length, batch), and how far the
    fused decode is from the eager one (dB, on a 128-code window)."""
    import torch

    from engine.backends import snake_fused
    from engine.backends.bicodec import BiCodecDecoder
    from engine.backends.bicodec_modules import Snake

    rows, audio = [], {}
    window = [DecodeItem(tuple((k * 53 + 11) % 8192 for k in range(128)), tuple(range(32)))]
    for fused in (False, True):
        dec = BiCodecDecoder(bicodec_dir, device="cuda", autotune="none")
        for module in dec.model.modules():
            if isinstance(module, Snake):
                module.fused = fused
        capture_s = dec.warmup(lengths, batches)
        rows += _speed_rows(dec, lengths, batches, repeats, snake="fused" if fused else "eager",
                            capture_s=round(capture_s, 1))
        audio[fused] = dec.decode(window)[0]
        del dec
        torch.cuda.empty_cache()
    diff = float(np.sqrt(np.mean((audio[True] - audio[False]) ** 2)))
    ref = float(np.sqrt(np.mean(audio[False] ** 2)))
    return {"available": snake_fused.available(), "rows": rows,
            "db_fused_vs_eager": 20 * math.log10(max(diff, 1e-12) / max(ref, 1e-12))}


def decoder_algorithms(bicodec_dir: Path, lengths: Sequence[int], batches: Sequence[int] = (1, 8, 32, 64),
                       repeats: int = 10, device: str = "cuda") -> list[dict[str, Any]]:
    """fp32 CUDA-graph decode with the streaming engine's cuDNN algorithms ("default": batch-1 graphs autotuned,
    the rest fixed, see BiCodecDecoder._pick_algorithms) vs cuDNN's fixed deterministic ones everywhere
    (export's engine): graph capture seconds and ms per call for each (length, batch). Capture seconds are only
    comparable on a fresh process (cuDNN keeps what it timed for earlier shapes)."""
    import torch

    from engine.backends.bicodec import BiCodecDecoder

    rows = []
    was = torch.backends.cudnn.deterministic
    try:
        for algorithms in ("default", "fixed"):
            dec = BiCodecDecoder(bicodec_dir, device=device, deterministic=algorithms == "fixed")
            capture_s = dec.warmup(lengths, batches)
            rows += _speed_rows(dec, lengths, batches, repeats, algorithms=algorithms, capture_s=round(capture_s, 1))
            del dec
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        torch.backends.cudnn.deterministic = was  # BiCodecDecoder(deterministic=True) sets it process-wide
    return rows
