"""How long N requests arriving at once take to reach the token generator, and how long a long text's first chunk
takes (host work only: no model runs).

    python lab/request_setup_probe.py [--streams 1,8,32,128] [--text-kb 10,100,1000]

Builds the tiny synthetic checkpoint with the real tokenizer and a stored voice, puts a recorder in place of the
token generator (it notes when each sentence's prompt arrives and never answers), starts N two-sentence
requests at once and prints when their first sentences reached it. Every request's set-up (voice lookup, text
split and normalisation, tokenisation, prompt) runs on the one event loop before any first sentence reaches the
generator, so at a crowd this is a floor under time to first token on any GPU.

Long texts: one request of 10 kB to 1 MB on the fake engine (a scripted generator, 2 ms a token, and a tone
decoder), timed to its first audio chunk: whatever the engine does with the whole text before its first sentence
shows up as growth with the text's size.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from engine.bench import SENTENCE, write_voice
from engine.config import SamplingOptions, SynthesisRequest
from engine.factory import EngineConfig, build_synthesizer
from engine.synthetic import write_checkpoint
from engine.voices import VoiceBank


class Recorder:
    """A token generator that records each stream's arrival and never yields."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []

    async def stream(self, prompt, opts, request_id):
        self.arrivals.append((request_id, time.perf_counter()))
        await asyncio.sleep(3600)
        yield []

    async def abort(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


async def first_sentences_ms(synth, voice: str, n: int) -> list[float]:
    recorder = Recorder()
    synth.swap_generator(recorder)
    text = " ".join([SENTENCE] * 2)

    async def start(i: int) -> None:
        stream = synth.synthesize(SynthesisRequest(text, voice=voice, options=SamplingOptions(seed=i),
                                                   request_id=f"r{i}"))
        try:
            await asyncio.wait_for(stream.__anext__(), 0.5)
        except (asyncio.TimeoutError, StopAsyncIteration):
            pass
        finally:
            await stream.aclose()

    t0 = time.perf_counter()
    await asyncio.gather(*(start(i) for i in range(n)))
    return sorted((t - t0) * 1e3 for rid, t in recorder.arrivals if rid.endswith("-0"))


async def long_texts(sizes_kb: list[int]) -> None:
    synth = build_synthesizer(EngineConfig(backend="fake"))
    words = (SENTENCE + " ") * 2
    for i, kb in enumerate([1] + sizes_kb):  # the first (1 kB) warms up: the fake voice's globals
        text = (words * (kb * 1000 // len(words) + 1))[:kb * 1000]
        t0 = time.perf_counter()
        stream = synth.synthesize(SynthesisRequest(text, request_id=f"long{i}"))
        await stream.__anext__()
        took = (time.perf_counter() - t0) * 1e3
        await stream.aclose()
        if i:
            print(f"{kb:5d} kB text: first audio chunk after {took:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,8,32,128")
    ap.add_argument("--text-kb", default="10,100,1000")
    args = ap.parse_args()
    asyncio.run(long_texts([int(s) for s in args.text_kb.split(",")]))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_checkpoint(root / "model", size="tiny", seed=0)
        voice = write_voice(root / "voices")
        synth = build_synthesizer(EngineConfig(model=str(root / "model"), backend="torch", threads=2,
                                               cache_dir=str(root / "cache"), voices=VoiceBank([root / "voices"])))
        asyncio.run(first_sentences_ms(synth, voice, 2))  # warm: tokenizer, regexes, voice file
        for n in (int(s) for s in args.streams.split(",")):
            got = asyncio.run(first_sentences_ms(synth, voice, n))
            print(f"{n:4d} streams: first sentences reach the generator after {got[0]:.1f} .. {got[-1]:.1f} ms "
                  f"({got[-1] / n:.2f} ms a request)")


if __name__ == "__main__":
    main()
