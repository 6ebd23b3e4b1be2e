"""Probe: how far BiCodec (or SNAC) decoded in fp16 or bf16 lands from fp32 (issue 42: the decoder's share of a crowd's
GPU).

    python -m lab.decoder_precision [--family spark|orpheus] [--size full] [--codes 250] [--seeds 3] [--device cpu]

Writes a synthetic BiCodec or SNAC (random weights) to a temporary folder (`--codes`: Spark's codes, or Orpheus's
frames), decodes random codes one-shot in fp32 (the
reference) and in each lower precision, and prints per precision the worst error as the seam metric counts it
(engine.seams: max |x - ref| over rms(ref), dB) and the SNR (dB). Precision only: speed is a GPU's to measure
(lab/gpu_lane3b.py --parts bicodec).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from engine.backends.base import DecodeItem
from engine.backends.bicodec import BiCodecDecoder
from engine.seams import seam_error_db
from engine.synthetic.bicodec import write_bicodec

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def snr_db(x: np.ndarray, ref: np.ndarray) -> float:
    err = x.astype(np.float64) - ref
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum(err ** 2), 1e-30)))


def decoder_maker(family: str, root: Path, size: str):
    """Writes the family's synthetic codec under `root`; returns (device, dtype) -> its decoder."""
    if family == "spark":
        write_bicodec(root, size, 0)
        return lambda device, dtype: BiCodecDecoder(root / "BiCodec", device=device, dtype=dtype)
    from engine.families.orpheus.snac import SnacDecoder
    from engine.families.orpheus.synthetic import write_snac

    write_snac(root / "snac", size, 0)
    return lambda device, dtype: SnacDecoder(root / "snac", device=device, dtype=dtype)


def random_item(family: str, rng: np.random.Generator, n: int) -> DecodeItem:
    """`n` random codes and a random voice (Spark), or `n` random frames of 7 codes (Orpheus)."""
    if family == "spark":
        return DecodeItem(codes=tuple(int(c) for c in rng.integers(0, 8192, n)),
                          global_tokens=tuple(int(c) for c in rng.integers(0, 4096, 32)))
    return DecodeItem(tuple(tuple(int(c) for c in rng.integers(0, 4096, 7)) for _ in range(n)), ())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("spark", "orpheus"), default="spark")
    ap.add_argument("--size", default="full")
    ap.add_argument("--codes", type=int, default=250)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make = decoder_maker(args.family, Path(tmp), args.size)
        ref_dec = make(args.device, torch.float32)
        rows: dict[str, dict[str, float]] = {}
        for name, dtype in DTYPES.items():
            dec = make(args.device, dtype)
            worst_seam, worst_snr = -999.0, 999.0
            for seed in range(args.seeds):
                item = random_item(args.family, np.random.default_rng(seed), args.codes)
                ref = ref_dec.decode([item])[0].astype(np.float64)
                out = dec.decode([item])[0]
                n = min(len(ref), len(out))
                worst_seam = max(worst_seam, seam_error_db(out[:n], ref[:n]))
                worst_snr = min(worst_snr, snr_db(out[:n], ref[:n]))
            rows[name] = {"max_err_db": round(worst_seam, 1), "snr_db": round(worst_snr, 1)}
            print(name, rows[name], flush=True)
        print(json.dumps({"family": args.family, "size": args.size, "codes": args.codes, "seeds": args.seeds,
                          "device": args.device,
                          "vs_fp32_one_shot": rows}))


if __name__ == "__main__":
    main()
