"""Where an export's render time goes on the GPU: the deterministic engine, as `voicectl export` builds it.

    python lab/export_profile.py MODEL_DIR OUT.json [SENTENCES]

Any family. Start-up phases; then the decoder alone (whole-sentence decodes one after another, ms each); then the sentences
rendered with the decoder replaced by silence of the right length (the lane and the pipeline alone); then the
real render. x real time = audio seconds / wall seconds.
"""
from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time


async def main(model: str, out: str, n: int) -> None:
    import numpy as np

    from engine.backends.graph_gen import LaneRouter
    from engine.book import book_sentences, read_book
    from engine.config import SamplingOptions
    from engine.events import StartupPhase
    from engine.export_plan import ExportPlan, ExportSettings, Parts, render_parts
    from engine.factory import EngineConfig, build_synthesizer, lane_rows
    from engine.families import family
    from voiceapp.cli.export import GPU_SPARE_JOBS, export_config
    from lab.startup_bench import book_text

    phases: dict[str, float] = {}

    def on_event(e) -> None:
        if isinstance(e, StartupPhase):
            phases[e.name] = round(phases.get(e.name, 0.0) + e.seconds, 3)

    t0 = time.perf_counter()
    synth = build_synthesizer(export_config(EngineConfig(model=model)), events=on_event)
    result = {"build_s": round(time.perf_counter() - t0, 2), "phases": phases}
    book = read_book("b.txt", book_text(n))
    sentences = tuple(book_sentences(book, 280))
    settings = ExportSettings(input_sha256="x", voice="default", voice_fingerprint="x", seed=0, sampling="x", join="x",
                              schedule="x")
    plan = ExportPlan(book, sentences, settings, SamplingOptions(seed=0))
    jobs = lane_rows(synth.generator) + GPU_SPARE_JOBS  # as voicectl export

    kind = family(synth.model_info.family)
    item = kind.probe_item(kind.whole_codes)  # a whole-sentence decode, as export runs them
    synth.decoder.decode([item])
    t = time.perf_counter()
    for _ in range(40):
        synth.decoder.decode([item])
    result["decode_whole_ms"] = round((time.perf_counter() - t) / 40 * 1e3, 2)
    result["whole_codes"] = kind.whole_codes

    async def timed(name: str) -> None:
        with tempfile.TemporaryDirectory() as d:
            parts = Parts(__import__("pathlib").Path(d))
            samples = []
            t = time.perf_counter()
            await render_parts(synth, plan, parts, list(range(len(sentences))), jobs,
                               lambda i, s: samples.append(s))
            wall = time.perf_counter() - t
        audio = sum(samples) / synth.sample_rate
        result[name] = {"wall_s": round(wall, 2), "audio_s": round(audio, 1), "xrt": round(audio / wall, 1)}
        print(name, result[name], flush=True)

    asked: dict[str, int] = {}
    outer = synth.generator.stream

    def counted(prompt, opts, request_id):  # what the sentences ask of the lanes: prompt ids + token budget
        key = f"{len(prompt.ids)}+{opts.max_tokens}"
        asked[key] = asked.get(key, 0) + 1
        return outer(prompt, opts, request_id)

    synth.generator.stream = counted
    await timed("render")
    result["asked"] = dict(sorted(asked.items(), key=lambda kv: -kv[1])[:12])
    real = synth.decoder.decode
    synth.decoder.decode = lambda items: [np.zeros(len(i.codes) * synth.decoder.samples_per_code, np.float32)
                                          for i in items]
    await timed("render_without_decoder")
    synth.decoder.decode = real
    lanes, generator = [], synth.generator
    while isinstance(generator, LaneRouter):  # the fixed lanes, shortest first, in front of the fallback
        lanes.append({"rows": generator.lane.rows, "max_len": generator.lane.max_len,
                      "busy_ms": round(generator.lane.busy_ms, 1), "idle_ms": round(generator.lane.idle_ms, 1),
                      "streams": generator.lane_streams, "handoffs": generator.handoffs})
        generator = generator.primary
    result["lanes"] = lanes
    await synth.close()
    print(json.dumps(result, indent=1))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 400))
