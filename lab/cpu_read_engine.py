"""A read's text through the engine alone, no player: its RTF, decode time and windows.

Usage: python -m lab.cpu_read_engine --model DIR [--text lab/read60.txt] [--quantize auto|none|int8|int4]
Through the real player (`lab/cpu_player_read.sh`) a long read's wall time cannot fall much below its audio: once
the player's ring is full, `speak` waits on playback while the LLM goes on in the background. This measures the
same request synthesized as fast as the engine can. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from engine.config import QUANTIZE


async def run(args) -> dict:
    from engine.config import SamplingOptions, SynthesisRequest
    from engine.events import ChunkDecoded, RequestFinished
    from engine.factory import EngineConfig, build_synthesizer

    events: list = []
    synth = build_synthesizer(EngineConfig(model=str(args.model), backend="torch", quantize=args.quantize,
                                           cache_dir=tempfile.mkdtemp()), events=events.append)
    await synth.voice_globals("leo")
    events.clear()
    t = time.perf_counter()
    samples = 0
    request = SynthesisRequest(args.text.read_text(), voice="leo", options=SamplingOptions(seed=1))
    async for chunk in synth.synthesize(request):
        samples += len(chunk.samples)
    wall = time.perf_counter() - t
    done = next(e for e in events if isinstance(e, RequestFinished))
    decoded = [e for e in events if isinstance(e, ChunkDecoded)]
    await synth.close()
    return {"quantize": args.quantize, "llm": synth.generator.llm_path(), "audio_s": round(samples / 16000, 2),
            "wall_s": round(wall, 2), "rtf": round(done.rtf, 3), "tokens": done.tokens, "windows": len(decoded),
            "decode_s": round(sum(e.decode_s for e in decoded), 2), "load_avg_1m": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--text", type=Path, default=Path(__file__).with_name("read60.txt"))
    ap.add_argument("--quantize", choices=["auto", *QUANTIZE], default="auto")
    print(json.dumps(asyncio.run(run(ap.parse_args()))))


if __name__ == "__main__":
    main()
