"""How much a decoder running beside the graph lane slows its steps, and whether confining the decoder to a few SMs
(a CUDA green context) gives them back (GPU; no vLLM).

    python lab/contention_probe.py CHECKPOINT [--sms 16,32,66] [--json OUT]

CHECKPOINT: a synthetic full checkpoint (its BiCodec decoder; the LLM is a random Qwen2 of Spark's shapes, as in
decode_kernels_probe.py). In one process, a two-row fused lane's step time (graph replays, 300 steps a round) is
measured in turns: alone, beside a decoder thread on its own stream (as the pipeline runs it: batch-1 windows of
56 codes, replayed graphs, with a pause between windows), and beside the same decoder on a green context's
stream of N SMs (graphs captured there). Also each setting's decode time per window.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.backends.base import DecodeItem
from engine.backends.bicodec import BiCodecDecoder, _GraphCache
from engine.backends.graph_gen import GraphLane
from engine.backends.lane_runner import LaneRunner
from engine.prompt import semantic_allowed_ids
from engine.synthetic.llm import llm_config
from engine.tokens import TokenIds

SPAN, WINDOW, PAUSE_S, STEPS = 256, 56, 0.008, 300
"""The lane's span bucket; the decoder's window (24 new codes + 32 of context: the pipeline's third window); the
pause between windows (a lone stream's decoder is busy roughly a third of the time, docs/lab/run-log.md run 27);
lane steps a round."""


class DecoderLoad:
    """A thread decoding a window, pausing, and again, until stopped; counts windows and their time."""

    def __init__(self, decoder: BiCodecDecoder) -> None:
        self.decoder, self.stop, self.times = decoder, threading.Event(), []
        self.item = DecodeItem(tuple(range(100, 100 + WINDOW)), tuple([7] * decoder.global_count), 16, 40)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.decoder.decode([self.item])
            self.times.append(time.perf_counter() - t0)
            time.sleep(PAUSE_S)

    def __enter__(self) -> DecoderLoad:
        self.thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def lane_ms(runner: LaneRunner, rows: int) -> float:
    graph = runner.graphs[("decode", rows, SPAN)]
    with torch.cuda.stream(runner.cuda_stream):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(STEPS):
            runner.positions.fill_(SPAN // 2)
            graph.replay()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / STEPS


def on_stream(decoder: BiCodecDecoder, stream: torch.cuda.Stream) -> None:
    """Point the decoder at `stream` and capture its window's graph there."""
    decoder._stream = stream  # noqa: SLF001 - a measurement script
    decoder._graphs = _GraphCache(decoder.model, decoder.device, stream)  # noqa: SLF001
    decoder.warmup([WINDOW], [1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--sms", default="16,32,66")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    cfg = Qwen2Config(**{k: v for k, v in llm_config("full").items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = TokenIds()
    lane = GraphLane(model, ids, semantic_allowed_ids(ids), rows=2, max_len=1024, fused=True)
    decoder = BiCodecDecoder(args.checkpoint / "BiCodec", device="cuda")
    settings: dict[str, torch.cuda.Stream | None] = {"alone": None, "decoder": torch.cuda.Stream()}
    out: dict = {"device": torch.cuda.get_device_name(),
                 "sms": torch.cuda.get_device_properties(0).multi_processor_count, "green": {}}
    keep = []
    for n in (int(s) for s in args.sms.split(",")):
        try:
            green = torch.cuda.GreenContext.create(num_sms=n, device_id=0)
            keep.append(green)  # its streams die with it
            settings[f"green{n}"] = green.Stream()
        except Exception as err:  # noqa: BLE001 - reported: this torch or driver may lack green contexts
            out["green"][n] = f"{type(err).__name__}: {err}"[:300]
    streams_graphs = {}
    for name, stream in settings.items():
        if stream is None:
            continue
        try:
            on_stream(decoder, stream)
            streams_graphs[name] = (decoder._stream, decoder._graphs)  # noqa: SLF001
        except Exception as err:  # noqa: BLE001 - reported
            out["green"][name] = f"capture: {type(err).__name__}: {err}"[:300]
    rounds: dict[str, dict] = {name: {"1": [], "2": [], "decode_ms": []} for name in ["alone", *streams_graphs]}
    for _ in range(args.rounds):
        for name in rounds:
            if name == "alone":
                for rows in (1, 2):
                    rounds[name][str(rows)].append(lane_ms(lane.runner, rows))
                continue
            decoder._stream, decoder._graphs = streams_graphs[name]  # noqa: SLF001
            with DecoderLoad(decoder) as load:
                for rows in (1, 2):
                    rounds[name][str(rows)].append(lane_ms(lane.runner, rows))
            rounds[name]["decode_ms"] += [t * 1e3 for t in load.times[1:]]
    median = lambda xs: round(sorted(xs)[len(xs) // 2], 4) if xs else None  # noqa: E731
    out["step_ms"] = {name: {k: median(v) for k, v in r.items()} for name, r in rounds.items()}
    out["windows"] = {name: len(r["decode_ms"]) for name, r in rounds.items()}
    print(json.dumps(out, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
