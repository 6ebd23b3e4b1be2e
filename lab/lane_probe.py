"""Time the graph lane alone on a checkpoint's LLM (GPU): capture, first token, 20th token, ms per token.

    python lab/lane_probe.py MODEL_DIR [--compile] [--json OUT]

One request at a time, 300 tokens each, semantic ids only (no stop), 5 repeats after 2 untimed; then 1, 2, 4, 8
and 16 requests started together (the lane steps up to 8 as rows of one batch). With --compile also the variant
whose decoder layers go through torch.compile, on the same weights.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from engine.backends.graph_gen import GraphLane
from engine.config import SamplingOptions
from engine.model import load_model_info
from engine.prompt import Prompt
from engine.tokens import SEMANTIC_CODEBOOK

TOKENS = 300


def prompt_for(ids, n_text: int) -> Prompt:
    s = ids.structural
    text = [1000 + (31 * k) % 5000 for k in range(n_text)]
    globals_ = [ids.global_base + (k * 97) % 4096 for k in range(32)]
    p = (s["task_tts"], s["start_content"], *text, s["end_content"], s["start_global_token"], *globals_,
         s["end_global_token"], s["start_semantic_token"])
    return Prompt(p, tuple(range(ids.semantic_base, ids.semantic_base + SEMANTIC_CODEBOOK)))


async def one(lane: GraphLane, prompt: Prompt, seed: int) -> dict[str, float]:
    t0 = time.perf_counter()
    marks, count = {}, 0
    async for delta in lane.stream(prompt, SamplingOptions(max_tokens=TOKENS, seed=seed), f"p{seed}"):
        count += len(delta)
        for k in (1, 20, TOKENS):
            if count >= k and k not in marks:
                marks[k] = time.perf_counter() - t0
    return {"first_ms": marks[1] * 1e3, "twentieth_ms": marks[20] * 1e3,
            "ms_per_token": (marks[TOKENS] - marks[1]) * 1e3 / (TOKENS - 1)}


async def side_by_side(lane: GraphLane, prompt: Prompt, n: int) -> dict[str, float]:
    """n streams started together: per-stream ms per token and first-token time (median), all streams' tokens/s."""
    t0 = time.perf_counter()
    runs = await asyncio.gather(*(one(lane, prompt, 100 + k) for k in range(n)))
    wall = time.perf_counter() - t0
    return {"ms_per_token": round(statistics.median(r["ms_per_token"] for r in runs), 3),
            "first_ms": round(statistics.median(r["first_ms"] for r in runs), 2),
            "tokens_per_s": round(n * TOKENS / wall)}


async def greedy(lane: GraphLane, prompt: Prompt) -> list[int]:
    opts = SamplingOptions(temperature=0, max_tokens=TOKENS)
    return [t async for delta in lane.stream(prompt, opts, "greedy") for t in delta]


async def measure(lane: GraphLane, prompt: Prompt) -> dict[str, float]:
    for s in range(2):
        await one(lane, prompt, s)
    runs = [await one(lane, prompt, 10 + s) for s in range(5)]
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    info = load_model_info(args.model)
    model = AutoModelForCausalLM.from_pretrained(str(info.llm_dir), dtype=torch.bfloat16)
    allowed = prompt_for(info.token_ids, 1).allowed_ids
    out = {"device": torch.cuda.get_device_name(), "tokens": TOKENS, "cases": {}, "same_tokens_as_eager": {}}
    tokens: dict[str, list[int]] = {}
    for name, kwargs in [("graphs", {}), ("eager", {"capture": False})] + (
            [("graphs+compile", {"compile_layers": True})] if args.compile else []):
        t0 = time.perf_counter()
        lane = GraphLane(model, info.token_ids, allowed, **kwargs)
        build = time.perf_counter() - t0
        case = {"build_s": round(build, 1), "capture_s": round(lane.capture_s, 1)}
        for n_text in (20, 100):
            case[f"prompt_{n_text + 38}"] = asyncio.run(measure(lane, prompt_for(info.token_ids, n_text)))
        case["together"] = {n: asyncio.run(side_by_side(lane, prompt_for(info.token_ids, 20), n))
                            for n in (1, 2, 4, 8, 16)}
        tokens[name] = asyncio.run(greedy(lane, prompt_for(info.token_ids, 40)))
        out["cases"][name] = case
        print(name, case, flush=True)
        del lane
        torch.cuda.empty_cache()
    for name in tokens:
        same = next((i for i, (a, b) in enumerate(zip(tokens[name], tokens["eager"])) if a != b), TOKENS)
        out["same_tokens_as_eager"][name] = same
    print("greedy tokens equal to the eager lane's, of", TOKENS, ":", out["same_tokens_as_eager"], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
