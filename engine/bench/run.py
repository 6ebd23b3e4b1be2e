"""The whole pipeline benchmark: one engine built as `voicectl serve` builds it, its levels, then its variants
(another window schedule, the lane off, another switch interval or burst) on the same engine."""
from __future__ import annotations

import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from engine.bench.generator import BENCH_GLOBALS, SENTENCE, FixedLengthGenerator
from engine.bench.levels import DecodeLog, lane_router, measure_level, run_streams
from engine.bench.summary import describe_level, level_json
from engine.windowing import WindowSchedule

STREAM_LEVELS = (1, 8, 32, 64, 128)


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except ImportError:
        pass
    return f"CPU ({platform.processor() or platform.machine()})"


def write_voice(folder: Path, name: str = "bench") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(
        f'name = "{name}"\ndescription = "benchmark voice"\nglobal_tokens = {list(BENCH_GLOBALS)}\n', encoding="utf-8")
    return name


@dataclass(frozen=True, slots=True)
class Variant:
    """Another configuration of the same engine, measured after the main levels."""

    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    lane: bool = True
    """False: every stream on vLLM (the graph lane's A/B on one machine, one process)."""
    switch_s: float | None = None
    """The interpreter's thread switch interval meanwhile (sys.setswitchinterval; default 5 ms): how long the lane's
    worker may wait for the GIL after each launch while the event loop runs Python."""
    burst: int | None = None
    """Decode steps per read-back while the lane runs up to 8 streams (GraphLane.bursts; default BURST = 2)."""


@dataclass
class BenchOptions:
    model: Path
    tokens: int = 250
    """Semantic tokens per sentence (fixed: 250 = 5 s of audio)."""
    sentences: int = 2
    """Sentences per stream."""
    levels: Sequence[int] = STREAM_LEVELS
    rounds_1: int = 8
    """Sequential repeats at 1 stream (TTFA percentiles need samples)."""
    preroll_s: float = 0.2
    backend: str = "auto"
    decoder_dtype: str = "auto"
    decoder_autotune: str = "all"
    """As `voicectl serve` (the many-streams configuration this measures); see EngineConfig.decoder_autotune."""
    schedule: WindowSchedule | None = None
    """None: the model family's."""
    threads: int | None = None
    variants: dict[str, tuple[Variant, Sequence[int]]] = field(default_factory=dict)
    """Other configurations to measure, each at its own stream counts, on the same engine."""


