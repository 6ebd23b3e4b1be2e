"""Where does time to first audio go under concurrency? vLLM alone (no decoder, no pipeline), through
VllmTokenGenerator: n requests started at once, each 32 tokens; prints TTFT and time-to-24th-token (what the
default first window needs) p50/p95, with and without the 8195-id `allowed_token_ids` restriction and with
top-k/top-p on or off. Usage (GPU machine): python3 scripts/vllm_ttft_probe.py CHECKPOINT_DIR [--json PATH] [--quick]"""
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


async def level(gen, info, n: int, allowed, opts: SamplingOptions) -> dict:
    ttft, t24 = [], []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        count = 0
        async for delta in gen.stream(Prompt(prompt_ids(info, i), allowed), opts, f"p{n}-{i}-{time.time_ns()}"):
            if count == 0:
                ttft.append((time.perf_counter() - t0) * 1e3)
            count += len(delta)
            if count >= 24 and len(t24) < len(ttft) and count - len(delta) < 24:
                t24.append((time.perf_counter() - t0) * 1e3)

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t
    return {"n": n, "ttft_p50": round(percentile(ttft, 50), 1), "ttft_p95": round(percentile(ttft, 95), 1),
            "t24_p50": round(percentile(t24, 50), 1), "t24_p95": round(percentile(t24, 95), 1),
            "agg_tok_s": round(n * 32 / wall)}


async def main(model: Path, out: Path | None, quick: bool = False) -> None:
    from engine.backends.vllm_gen import VllmTokenGenerator
    from engine.prompt import semantic_allowed_ids

    info = load_model_info(model)
    gen = VllmTokenGenerator(info, events=lambda e: print(" ", getattr(e, "message", e), flush=True),
                             warmup_batches=(1, 8, 32, 64, 128))
    semantic = tuple(t for t in semantic_allowed_ids(info.token_ids) if t not in info.token_ids.stop_ids)
    cases = {"allowed+topk/p": (semantic, SamplingOptions(max_tokens=32)),
             "none+topk/p": (None, SamplingOptions(max_tokens=32)),
             "allowed, temp only": (semantic, SamplingOptions(max_tokens=32, top_k=0, top_p=1.0))}
    if quick:
        cases = {k: v for k, v in cases.items() if k == "allowed+topk/p"}
    rows = []
    try:
        for name, (allowed, opts) in cases.items():
            for n in (1, 1, 8, 32, 64, 128, 256):
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
