"""Probe: where a background decoder capture beside live decodes stops (run 42: the GPU test
`test_a_background_capture_beside_live_decodes_replays_the_eager_audio` sat in `capture_graph`'s
`stream.synchronize()` for minutes, while a server's tuning, which captures the same way, always finished).

The test's scenario, one switch at a time: a BiCodec decoder on the GPU; optionally eager decodes first on this
thread (`--eager-first`, as the test does) or a foreground capture of the live window's shape (`--foreground-first`,
as a server's start-up does); a thread decoding a 20-code window every 5 ms (`--live`); and a daemon thread capturing
(1, 20), (8, 20), (1, 48), (8, 48) with `warmup(..., background=True)`. If the captures have not ended after
`--timeout` seconds, it writes which shape they are on, every thread's Python stack (faulthandler) and, where py-spy
is installed, every thread's native stack, then exits 3.

    python -m lab.capture_hang_probe --model DIR --json OUT.json [--live] [--eager-first] [--foreground-first]
        [--background-first] [--live-eager] [--apart none|all|warmups] [--dtype fp16|fp32] [--timeout 60]
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from engine.backends.base import DecodeItem
from engine.backends.bicodec import BiCodecDecoder

SHAPES = [(1, 20), (8, 20), (1, 48), (8, 48)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a synthetic full Spark checkpoint (its BiCodec/)")
    p.add_argument("--json", required=True)
    p.add_argument("--live", action="store_true", help="a thread decodes a 20-code window every 5 ms meanwhile")
    p.add_argument("--eager-first", action="store_true", help="eager decodes on this thread first (as the test)")
    p.add_argument("--foreground-first", action="store_true",
                   help="capture the live window's shape in the foreground first (as a server's start-up)")
    p.add_argument("--background-first", action="store_true",
                   help="capture the live window's shape in the background before the live thread starts (its graph "
                        "never launched before the live thread replays it)")
    p.add_argument("--live-eager", action="store_true", help="the live thread runs the decoder eagerly, never a graph")
    p.add_argument("--apart", choices=("none", "all", "warmups"), default="none",
                   help="a lock keeps the live thread's decodes apart from the background captures (all: warm-ups "
                        "and capture; warmups: only the eager warm-ups, where cuDNN loads a new shape's kernels)")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)

    rng = np.random.default_rng(3)
    glob = tuple(int(g) for g in rng.integers(0, 4096, 32))
    items = [DecodeItem(tuple(int(c) for c in rng.integers(0, 8192, 48)), glob, 8, 40) for _ in range(5)]
    live_item = DecodeItem(tuple(int(c) for c in rng.integers(0, 8192, 20)), glob, 4, 16)
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    dec = BiCodecDecoder(Path(args.model) / "BiCodec", device="cuda", dtype=dtype)
    reference = None
    if args.eager_first:
        dec.decode(items)
        reference = dec.decode([live_item])[0]
    if args.foreground_first:
        dec.warmup([20], [1])
    if args.background_first:
        dec.warmup([20], [1], background=True)
    apart = threading.Lock() if args.apart != "none" else contextlib.nullcontext()
    if args.apart == "all":
        from engine.backends import bicodec
        plain = bicodec.capture_graph

        def capture_apart(*a, **kw):
            with apart:
                return plain(*a, **kw)
        bicodec.capture_graph = capture_apart
    if args.apart == "warmups":
        model_decode = dec.model.decode

        def decode_apart(*a, **kw):  # the tuning thread's eager warm-ups, not the decode it captures
            if threading.current_thread().name != "tune" or torch.cuda.is_current_stream_capturing():
                return model_decode(*a, **kw)
            with apart:
                return model_decode(*a, **kw)
        dec.model.decode = decode_apart
    live_codes = torch.tensor([live_item.codes], device="cuda")
    live_globs = torch.tensor([live_item.global_tokens], device="cuda")

    def decode_live() -> np.ndarray:
        if not args.live_eager:
            return dec.decode([live_item])[0]
        with torch.inference_mode(), torch.cuda.stream(dec._stream):
            audio = dec.model.decode(live_codes, live_globs).float().cpu().numpy()[0]
        return audio[live_item.keep_start * dec.samples_per_code: live_item.keep_stop * dec.samples_per_code]
    stop, live, worst, log = threading.Event(), [0], [0.0], []

    def serve() -> None:  # a stream being served; with a reference, how far its audio strays from the eager one
        while not stop.is_set():
            with apart:
                out = decode_live()
            live[0] += 1
            if reference is not None:
                worst[0] = max(worst[0], float(np.abs(out - reference).max() / (np.abs(reference).max() + 1e-9)))
            stop.wait(0.005)

    def tune() -> None:
        for batch, length in SHAPES:
            t = time.perf_counter()
            log.append({"shape": [batch, length], "started_s": round(t - t0, 3)})
            dec.warmup([length], [batch], background=True)
            log[-1]["ms"] = round((time.perf_counter() - t) * 1e3, 1)

    server = threading.Thread(target=serve, daemon=True)
    if args.live:
        server.start()
    t0 = time.perf_counter()
    tuner = threading.Thread(target=tune, name="tune", daemon=True)
    tuner.start()
    tuner.join(args.timeout)
    stuck = tuner.is_alive()
    result = {"args": vars(args), "stuck": stuck, "captures": log, "live_decodes": live[0], "live_max_rel": worst[0],
              "graphs": sorted(list(k) for k in dec._graphs.graphs) if dec._graphs is not None else []}
    if stuck:
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            result["python_stacks"] = f.read()
        spy = shutil.which("py-spy")
        if spy:
            native = subprocess.run([spy, "dump", "--native", "--pid", str(os.getpid())], capture_output=True,
                                    text=True, timeout=60)
            result["native_stacks"] = native.stdout + native.stderr
    stop.set()
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("stacks")}))
    sys.stdout.flush()
    if stuck:
        os._exit(3)  # the stuck thread would hold the interpreter's exit
    server.join(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
