"""Device probe: where a fresh in-process engine's start-up goes, per variant (one fresh process each).

  python lab/startup_probe.py VARIANT MODEL_DIR   -> one JSON line: phases, engine build, first audio, RTF
Variants: say (as `voicectl say`), autotune_none, eager_decoder (no decoder graphs), no_lane (torch on the GPU),
eager_all (no lane, no decoder graphs).
"""
import json
import sys
import time

T0 = time.perf_counter()


def main(variant: str, model: str) -> None:
    import asyncio
    from dataclasses import replace

    from engine.events import FirstAudio, Notice, RequestFinished, StartupPhase
    from engine.factory import EngineConfig, build_synthesizer

    phases, notes, out = {"launch": time.perf_counter() - T0}, [], {}

    def on(event):
        if isinstance(event, StartupPhase):
            phases[event.name] = phases.get(event.name, 0.0) + event.seconds
        elif isinstance(event, Notice):
            notes.append(event.message)
        elif isinstance(event, FirstAudio):
            out["ttfa_ms"] = event.ttfa_s * 1e3
            out["first_audio_from_launch_s"] = time.perf_counter() - T0
        elif isinstance(event, RequestFinished):
            out["rtf"] = event.rtf

    config = EngineConfig(model=model, one_listener=True)
    if variant in ("autotune_none",):
        config = replace(config, decoder_autotune="none")
    if variant in ("no_lane", "eager_all"):
        config = replace(config, graph_lane=False)
    if variant in ("eager_decoder", "eager_all"):
        from engine.backends.bicodec import BiCodecDecoder

        BiCodecDecoder.warmup = lambda self, lengths, batches=(): 0.0
    t = time.perf_counter()
    synth = build_synthesizer(config, events=on)
    out["build_s"] = time.perf_counter() - t
    from engine.config import SamplingOptions, SynthesisRequest

    req = SynthesisRequest("Hello there. This is a start-up test of the engine.",
                           options=SamplingOptions(seed=1, max_tokens=150))
    async def run():
        await synth.render(req)
        await synth.close()

    asyncio.run(run())
    print(json.dumps({"variant": variant, **out, "phases": phases, "notices": notes}), flush=True)




def decoder_captures(model: str) -> None:
    """Seconds of each decoder graph capture, in the order the one-listener start-up takes them."""
    from engine.backends.bicodec import BiCodecDecoder
    from engine.batching import lengths_for
    from engine.model import load_model_info
    from engine.windowing import WindowSchedule

    import torch

    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    cuda_s = time.perf_counter() - t
    info = load_model_info(model)
    t = time.perf_counter()
    decoder = BiCodecDecoder(info.bicodec_dir, device="cuda", autotune="none")
    load_s = time.perf_counter() - t
    times = []
    for n in lengths_for(WindowSchedule()):
        for b in (1, 4):
            times.append((b, n, decoder.warmup([n], [b])))
    print(json.dumps({"variant": "decoder_captures", "cuda_s": cuda_s, "load_s": load_s, "captures": times}),
          flush=True)


if __name__ == "__main__":
    decoder_captures(sys.argv[2]) if sys.argv[1] == "decoder_captures" else main(sys.argv[1], sys.argv[2])
