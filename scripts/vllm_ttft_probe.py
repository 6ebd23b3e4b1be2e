"""Where does time to first audio go under concurrency? vLLM alone (no decoder, no pipeline), through
VllmTokenGenerator: n requests started at once, each TOKENS tokens; prints TTFT, time-to-20th and -24th token
(what the first windows need) and ms per token after the first, p50/p95, with and without the 8195-id
allowed-ids restriction, with top-k/top-p in vLLM's sampler, in our logits processor
(engine.backends.vllm_logits.TopKTopPLogitsProcessor) or off, and greedy.
Usage (GPU machine): python3 scripts/vllm_ttft_probe.py CHECKPOINT_DIR [--json PATH] [--quick]"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench import percentile  # noqa: E402
from engine.config import SamplingOptions  # noqa: E402
from engine.model import load_model_info  # noqa: E402
from engine.prompt import Prompt  # noqa: E402


def prompt_ids(info, i: int) -> tuple[int, ...]:
    ids = info.token_ids
    s = ids.structural
    text = [1000 + (i * 31 + k) % 5000 for k in range(30)]
    globals_ = [ids.global_base + (k * 97 + i) % 4096 for k in range(32)]
    return (s["task_tts"], s["start_content"], *text, s["end_content"], s["start_global_token"], *globals_,
            s["end_global_token"], s["start_semantic_token"])


TOKENS = 128


async def level(gen, info, n: int, allowed, opts: SamplingOptions) -> dict:
    ttft, t20, t24, per_token = [], [], [], []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        count, first = 0, 0.0
        async for delta in gen.stream(Prompt(prompt_ids(info, i), allowed), opts, f"p{n}-{i}-{time.time_ns()}"):
            now = time.perf_counter()
            if count == 0:
                first = now
                ttft.append((now - t0) * 1e3)
            before, count = count, count + len(delta)
            for mark, into in ((20, t20), (24, t24)):
                if before < mark <= count:
                    into.append((now - t0) * 1e3)
        if count > 1:
            per_token.append((time.perf_counter() - first) * 1e3 / (count - 1))

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t
    return {"n": n, "ttft_p50": round(percentile(ttft, 50), 1), "ttft_p95": round(percentile(ttft, 95), 1),
            "t20_p50": round(percentile(t20, 50), 1), "t24_p50": round(percentile(t24, 50), 1),
            "t24_p95": round(percentile(t24, 95), 1), "ms_per_token_p50": round(percentile(per_token, 50), 3),
            "agg_tok_s": round(n * TOKENS / wall)}


async def main(model: Path, out: Path | None, quick: bool = False) -> None:
    from engine.backends.vllm_gen import VllmTokenGenerator
    from engine.prompt import semantic_allowed_ids

    info = load_model_info(model)
    gen = VllmTokenGenerator(info, events=lambda e: print(" ", getattr(e, "message", e), flush=True),
                             warmup_batches=(1, 8, 32, 64, 128), own_top_k_top_p=True)
    semantic = tuple(t for t in semantic_allowed_ids(info.token_ids) if t not in info.token_ids.stop_ids)
    reference = SamplingOptions(max_tokens=TOKENS)  # t 0.8, top-k 50, top-p 0.95
    temp_only = SamplingOptions(max_tokens=TOKENS, top_k=0, top_p=1.0)
    # (allowed ids, options, top-k/top-p in our processor)
    cases = {"allowed+topk/p (vLLM sampler)": (semantic, reference, False),
             "allowed+topk/p (our processor)": (semantic, reference, True),
             "allowed, temp only": (semantic, temp_only, False),
             "allowed, greedy": (semantic, SamplingOptions(max_tokens=TOKENS, temperature=0.0), False),
             "none, temp only": (None, temp_only, False)}
    if quick:
        cases = dict(list(cases.items())[:2])
    rows = []
    try:
        for name, (allowed, opts, ours) in cases.items():
            gen.own_top_k_top_p = ours
            for n in (1, 1, 1, 8, 32) if quick else (1, 1, 1, 8, 32, 64, 128):
                row = {"case": name, **await level(gen, info, n, allowed, opts)}
                rows.append(row)
                print(row, flush=True)
    finally:
        gen.close_now()
    if out:
        out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    json_out = Path(args[args.index("--json") + 1]) if "--json" in args else None
    asyncio.run(main(Path(args[0]), json_out, "--quick" in args))
