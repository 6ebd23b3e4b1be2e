"""Do vLLM's seeded tokens for one request depend on what else is in the batch? (Export determinism, on the GPU.)

    python scripts/vllm_invariance_probe.py MODEL_DIR [--invariant] [--json OUT.json]

vLLM alone (our VllmTokenGenerator, our allowed-ids logits processor), no decoder. For each sampling setting,
8 seeded requests run one at a time, then again all at once beside 16 unrelated ones; the script reports how many
token sequences came out identical and where the first difference is. --invariant starts vLLM with
VLLM_BATCH_INVARIANT=1 (what `voicectl export` uses).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

N, FILLERS, TOKENS = 8, 16, 200


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--invariant", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    rows = asyncio.run(probe(args.model, args.invariant))
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"invariant": args.invariant, "cases": rows}, f, indent=1)
    return 0


def prompt(info, k: int):
    from engine.prompt import Prompt

    ids = info.token_ids
    s = ids.structural
    text = [1000 + (k * 37 + j * 11) % 5000 for j in range(20 + k % 7)]
    globals_ = [ids.global_base + (j * 97 + k) % 4096 for j in range(32)]
    body = (s["task_tts"], s["start_content"], *text, s["end_content"], s["start_global_token"], *globals_,
            s["end_global_token"], s["start_semantic_token"])
    return Prompt(body, tuple(range(ids.semantic_base, ids.semantic_base + 8192)))


async def probe(model: str, invariant: bool) -> list[dict]:
    from engine.backends.vllm_gen import VllmTokenGenerator
    from engine.config import SamplingOptions
    from engine.model import load_model_info

    info = load_model_info(model)
    gen = VllmTokenGenerator(info, warmup_batches=(1, 8, 32), batch_invariant=invariant)
    cases = {"reference sampling (t 0.8, top-k 50, top-p 0.95)": {},
             "temperature only (t 0.8)": {"top_k": 0, "top_p": 1.0},
             "greedy": {"temperature": 0.0}}
    rows = []
    try:
        for name, knobs in cases.items():
            def opts(seed: int) -> SamplingOptions:
                return SamplingOptions(seed=seed, max_tokens=TOKENS, **knobs)  # noqa: B023

            async def run(k: int, seed: int, tag: str) -> list[int]:
                return [t async for d in gen.stream(prompt(info, k), opts(seed), f"{tag}-{k}-{seed}") for t in d]

            alone = [await run(k, k, "alone") for k in range(N)]
            crowd = await asyncio.gather(*(run(k, k, "crowd") for k in range(N)),
                                         *(run(k, 1000 + k, "filler") for k in range(FILLERS)))
            first_diff = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                          for x, y in zip(alone, crowd[:N])]
            rows.append({"case": name, "identical": sum(d is None for d in first_diff), "of": N,
                         "first_difference_at": first_diff})
    finally:
        gen.close_now()
    return rows


if __name__ == "__main__":
    sys.exit(main())
