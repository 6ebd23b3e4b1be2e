"""Measure TorchTokenGenerator decode speed on a random-init Qwen2 of Spark-TTS-0.5B's LLM shape (or a tiny one).

    python -m lab.torch_gen_speed                      # full size, 2 threads, 60-token prompt, 200 tokens
    python -m lab.torch_gen_speed --tiny --threads 2
    python -m lab.torch_gen_speed --device cuda --dtype bf16
    python -m lab.torch_gen_speed --transformers-forward   # the CPU without the static forward

Random weights: the numbers measure the loop and the device, not speech. Sampling is restricted to semantic ids
with no stop id (format (c) minus the stops), so every run produces exactly --tokens tokens.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.backends.torch_gen import TorchTokenGenerator, measure_throughput
from engine.config import SamplingOptions
from engine.prompt import Prompt
from engine.tokens import SEMANTIC_CODEBOOK, TokenIds

FULL = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
            intermediate_size=4864, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
"""Spark-TTS-0.5B `LLM/config.json` (sparktts-format.md §2.1)."""
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_model(tiny: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=166000, tie_word_embeddings=True, **(TINY if tiny else FULL))
    return Qwen2ForCausalLM(config).eval()


def build_prompt(ids: TokenIds, n: int) -> Prompt:
    """~n ids shaped like format (c): task, content, 32 globals, start_semantic."""
    s = ids.structural
    text = [1000 + i for i in range(max(1, n - 38))]
    globals_ = [ids.global_base + (i * 97) % 4096 for i in range(32)]
    prompt = (s["task_tts"], s["start_content"], *text, s["end_content"], s["start_global_token"], *globals_,
              s["end_global_token"], s["start_semantic_token"])
    return Prompt(prompt, tuple(range(ids.semantic_base, ids.semantic_base + SEMANTIC_CODEBOOK)))


async def time_first_token(gen: TorchTokenGenerator, prompt: Prompt) -> float:
    start = time.perf_counter()
    async for _ in gen.stream(prompt, SamplingOptions(max_tokens=1, seed=0), "ttft"):
        pass
    return time.perf_counter() - start


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the 2-layer test model instead of the full size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--device", default=None, help="default: cuda, else mps, else cpu")
    ap.add_argument("--dtype", choices=DTYPES, default=None, help="default: bf16 on cuda, else fp32")
    ap.add_argument("--transformers-forward", action="store_true",
                    help="step through transformers' forward, not the static one (the default on the CPU)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    model = build_model(args.tiny)
    ids = TokenIds()
    with tempfile.TemporaryDirectory() as folder:
        # a checkpoint folder steps through the static forward on the CPU; a model object, through its own forward
        source = model if args.transformers_forward else folder
        if not args.transformers_forward:
            model.save_pretrained(folder)
        gen = TorchTokenGenerator(source, ids, device=args.device, dtype=DTYPES.get(args.dtype), threads=args.threads)
    prompt = build_prompt(ids, args.prompt_tokens)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {'tiny' if args.tiny else 'full'} {n_params / 1e6:.0f}M params, {gen.device} {gen.dtype}, "
          f"{'static' if gen.static is not None else 'transformers'} forward, "
          f"{torch.get_num_threads()} threads, built in {time.perf_counter() - t0:.1f}s")
    try:
        rate = await measure_throughput(gen, prompt, args.tokens)
        ttft = await time_first_token(gen, prompt)
    finally:
        await gen.close()
    print(f"prompt {len(prompt.ids)} tokens: prefill + first token {ttft * 1000:.0f} ms")
    print(f"decode: {rate:.1f} tok/s over {args.tokens} tokens ({rate / 50:.2f}x real time at 50 semantic tok/s)")


if __name__ == "__main__":
    asyncio.run(main())
