"""The BiCodec decoder on the CPU: fp32 and bf16 in torch, fp32 through ONNX Runtime; round-robin in one process.

Usage: python -m lab.cpu_decoder_probe --model DIR [--threads 2] [--codes 44,82,182] [--rounds 4]
Each variant decodes the same random window (batch 1) in turn, so that a busy neighbour slows all of them alike;
prints one JSON object: best-of-rounds milliseconds per window length, x real time of the decoded audio, and each
variant's SNR against torch fp32 (lab.decoder_agreement) on four 150-code utterances.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from engine.backends.bicodec import BiCodecDecoder
from lab.decoder_agreement import compare, random_items


class OrtDecoder:
    """The same model exported to ONNX (dynamic length), run by ONNX Runtime's CPU provider."""

    def __init__(self, model: torch.nn.Module, threads: int) -> None:
        import onnxruntime as ort

        class Decode(torch.nn.Module):
            def __init__(self, m: torch.nn.Module) -> None:
                super().__init__()
                self.m = m

            def forward(self, codes: torch.Tensor, globs: torch.Tensor) -> torch.Tensor:
                return self.m.decode(codes, globs)

        buf = io.BytesIO()
        codes, globs = torch.zeros(1, 44, dtype=torch.long), torch.zeros(1, 32, dtype=torch.long)
        with torch.no_grad():
            torch.onnx.export(Decode(model), (codes, globs), buf, input_names=["codes", "globs"],
                              output_names=["audio"], dynamic_axes={"codes": {1: "t"}, "audio": {1: "s"}},
                              opset_version=17, dynamo=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
        self.spc = model.samples_per_code

    def decode(self, items):
        out = []
        for item in items:
            feed = {"codes": np.array([item.codes], np.int64), "globs": np.array([item.global_tokens], np.int64)}
            audio = self.session.run(None, feed)[0][0]
            stop = len(item.codes) if item.keep_stop is None else item.keep_stop
            out.append(np.ascontiguousarray(audio[item.keep_start * self.spc: stop * self.spc]))
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--codes", default="44,82,182")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-ort", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bicodec = args.model / "BiCodec"
    fp32 = BiCodecDecoder(bicodec, device="cpu", num_threads=args.threads)
    variants = {"fp32": fp32, "bf16": BiCodecDecoder(bicodec, device="cpu", dtype=torch.bfloat16,
                                                     num_threads=args.threads)}
    if not args.no_ort:
        variants["ort_fp32"] = OrtDecoder(fp32.model, args.threads)
    items = random_items(4, 150, fp32.codebook_size, fp32.global_count, fp32.global_codebook)
    result = {"threads": args.threads, "cpu": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "snr_db": {}, "ms": {}, "xrt_decoded": {}}
    for name, dec in variants.items():
        if name != "fp32":
            result["snr_db"][name] = round(compare(fp32, dec, items).snr_db_min, 1)
    for n in (int(c) for c in args.codes.split(",")):
        window = random_items(1, n, fp32.codebook_size, fp32.global_count, fp32.global_codebook, seed=n)
        best = {name: float("inf") for name in variants}
        for dec in variants.values():
            dec.decode(window)  # the first call of a shape builds kernels
        for _ in range(args.rounds):
            for name, dec in variants.items():
                t = time.perf_counter()
                dec.decode(window)
                best[name] = min(best[name], time.perf_counter() - t)
        result["ms"][n] = {k: round(v * 1000, 1) for k, v in best.items()}
        result["xrt_decoded"][n] = {k: round(n * 0.02 / v, 2) for k, v in best.items()}
    result["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
