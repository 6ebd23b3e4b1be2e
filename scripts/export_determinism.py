"""Does a sentence's exported audio depend on what renders beside it? (What `voicectl export --resume` relies on.)

    python scripts/export_determinism.py --backend torch --tiny
    python scripts/export_determinism.py --backend vllm --model DIR              # export's engine (deterministic)
    python scripts/export_determinism.py --backend vllm --model DIR --fast       # the default engine, for contrast

One engine, built as `voicectl export` builds it. The same N seeded sentences render three ways: one at a time,
all N at once, and in reverse order N/2 at a time beside N/2 unrelated requests. Each sentence's 16-bit PCM (what
the export writes) is hashed; the script reports how many sentences came out identical in all three, and exits 1
if any differ.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
import time

SENTENCES = ("The ferry left the harbour a little after nine, heavy with crates of apples.",
             "Nobody on the quay could say where the captain had gone.",
             "Rain moved in from the west and the gulls went quiet.",
             "She counted the lamps along the pier and lost count twice.",
             "By noon the wind had turned, and the sails were no use at all.",
             "A boy with a red scarf ran the length of the deck, shouting.")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="auto")
    p.add_argument("--model")
    p.add_argument("--tiny", action="store_true", help="write and use a tiny random-weight checkpoint")
    p.add_argument("--sentences", type=int, default=24)
    p.add_argument("--fast", action="store_true", help="the default (not deterministic) engine")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="determinism-") as root:
        model = args.model
        if args.tiny:
            from engine.synthetic import write_checkpoint

            model = str(write_checkpoint(os.path.join(root, "tiny"), size="tiny", seed=0))
        result = asyncio.run(run(model, args.backend, args.sentences, not args.fast, root))
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["identical"] == result["sentences"] else 1


async def run(model: str | None, backend: str, n: int, deterministic: bool, root: str) -> dict:
    from engine.export_plan import make_batch_invariant
    from engine.factory import EngineConfig, build_synthesizer
    from engine.protocol import describe_engine

    t = time.perf_counter()
    synth = build_synthesizer(EngineConfig(model=model, backend=backend, deterministic=deterministic,
                                           cache_dir=os.path.join(root, "cache")))
    build_s = time.perf_counter() - t
    try:
        make_batch_invariant(synth)
        texts = [SENTENCES[i % len(SENTENCES)] for i in range(n)]
        t = time.perf_counter()
        one_by_one = [await render(synth, texts[i], i) for i in range(n)]
        sequential_s = time.perf_counter() - t
        t = time.perf_counter()
        together = await asyncio.gather(*(render(synth, texts[i], i) for i in range(n)))
        together_s = time.perf_counter() - t
        mixed = await reversed_beside_others(synth, texts)
        same = [a == b == c for a, b, c in zip(one_by_one, together, mixed)]
        return {"backend": describe_engine(synth)["backend"], "deterministic": deterministic,
                "sentences": n, "identical": sum(same), "differing": [i for i, ok in enumerate(same) if not ok],
                "engine_build_s": round(build_s, 1), "one_at_a_time_s": round(sequential_s, 2),
                "all_at_once_s": round(together_s, 2)}
    finally:
        await synth.close()


async def render(synth, text: str, index: int, seed: int = 0) -> str:
    """sha256 of the 16-bit PCM the export would write for this sentence."""
    from engine.config import SamplingOptions, SynthesisRequest
    from engine.export_plan import to_pcm16
    from engine.pipeline import sentence_seed

    req = SynthesisRequest(text, options=SamplingOptions(seed=sentence_seed(seed, index)),
                           request_id=f"det-{index}-{time.perf_counter_ns()}")
    return hashlib.sha256(to_pcm16(await synth.render(req))).hexdigest()


async def reversed_beside_others(synth, texts: list[str]) -> list[str]:
    """Every sentence again, in reverse order, half as many at a time, each batch sharing the GPU with as many
    unrelated requests (other seeds): a different batch composition at every step."""
    n = len(texts)
    width = max(1, n // 2)
    out: list[str] = [""] * n
    order = list(reversed(range(n)))
    for k in range(0, n, width):
        batch = order[k:k + width]
        results = await asyncio.gather(*(render(synth, texts[i], i) for i in batch),
                                       *(render(synth, texts[i], i, seed=99) for i in batch))
        for i, digest in zip(batch, results):
            out[i] = digest
    return out


if __name__ == "__main__":
    sys.exit(main())
