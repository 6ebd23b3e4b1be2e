"""Where a CPU LLM step's time goes: the int8 layers' run, the LM head, sampling, and the rest of the loop.

Usage: python -m lab.cpu_step_breakdown --model DIR [--threads N] [--llm-threads N] [--tokens 150] [--rounds 3]
Wraps OrtQwen2.forward, OrtHead.__call__ and sample_token with timers and streams `--tokens` tokens through the
generator as the engine builds it (engine.factory.cpu_pools unless threads are given). Prints one JSON line a round.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import tempfile
import time

ACC: dict[str, float] = collections.defaultdict(float)
COUNT: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            ACC[label] += time.perf_counter() - t
            COUNT[label] += 1
    setattr(owner, name, wrapper)


async def run(args) -> None:
    import engine.backends.qwen2_ort as qo
    import engine.backends.torch_gen as tg
    from engine.backends.torch_gen import measure_throughput
    from engine.factory import EngineConfig, build_synthesizer
    from engine.prompt import build_globals_prompt

    timed(qo.OrtQwen2, "forward", "layers")
    timed(qo.OrtHead, "__call__", "head")
    timed(tg, "sample_token", "sample")
    timed(tg.TorchTokenGenerator, "_step", "step")
    pools = {"llm_threads": args.llm_threads} if args.llm_threads else {}
    synth = build_synthesizer(EngineConfig(model=str(args.model), backend="torch", threads=args.threads,
                                           cache_dir=tempfile.mkdtemp(), **pools))
    voice = await synth.voice_globals("leo")
    prompt = build_globals_prompt("Measuring the real pipeline on the processor, one sentence at a time.", voice,
                                  synth.grammar.token_ids, synth.grammar.encode)
    for r in range(args.rounds):
        ACC.clear()
        COUNT.clear()
        t = time.perf_counter()
        tok_s = await measure_throughput(synth.generator, prompt, args.tokens)
        wall = time.perf_counter() - t
        steps = COUNT["step"]
        # layers/head/sample include the prefill and the warm-up stream; "step" is decode steps only
        per = {k: round(1000 * v / max(COUNT[k], 1), 3) for k, v in ACC.items()}
        print(json.dumps({"round": r, "tok_s": round(tok_s, 1), "ms_per_call": per, "calls": dict(COUNT),
                          "wall_ms_per_step": round(1000 * wall / max(steps, 1), 3),
                          "llm_pool": synth.generator.static.threads, "load_avg_1m": os.getloadavg()[0]}))
    await synth.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--llm-threads", type=int)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
