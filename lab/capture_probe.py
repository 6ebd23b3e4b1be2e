"""Probe (issue 42, first audio while a server tunes): where the time of one decoder graph capture goes.

A server's tuning captures BiCodec graphs one (batch, length) at a time on the decode thread, and a request waits for
the piece in progress (`tuning.pieces` in the server's status: 360-1,070 ms each on an H200). This times each phase of
`_GraphCache.capture` for a few shapes on the synthetic full BiCodec: two eager warm-up decodes, the capture as
`torch.cuda.graph` does it (a device-wide synchronize, then `empty_cache`), the capture alone (`capture_begin` /
`capture_end`, no synchronize, no cache emptied) and the first replay. With `--live`, a thread decodes a 20-code window
eagerly every 20 ms meanwhile (a stream being served) and reports its slowest decode.

    python -m lab.capture_probe OUT.json [--live]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import torch

from engine.backends.bicodec import BiCodecDecoder
from engine.synthetic.bicodec import write_bicodec

SHAPES = [(1, 1), (1, 8), (8, 20), (16, 80), (64, 48), (128, 128), (4, 36), (32, 56)]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return round((time.perf_counter() - t) * 1e3, 2)


def phases(dec: BiCodecDecoder, batch: int, length: int, raw: bool) -> dict[str, float]:
    """Milliseconds of each phase of capturing one (batch, length) graph."""
    model, stream, dev = dec.model, dec._stream, dec.device
    codes = torch.zeros((batch, length), dtype=torch.long, device=dev)
    globs = torch.zeros((batch, dec.global_count), dtype=torch.long, device=dev)
    out: dict[str, float] = {}
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, False

    def warm() -> None:
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):
                model.decode(codes, globs)
        stream.synchronize()

    out["warmup_ms"] = timed(warm)
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()

    def capture_torch() -> None:
        with torch.inference_mode(), torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            model.decode(codes, globs)

    def capture_raw() -> None:
        with torch.inference_mode(), torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                model.decode(codes, globs)
            finally:
                graph.capture_end()

    if not raw:
        out["sync_ms"] = timed(torch.cuda.synchronize)
        out["empty_cache_ms"] = timed(torch.cuda.empty_cache)
    out["capture_ms"] = timed(capture_raw if raw else capture_torch)

    def replay() -> None:
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()

    out["first_replay_ms"] = timed(replay)
    out["second_replay_ms"] = timed(replay)
    return out


def live_decodes(dec: BiCodecDecoder, stop: threading.Event, worst: list[float]) -> None:
    """A served stream: an eager 20-code decode every 20 ms on a stream of its own."""
    side = torch.cuda.Stream(dec.device)
    codes = torch.zeros((1, 20), dtype=torch.long, device=dec.device)
    globs = torch.zeros((1, dec.global_count), dtype=torch.long, device=dec.device)
    while not stop.is_set():
        t = time.perf_counter()
        with torch.inference_mode(), torch.cuda.stream(side):
            dec.model.decode(codes, globs)
        side.synchronize()
        worst.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--live", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    write_bicodec(root, "full", 0)
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for raw in (False, True):
        dec = BiCodecDecoder(root / "BiCodec", device="cuda")
        stop, worst = threading.Event(), []
        live = threading.Thread(target=live_decodes, args=(dec, stop, worst), daemon=True) if args.live else None
        if live:
            live.start()
            time.sleep(0.5)
        rows = {}
        for batch, length in SHAPES:
            seen = len(worst)
            t = time.perf_counter()
            rows[f"{batch}x{length}"] = phases(dec, batch, length, raw)
            rows[f"{batch}x{length}"]["total_ms"] = round((time.perf_counter() - t) * 1e3, 2)
            if live:
                rows[f"{batch}x{length}"]["live_worst_ms"] = round(max(worst[seen:], default=0.0), 2)
            print("raw" if raw else "torch.cuda.graph", batch, length, rows[f"{batch}x{length}"], flush=True)
        stop.set()
        if live:
            live.join()
        result["raw" if raw else "torch_graph"] = rows
        del dec
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