async def run_pipeline_bench(opts: BenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    from engine.events import Notice
    from engine.factory import EngineConfig, build_synthesizer
    from engine.families import family_of
    from engine.voices import VoiceBank

    notices: list[str] = []
    decodes = DecodeLog()

    def on_event(event: Any) -> None:
        decodes.record(event)
        if isinstance(event, Notice):
            notices.append(event.message)
            log(f"  [engine] {event.message}")

    with tempfile.TemporaryDirectory(prefix="voiceapp-bench-") as tmp:
        family = family_of(opts.model)
        if family.cached_voices:  # a voice of stored conditioning: nothing to compute first
            voice, voices = write_voice(Path(tmp) / "voices"), VoiceBank([Path(tmp) / "voices"])
        else:  # a voice the model knows by name
            voices = family.voices()
            voice = voices.default
        t0 = time.perf_counter()
        synth = build_synthesizer(EngineConfig(model=str(opts.model), backend=opts.backend, schedule=opts.schedule,
                                               voices=voices, cache_dir=str(Path(tmp)),
                                               threads=opts.threads, decoder_dtype=opts.decoder_dtype,
                                               decoder_autotune=opts.decoder_autotune,
                                               lane_rows=None),  # a lane sized for crowds, as `voicectl serve`
                                  events=on_event)
        build_s = time.perf_counter() - t0
        inner = synth.generator
        gen = FixedLengthGenerator(inner, opts.tokens, synth.grammar.token_ids.stop_ids)
        synth.swap_generator(gen)
        text = " ".join([SENTENCE] * opts.sentences)
        result: dict[str, Any] = {
            "generator": type(inner).__name__, "decoder_device": str(getattr(synth.decoder, "device", "?")),
            "decoder_dtype": str(getattr(synth.decoder, "dtype", "?")).replace("torch.", ""),
            "engine_build_s": round(build_s, 1), "notices": notices,
            "vllm_start_s": getattr(inner, "start_s", None), "vllm_warmup_s": getattr(inner, "warmup_s", None),
            "levels": []}
        try:
            # one untimed request: first-use costs of the pipeline itself (not the engine warm-up) stay out
            await run_streams(synth, gen, 1, text=SENTENCE, voice=voice, label="warm")
            for n in opts.levels:
                rounds = opts.rounds_1 if n == 1 else (2 if n <= 8 else 1)
                level = await measure_level(synth, gen, n, text=text, voice=voice, rounds=rounds,
                                            preroll_s=opts.preroll_s, decodes=decodes)
                result["levels"].append(level_json(level))
                log(f"  {n:>4} streams: {describe_level(level)}")
            for name, (variant, levels) in opts.variants.items():
                result.setdefault("variants", {})[name] = await _measure_variant(
                    synth, gen, variant, levels, opts, text=text, voice=voice, log=log, name=name, decodes=decodes)
            router = lane_router(gen)
            if router is not None:
                result["lane"] = {"streams": router.lane_streams, "served": router.lane.served,
                                  "capture_s": round(router.lane.capture_s, 1)}
            result["batcher"] = {"calls": synth.batcher.stats.calls, "items": synth.batcher.stats.items,
                                 "max_batch": synth.batcher.stats.max_batch,
                                 "mean_batch": round(synth.batcher.stats.mean_batch, 2)}
        finally:
            await synth.close()
    return result


async def _measure_variant(synth: Any, gen: FixedLengthGenerator, variant: Variant, levels: Sequence[int],
                           opts: BenchOptions, *, text: str, voice: str, log: Callable[[str], None], name: str,
                           decodes: DecodeLog | None = None) -> dict[str, Any]:
    """TTFA etc. with another window schedule (graphs captured for its shapes first) or with the graph lane off,
    on the same engine; the original settings are restored afterwards."""
    schedule = variant.schedule
    router = lane_router(gen)
    lane_was = router.enabled if router is not None else None
    bursts_were = router.lane.bursts if router is not None else None
    switch_was = sys.getswitchinterval()
    if router is not None:
        router.enabled = variant.lane
        if variant.burst is not None:
            router.lane.bursts = tuple((most, n if most is None else variant.burst) for most, n in router.lane.bursts)
    if variant.switch_s is not None:
        sys.setswitchinterval(variant.switch_s)
    try:
        with synth.scheduled(schedule) as lengths:
            if lengths:
                synth.decoder.warmup(lengths)
            return await _measure_levels(synth, gen, variant, levels, opts, text=text, voice=voice, log=log,
                                         name=name, decodes=decodes)
    finally:
        sys.setswitchinterval(switch_was)
        if router is not None:
            router.enabled, router.lane.bursts = lane_was, bursts_were


async def _measure_levels(synth: Any, gen: FixedLengthGenerator, variant: Variant, levels: Sequence[int],
                          opts: BenchOptions, *, text: str, voice: str, log: Callable[[str], None], name: str,
                          decodes: DecodeLog | None) -> dict[str, Any]:
    """The variant's levels, its settings already in place."""
    schedule = variant.schedule
    out: dict[str, Any] = {"schedule": {k: getattr(schedule, k) for k in schedule.__slots__},
                           "lane": variant.lane, "switch_s": sys.getswitchinterval(),
                           "burst": variant.burst, "levels": []}
    for n in levels:
        rounds = opts.rounds_1 if n == 1 else 1
        level = await measure_level(synth, gen, n, text=text, voice=voice, rounds=rounds, preroll_s=opts.preroll_s,
                                    decodes=decodes)
        out["levels"].append(level_json(level))
        log(f"  [{name}] {n:>4} streams: {describe_level(level)}")
    return out
