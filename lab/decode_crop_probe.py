"""Probe: what decoding only the codes a streaming window keeps would save on a GPU (issue 42). On a CPU the decoder
already crops (BiCodecModel.decode_kept: the high-rate layers skip most of a window's context); on CUDA every window
replays a graph of the whole window, context included, although a window keeps a third of its codes or less. The
first window's decoder call is part of first audio, and crowds are bound by the decoder.

    python -m lab.decode_crop_probe --model DIR [--dtype fp16|fp32] [--batches 1,8,64] [--json OUT]

For each window of Spark's streaming schedule below and each batch, a CUDA graph of the whole window's decode and
one of its kept codes only (decode_kept), each replayed REPLAYS times on one stream: milliseconds a replay, and the
kept audio's largest difference from the whole window's, relative to the whole window's peak.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from engine.backends.bicodec import BiCodecDecoder
from engine.backends.cuda_graphs import capture_graph

WINDOWS = {  # name: (window length in codes, first kept code, one past the last): the default schedule's windows of
    # a 250-code sentence widened to the standard lengths (engine.windowed_decode; kept spans include the crossfade)
    "first": (20, 0, 6),
    "second": (32, 4, 18),
    "third": (56, 16, 42),
    "fourth": (80, 16, 66),
    "steady": (128, 16, 114),
    "last": (128, 62, 128),
    "busy_first": (32, 0, 18),  # a crowd's first window (WindowSchedule.busy)
}
REPLAYS = 50


def timed(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> float:
    """Milliseconds a replay of `graph` takes on `stream`, over REPLAYS replays after two."""
    with torch.cuda.stream(stream):
        for _ in range(2):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(REPLAYS):
            graph.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / REPLAYS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Spark checkpoint (its BiCodec/): the synthetic full one will do")
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16", help="the decoder's precision (streaming: fp16)")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--json")
    args = p.parse_args(argv)
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    dec = BiCodecDecoder(Path(args.model) / "BiCodec", device="cuda", dtype=dtype)
    model, stream = dec.model, torch.cuda.Stream()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (length, start, stop) in WINDOWS.items():
        for batch in (int(b) for b in args.batches.split(",")):
            codes = torch.randint(0, 8192, (batch, length), device="cuda", generator=gen)
            globs = torch.randint(0, 4096, (batch, dec.global_count), device="cuda", generator=gen)
            whole, whole_out = capture_graph(lambda: model.decode(codes, globs), pool=torch.cuda.graph_pool_handle(),
                                             stream=stream)
            kept, kept_out = capture_graph(lambda: model.decode_kept(codes, globs, start, stop),
                                           pool=torch.cuda.graph_pool_handle(), stream=stream)
            whole_ms, kept_ms = timed(whole, stream), timed(kept, stream)
            spc = dec.samples_per_code
            ref = whole_out[:, start * spc: stop * spc].float()
            diff = float((kept_out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-9))
            rows.append({"window": name, "length": length, "kept": [start, stop], "batch": batch,
                         "whole_ms": round(whole_ms, 3), "kept_ms": round(kept_ms, 3), "max_rel_diff": diff})
            print(f"{name:12s} {length:3d} codes, kept [{start}, {stop}), batch {batch:3d}: whole {whole_ms:7.3f} ms, "
                  f"kept {kept_ms:7.3f} ms ({kept_ms / whole_ms:.2f}x), max rel diff {diff:.1e}", flush=True)
            del whole, kept
    result = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "replays": REPLAYS, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
