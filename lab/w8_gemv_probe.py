"""Device probe: what one row's projections of Orpheus 3B cost with 8-bit weights (int8 or FP8, one scale per output
channel, activations in bf16) through a Triton GEMV, against cuBLAS on the bf16 weights.

    python lab/w8_gemv_probe.py OUT.json

The 28 layers' four projections (qkv, o, gate_up, down; Llama-3.2-3B shapes), each layer its own weights so that
no cache serves them, captured in one CUDA graph per variant; the kernel's tiling autotuned per shape. Also the
largest difference from the bf16 product of the dequantised weights (the kernel's own error, not the
quantisation's).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from decode_kernels_probe import timed  # noqa: E402 - lab/ beside this script

SHAPES = {"qkv": (3072, 5120), "o": (3072, 3072), "gate_up": (3072, 16384), "down": (8192, 3072)}
"""(in, out) of each projection."""
LAYERS = 28


@triton.autotune(configs=[triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=s)
                          for bn, bk in ((1, 2048), (2, 1024), (2, 2048), (4, 512), (4, 1024), (8, 256), (8, 512))
                          for w in (2, 4, 8) for s in (2, 4)],
                 key=["N", "K"])
@triton.jit
def gemv_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, N, K, BN: tl.constexpr, BK: tl.constexpr):
    """out[n] = scale[n] * sum_k w[n, k] * x[k] for one row x [K] (bf16), w [N, K] 8-bit, out [N] bf16."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < N) & (k[None, :] < K), other=0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    scale = tl.load(scale_ptr + n, mask=n < N, other=0.0)
    tl.store(out_ptr + n, (acc * scale).to(tl.bfloat16), mask=n < N)


def gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    gemv_kernel[lambda meta: (triton.cdiv(n, meta["BN"]),)](x, w, scale, out, n, k)
    return out


def quantise(w: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] bf16 -> (8-bit [N, K], fp32 scale [N]) with one scale per output channel."""
    amax = w.float().abs().amax(dim=1).clamp_min(1e-8)
    if kind == "int8":
        scale = amax / 127.0
        return torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8), scale
    scale = amax / 448.0
    return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def main() -> None:
    out_path = Path(sys.argv[1])
    torch.manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    weights = [{name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for name, (k, n) in SHAPES.items()}
               for _ in range(LAYERS)]
    xs = {k: torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for k, _ in SHAPES.values()}
    outs = {name: torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for name, (_, n) in SHAPES.items()}

    def cublas() -> None:
        for layer in weights:
            for name, w in layer.items():
                torch.nn.functional.linear(xs[w.shape[1]], w, out=outs[name])
    res["bf16_cublas_ms"] = round(timed(cublas), 3)
    for kind in ("int8",):
        try:
            quant = [{name: quantise(w, kind) for name, w in layer.items()} for layer in weights]
            for name, (w, s) in quant[0].items():  # tune each shape outside the capture
                gemv(xs[w.shape[1]], w, s, outs[name])
            torch.cuda.synchronize()

            def triton8() -> None:
                for layer in quant:
                    for name, (w, s) in layer.items():
                        gemv(xs[w.shape[1]], w, s, outs[name])
            res[f"{kind}_triton_ms"] = round(timed(triton8), 3)
            err = 0.0
            for name, (w, s) in quant[0].items():
                ref = xs[w.shape[1]].float() @ (w.float() * s[:, None]).t()
                got = gemv(xs[w.shape[1]], w, s, outs[name]).float()
                err = max(err, float((got - ref).abs().max() / ref.abs().max()))
            res[f"{kind}_kernel_rel_err"] = err
            res[f"{kind}_configs"] = {f"{k}": str(v) for k, v in gemv_kernel.cache.items()}
            quant.clear()
        except Exception as exc:  # noqa: BLE001 - a probe records what failed
            res[f"{kind}_error"] = f"{type(exc).__name__}: {exc}"[:400]
        out_path.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    out_path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
