"""Time of one captured step of a fixed-shape lane (GraphLane `fixed_shapes`), by rows and positions.

    python lab/fixed_lane_steps.py MODEL_DIR OUT.json [ROWSxPOSITIONS,...]

For each (rows, max_len): ms per decode step (the whole captured step: forward, logits, draw), ms per one-prompt
prefill at each prompt bucket, and the tokens per second the decode steps alone allow.
"""
from __future__ import annotations

import json
import sys
import time

import torch


def replay_ms(graph, n: int = 50) -> float:
    graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) / n * 1e3, 3)


SHAPES = "128x2048,128x1024,192x2048,256x2048,256x1024"


def main(model_dir: str, out: str, shapes: str = SHAPES) -> None:
    from engine.backends.graph_gen import GraphLane
    from engine.backends.qwen2_checkpoint import Qwen2Weights
    from engine.factory import penalised
    from engine.families import detect

    info = detect(model_dir).read(model_dir)
    weights = Qwen2Weights.from_checkpoint(info.llm_dir)
    result = {"device": torch.cuda.get_device_name(), "family": info.family, "lanes": []}
    for rows, max_len in (tuple(int(n) for n in shape.split("x")) for shape in shapes.split(",")):
        t = time.perf_counter()
        lane = GraphLane(weights, info.token_ids, info.token_ids.audio_ids, device="cuda", rows=rows,
                         max_len=max_len, fixed_shapes=True, repetition_penalty=penalised(info))
        build = time.perf_counter() - t
        graphs = lane.runner.graphs
        with torch.inference_mode(), torch.cuda.stream(lane.runner.cuda_stream):
            step = replay_ms(graphs[("decode", rows, max_len)])
            prefill = {size: replay_ms(graphs[("prefill", 1, size)], 20) for size in lane.shapes.prefills}
        row = {"rows": rows, "max_len": max_len, "build_s": round(build, 2), "capture_s": round(lane.capture_s, 2),
               "step_ms": step, "prefill_ms": prefill, "tokens_per_s": round(rows / step * 1e3)}
        print(row, flush=True)
        result["lanes"].append(row)
        del lane
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
