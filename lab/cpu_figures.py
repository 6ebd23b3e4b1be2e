"""CPU figures for the closing notes: torch generator tok/s, BiCodec decode speed, TTFA / RTF / seam error.

Usage: python -m lab.cpu_figures --size tiny|full [--threads 2] [--tokens 150] [--quantize none|int8|int4]
       [--model DIR] [--decoder-dtype auto|fp32|bf16] [--schedule FIRST,NEW,GROWTH,MAX] [--no-crop]
       [--llm-threads N] [--llm-spin]
Builds the synthetic checkpoint in a temporary directory (deleted afterwards; or uses --model's) and runs the real
pipeline (torch generator + our BiCodec decoder) on the CPU. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from engine.config import QUANTIZE


async def measure(model: Path, threads: int | None, tokens: int, quantize: str = "auto", decoder_dtype: str = "auto",
                  schedule: str | None = None, crop: bool = True, llm_threads: int | None = None,
                  spin: bool = False) -> dict:
    from engine.backends.base import DecodeItem
    from engine.backends.torch_gen import measure_throughput
    from engine.config import SamplingOptions, SynthesisRequest
    from engine.crossfade import fade_edges
    from engine.events import FirstAudio, RequestFinished
    from engine.factory import EngineConfig, build_synthesizer
    from engine.pipeline import sentence_seed
    from engine.prompt import build_globals_prompt
    from engine.seams import seam_error_db
    from engine.tokens import parse_all
    from lab.decoder_context_table import timed

    events: list = []
    if spin:  # an experiment: ONNX Runtime's threads spin between the step's kernels instead of sleeping
        from engine.backends import qwen2_ort
        session = qwen2_ort._session
        qwen2_ort._session = lambda model, threads, spin=False: session(model, threads, True)
    from engine.windowing import WindowSchedule

    knobs = dict(zip(("first_new", "new", "growth", "max_new"), map(float, schedule.split(",")))) if schedule else {}
    sched = WindowSchedule(**{k: (v if k == "growth" else int(v)) for k, v in knobs.items()})
    synth = build_synthesizer(EngineConfig(model=str(model), backend="torch", threads=threads, schedule=sched,
                                           cache_dir=tempfile.mkdtemp(), quantize=quantize, llm_threads=llm_threads,
                                           decoder_dtype=decoder_dtype), events=events.append)
    synth.decoder.crops = synth.decoder.crops and crop
    globals_ = await synth.voice_globals("leo")
    text = "Measuring the real pipeline on the processor, one sentence at a time."
    prompt = build_globals_prompt(text, globals_, synth.grammar.token_ids, synth.grammar.encode)
    tok_s = await measure_throughput(synth.generator, prompt, tokens)
    spc = synth.decoder.samples_per_code
    decode = {}
    rng = np.random.default_rng(0)
    for name, n, keep in (("window_12+2x16", 44, 12), ("window_50+2x16", 82, 50)):
        item = DecodeItem(tuple(int(c) for c in rng.integers(0, 8192, n)), globals_, 16, 16 + keep)
        best = timed(synth.decoder, [item], repeats=3)
        decode[name] = {"ms": round(best * 1000, 1), "xrt_kept": round(keep * spc / 16000 / best, 2)}
    # Streaming request: TTFA and RTF; then the one-shot decode of the same tokens for the seam error.
    opts = SamplingOptions(seed=3, max_tokens=tokens)
    events.clear()
    req = SynthesisRequest(text, voice="leo", options=opts)
    streamed = np.concatenate([c.samples async for c in synth.synthesize(req)])
    ttfa = next(e.ttfa_s for e in events if isinstance(e, FirstAudio))
    done = next(e for e in events if isinstance(e, RequestFinished))
    ids = [t async for d in synth.generator.stream(prompt, SamplingOptions(seed=sentence_seed(3, 0),
                                                                           max_tokens=tokens), "x") for t in d]
    codes, _ = parse_all(ids, synth.grammar.token_ids)
    (pcm,) = synth.decoder.decode([DecodeItem(tuple(codes), globals_)])
    fade = int(synth.join.fade_s * synth.sample_rate)
    seam = seam_error_db(streamed, fade_edges(pcm, fade, fade))
    await synth.close()
    import torch

    llm_pool = getattr(synth.generator.static, "threads", None)
    return {"threads": threads, "llm_threads": llm_threads, "spin": spin, "torch_threads": torch.get_num_threads(),
            "llm_pool": llm_pool, "llm": synth.generator.llm_path(), "decoder": str(synth.decoder.dtype),
            "schedule": schedule, "crop": synth.decoder.crops, "generator_tok_s": round(tok_s, 1),
            "decode": decode, "ttfa_ms": round(ttfa * 1000, 1), "rtf": round(done.rtf, 3),
            "audio_s": round(done.audio_s, 2), "seam_error_db": round(seam, 1), "tokens": tokens,
            "load_avg_1m": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--threads", type=int, help="torch's threads (default: engine.factory.cpu_pools)")
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--quantize", choices=["auto", *QUANTIZE], default="auto", help="the LLM's weights")
    ap.add_argument("--model", type=Path, help="a synthetic checkpoint of --size already written (kept)")
    ap.add_argument("--decoder-dtype", choices=["auto", "fp32", "bf16"], default="auto")
    ap.add_argument("--schedule", metavar="FIRST,NEW,GROWTH,MAX", help="the streaming windows (WindowSchedule)")
    ap.add_argument("--no-crop", action="store_true", help="decode whole windows (BiCodecDecoder.crops off)")
    ap.add_argument("--llm-threads", type=int, help="the int8 LLM's pool (EngineConfig.llm_threads)")
    ap.add_argument("--llm-spin", action="store_true", help="the int8 LLM's threads spin while idle")
    args = ap.parse_args()
    from engine.synthetic import write_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="cpu-figures-"))
    try:
        model = args.model or write_checkpoint(tmp / "m", size=args.size, seed=0)
        result = asyncio.run(measure(model, args.threads, args.tokens, args.quantize, args.decoder_dtype,
                                     args.schedule, not args.no_crop, args.llm_threads,
                                     args.llm_spin))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"size": args.size, **result}))


if __name__ == "__main__":
    main()
