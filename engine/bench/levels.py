"""Runs one level: `n` streams at once through the synthesizer's public API, their chunks, token and decode
times recorded, and the collector's pauses meanwhile."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from engine.bench.generator import FixedLengthGenerator, TokenTimes
from engine.bench.playback import StreamRecord
from engine.bench.summary import FIRST_CALLS_REPORTED, LevelResult, summarize
from engine.config import SamplingOptions, SynthesisRequest, request_of, sentence_id
from engine.pauses import GcPauses

async def run_streams(synth: Any, gen: FixedLengthGenerator, n: int, *, text: str, voice: str,
                      preroll_s: float = 0.2, label: str = "s") -> tuple[
                          list[StreamRecord], list[TokenTimes], dict[str, TokenTimes]]:
    """Start `n` requests at once and record their chunks; also the token timings of all their sentences and
    of their first sentences (by request id)."""
    records: list[StreamRecord] = []

    async def one(i: int) -> None:
        req = SynthesisRequest(text, voice=voice, options=SamplingOptions(), request_id=f"{label}{n}-{i}")
        rec = StreamRecord(time.perf_counter(), request_id=req.request_id)
        records.append(rec)
        async for chunk in synth.synthesize(req):
            rec.chunks.append((time.perf_counter(), len(chunk.samples)))

    await asyncio.gather(*(one(i) for i in range(n)))
    ids = {f"{label}{n}-{i}" for i in range(n)}
    mine = [rid for rid in gen.times if request_of(rid) in ids]
    times = [gen.times[rid] for rid in mine]
    firsts = {request_of(rid): gen.times[rid] for rid in mine if rid == sentence_id(request_of(rid), 0)}
    for rid in mine:
        del gen.times[rid]
    return records, times, firsts


class DecodeLog:
    """Event sink (chained after the bench's own): when each window of each request's first sentence was
    submitted to the decoder and when its audio came back, from the ChunkDecoded events."""

    def __init__(self) -> None:
        self.times: dict[str, list[tuple[float, float, int]]] = {}
        """request id -> (submitted, audio back, new codes) per window of its first sentence."""

    def record(self, event: Any) -> None:
        from engine.events import ChunkDecoded

        if isinstance(event, ChunkDecoded) and event.sentence_index == 0:
            self.times.setdefault(event.request_id, []).append((event.t - event.decode_s, event.t, event.codes))


async def measure_level(synth: Any, gen: FixedLengthGenerator, n: int, *, text: str, voice: str, rounds: int = 1,
                        preroll_s: float = 0.2, decodes: DecodeLog | None = None) -> LevelResult:
    with GcPauses() as pauses:
        level = await _measure_level(synth, gen, n, text=text, voice=voice, rounds=rounds, preroll_s=preroll_s,
                                     decodes=decodes)
    level.gc_full_collections = pauses.runs[2]
    level.gc_pause_ms_max = max(pauses.longest_ms)
    return level


async def _measure_level(synth: Any, gen: FixedLengthGenerator, n: int, *, text: str, voice: str, rounds: int,
                         preroll_s: float, decodes: DecodeLog | None) -> LevelResult:
    stats0 = (synth.batcher.stats.calls, synth.batcher.stats.items, synth.batcher.stats.capped)
    router = lane_router(gen)
    lane = router.lane if router is not None else None
    lane0 = (lane.busy_ms, lane.idle_ms) if lane is not None else None
    if decodes is not None:
        decodes.times.clear()  # what unmeasured requests (warm-up, export) left behind
    records: list[StreamRecord] = []
    times: list[TokenTimes] = []
    firsts: dict[str, TokenTimes] = {}
    t0 = time.perf_counter()
    for r in range(rounds):
        recs, ts, fs = await run_streams(synth, gen, n, text=text, voice=voice, preroll_s=preroll_s,
                                         label=f"r{r}s")
        records += recs
        times += ts
        firsts.update(fs)
    wall = time.perf_counter() - t0
    calls = synth.batcher.stats.calls - stats0[0]
    items = synth.batcher.stats.items - stats0[1]
    schedule = synth.schedule.busy() if n > synth.schedule.busy_streams else synth.schedule
    per_code = synth.grammar.tokens_per_code
    first_tokens = (schedule.first_new + schedule.right_context(0)) * per_code
    mine = {r.request_id: decodes.times[r.request_id] for r in records
            if decodes is not None and r.request_id in decodes.times}
    level = summarize(n, records, times, firsts, synth.sample_rate, preroll_s, first_tokens, wall,
                      items / calls if calls else 0.0, mine, right=schedule.right_context(0), tokens_per_code=per_code)
    level.decode_calls, level.decode_capped = calls, synth.batcher.stats.capped - stats0[2]
    level.decode_first_calls = [size for number, size in synth.batcher.stats.recent
                                if stats0[0] < number <= stats0[0] + FIRST_CALLS_REPORTED]
    if lane is not None and lane0 is not None and lane.busy_ms > lane0[0]:
        level.lane_busy_ms, level.lane_idle_ms = lane.busy_ms - lane0[0], lane.idle_ms - lane0[1]
    return level


def lane_router(gen: FixedLengthGenerator) -> Any:
    """The LaneRouter behind the bench's generator, or None when the engine has no graph lane."""
    inner = getattr(gen, "inner", None)
    return inner if hasattr(inner, "lane") else None
