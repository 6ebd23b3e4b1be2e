"""Provides the benchmark behind `voicectl bench`: our pipeline at 1..128 concurrent streams, decoder
precision/seams/speed, and the upstream reference pipeline (spark_tts_lib) on the same checkpoint.

Random weights never emit the stop token and sample all over the vocabulary, so every sentence is forced to a
fixed token count: `FixedLengthGenerator` removes the stop ids from the allowed ids and sets max_tokens (the
LLM then does exactly the same work per sentence in every run); the reference gets max/min_new_tokens and the
same restriction to semantic ids (see `reference_pipeline`).

Metrics (per stream = one request of `sentences` sentences):
- TTFA: request start -> first audio chunk yielded by `Synthesizer.synthesize` (samples ready to play).
- steady RTF: (last chunk time - first chunk time) / (audio after the first chunk); <1 is faster than real time.
- underruns: a virtual copy of our player per stream (`simulate_player`) starts once it holds `preroll_s` of
  audio and plays at real time; each moment it runs out before the last chunk is one underrun (it then waits for
  `preroll_s` of audio again). `max_realtime_streams` counts on it. The fixed-delay player of runs 1-5
  (`simulate_playback`: starts `preroll_s` after the first chunk, whatever it holds) is reported beside it.
- onset: when that player starts playing (TTFA plus the wait for the pre-roll): the first sound a user hears.
- lane GPU busy / idle: the graph lane's GPU time in the level, and the time its stream sat empty between two
  launches while it had streams (the host late with the next launch, not the GPU slow with the last).
- GC: full runs of Python's cyclic garbage collector during the level, and the longest run of any generation.
Pure apart from the functions that load models (torch, spark_tts_lib and vLLM are imported inside them).
"""
from __future__ import annotations

import asyncio
import gc
import math
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

import numpy as np

from engine.backends.base import DecodeItem
from engine.config import SamplingOptions, SynthesisRequest, request_of, sentence_id
from engine.crossfade import Crossfader
from engine.prompt import Prompt
from engine.seams import seam_error_db
from engine.windowing import WindowPlanner, WindowSchedule

STREAM_LEVELS = (1, 8, 32, 64, 128)
SENTENCE = ("The benchmark sentence is long enough to be a realistic thing to say, with a clause or two, "
            "and it ends here.")
BENCH_GLOBALS = tuple((k * 131 + 7) % 4096 for k in range(32))
"""Stored speaker globals of the benchmark voice (any 32 codes do for random weights)."""


# ---- the fixed-length generator -----------------------------------------------------------------------------

@dataclass
class TokenTimes:
    """When one generation request produced its tokens (perf_counter seconds)."""

    start: float
    deltas: list[tuple[float, int]] = field(default_factory=list)
    """(time, cumulative token count) per delta."""

    def time_of(self, n: int) -> float | None:
        for t, count in self.deltas:
            if count >= n:
                return t
        return None

    @property
    def tokens(self) -> int:
        return self.deltas[-1][1] if self.deltas else 0

    def rate(self) -> float | None:
        """Tokens/s from the first delta to the last (decode speed, prefill excluded)."""
        if len(self.deltas) < 2:
            return None
        (t0, c0), (t1, c1) = self.deltas[0], self.deltas[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


class FixedLengthGenerator:
    """TokenGenerator wrapper: exactly `tokens` tokens per request (stop ids removed from the allowed ids), and a
    record of when each delta came (`times`)."""

    def __init__(self, inner: Any, tokens: int, stop_ids: frozenset[int]) -> None:
        self.inner, self.tokens, self.stop_ids = inner, tokens, stop_ids
        self.times: dict[str, TokenTimes] = {}
        self._filtered: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        """(allowed set, it without stop ids) of the last request: every sentence brings the same set, and
        filtering 8,195 ids per sentence (~0.5 ms) would load the event loop the streams share, and give the
        generator a new tuple each time instead of the one it has checked."""

    def _without_stops(self, allowed: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if allowed is None:
            return None
        if allowed is not self._filtered[0]:
            self._filtered = (allowed, tuple(t for t in allowed if t not in self.stop_ids))
        return self._filtered[1]

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str) -> AsyncIterator[list[int]]:
        allowed = self._without_stops(prompt.allowed_ids)
        rec = self.times[request_id] = TokenTimes(time.perf_counter())
        count = 0
        async for delta in self.inner.stream(replace(prompt, allowed_ids=allowed),
                                             replace(opts, max_tokens=self.tokens), request_id):
            count += len(delta)
            rec.deltas.append((time.perf_counter(), count))
            yield delta

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def close(self) -> None:
        await self.inner.close()


# ---- playback simulation ------------------------------------------------------------------------------------

@dataclass
class StreamRecord:
    """One request's chunks as they arrived."""

    start: float
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """(arrival time, samples) per chunk, pauses included (they are played too)."""
    request_id: str = ""

    def ttfa(self) -> float:
        return self.chunks[0][0] - self.start

    def audio_s(self, sample_rate: int) -> float:
        return sum(n for _, n in self.chunks) / sample_rate

    def steady_rtf(self, sample_rate: int) -> float:
        if len(self.chunks) < 2:
            return 0.0
        after_first = sum(n for _, n in self.chunks[1:]) / sample_rate
        return (self.chunks[-1][0] - self.chunks[0][0]) / after_first if after_first else 0.0

    def rtf(self, sample_rate: int) -> float:
        return (self.chunks[-1][0] - self.start) / self.audio_s(sample_rate)


@dataclass(frozen=True, slots=True)
class Playback:
    """What a listener got from one stream in a playback simulation."""

    underruns: int
    """Times the buffer ran dry before the stream's last chunk had arrived."""
    silence_s: float
    """Seconds of unplanned silence (from each underrun until playing resumed)."""
    onset: float
    """Wall time at which the first sample was played (perf_counter seconds)."""
    first_underrun: int = -1
    """Index of the chunk that came too late the first time (-1: none)."""


def simulate_player(chunks: Sequence[tuple[float, int]], sample_rate: int, preroll_s: float = 0.2,
                    rebuffer_s: float | None = None) -> Playback:
    """Our player (engine.backends.sounddevice_sink): it starts once it holds `preroll_s` of audio (or the
    stream's last chunk has arrived), plays at real time, and after an underrun waits for `rebuffer_s` (default:
    the pre-roll) of audio again before resuming."""
    if not chunks:
        return Playback(0, 0.0, math.nan)
    rebuffer = preroll_s if rebuffer_s is None else rebuffer_s
    playing, threshold, queued = False, preroll_s, 0.0
    runs_out = onset = stalled = math.nan  # runs_out: wall time at which the queued audio is used up
    underruns, silence, first = 0, 0.0, -1
    for k, (arrival, samples) in enumerate(chunks):
        if playing and arrival > runs_out + 1e-9:
            underruns, playing, threshold, queued, stalled = underruns + 1, False, rebuffer, 0.0, runs_out
            first = k if first < 0 else first
        if playing:
            runs_out += samples / sample_rate
            continue
        queued += samples / sample_rate
        if queued >= threshold - 1e-9 or k == len(chunks) - 1:
            playing, runs_out = True, arrival + queued
            if math.isnan(onset):
                onset = arrival
            if not math.isnan(stalled):
                silence, stalled = silence + arrival - stalled, math.nan
    return Playback(underruns, silence, onset, first)


def simulate_playback(chunks: Sequence[tuple[float, int]], sample_rate: int, preroll_s: float = 0.2
                      ) -> tuple[int, float]:
    """(underruns, seconds of silence) for a player that starts a fixed `preroll_s` after the first chunk
    (whatever it holds by then) and plays at real time, stalling whenever the next chunk has not arrived by the
    time the audio before it is used up. Stricter than our player when the first chunk is short and late chunks
    come slowly; runs 1-5 in docs/lab/run-log.md used only this one."""
    if not chunks:
        return 0, 0.0
    clock = chunks[0][0] + preroll_s  # wall time at which the player reaches the start of the next chunk
    underruns, silence = 0, 0.0
    for arrival, samples in chunks:
        if arrival > clock + 1e-9:
            underruns += 1
            silence += arrival - clock
            clock = arrival
        clock += samples / sample_rate
    return underruns, silence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ---- pipeline runs --------------------------------------------------------------------------------------------

@dataclass
class LevelResult:
    streams: int
    ttfa_ms_p50: float
    ttfa_ms_p95: float
    steady_rtf_p50: float
    steady_rtf_max: float
    rtf_p50: float
    rtf_max: float
    underruns: int
    streams_with_underruns: int
    silence_s: float
    audio_s: float
    wall_s: float
    llm_tok_s_per_stream_p50: float
    ttft_ms_p50: float
    first_window_tokens_ms_p50: float
    decode_batch_mean: float
    onset_ms_p50: float = math.nan
    """When our player (simulate_player) would start playing: TTFA plus the wait for its 200 ms pre-roll."""
    onset_ms_p95: float = math.nan
    underruns_fixed_delay: int = 0
    """Underruns of the stricter fixed-delay player (simulate_playback), the measure of runs 1-5."""
    streams_with_underruns_fixed_delay: int = 0
    first_submit_ms_p50: float = math.nan
    """From the first window's last token reaching the pipeline to its decode being submitted (host plumbing)."""
    first_decode_ms_p50: float = math.nan
    """From the first window's decode being submitted to its audio coming back (queue, thread hop, decode)."""
    decode_ms_by_window: dict[int, list[float]] = field(default_factory=dict)
    """Window index of the first sentence -> [p50, p95] ms from decode submitted to audio back."""
    first_underrun_chunks: dict[int, int] = field(default_factory=dict)
    """Chunk index -> streams whose first underrun (our player) came before that chunk arrived."""
    lane_busy_ms: float = math.nan
    """The graph lane's GPU time in this level (GraphLane.busy_ms; nan without a lane on CUDA)."""
    lane_idle_ms: float = math.nan
    """The lane's stream empty between its launches while it had streams (GraphLane.idle_ms): host-bound time."""
    gc_full_collections: int = 0
    """Full (generation 2) runs of the cyclic garbage collector during the level: every thread stops for each."""
    gc_pause_ms_max: float = 0.0
    """The longest collector run of any generation during the level."""

    @property
    def realtime(self) -> bool:
        """Every stream played by our player without an underrun, and generated at RTF <= 0.5."""
        return self.underruns == 0 and self.steady_rtf_max <= 0.5

    @property
    def realtime_fixed_delay(self) -> bool:
        return self.underruns_fixed_delay == 0 and self.steady_rtf_max <= 0.5


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


WINDOWS_REPORTED = 6
"""Windows of the first sentence whose decode latency a level reports (p50, p95 in ms)."""


def summarize(n: int, records: list[StreamRecord], times: list[TokenTimes], firsts: dict[str, TokenTimes],
              sample_rate: int, preroll_s: float, first_tokens: int, wall_s: float, batch_mean: float,
              decodes: dict[str, list[tuple[float, float, int]]] | None = None, right: int = 0) -> LevelResult:
    """One level's numbers. `first_tokens`: tokens the first window needs; where `decodes` knows a stream's first
    window, its own size + `right` is used instead (under load, streams that started before the engine counted
    as busy got the small first window, later ones the busy one)."""
    ttfa = [r.ttfa() * 1e3 for r in records]
    steady = [r.steady_rtf(sample_rate) for r in records]
    fixed = [simulate_playback(r.chunks, sample_rate, preroll_s) for r in records]
    played = [simulate_player(r.chunks, sample_rate, preroll_s) for r in records]
    onset = [(p.onset - r.start) * 1e3 for p, r in zip(played, records)]
    rates = [x for x in (t.rate() for t in times) if x]
    ttft = [(t.deltas[0][0] - t.start) * 1e3 for t in firsts.values() if t.deltas]
    decodes = decodes or {}

    def tokens_for(rid: str) -> int:
        return decodes[rid][0][2] + right if decodes.get(rid) else first_tokens

    need = [((t.time_of(tokens_for(rid)) or math.nan) - t.start) * 1e3 for rid, t in firsts.items()]
    submit, decode = [], []
    by_window: dict[int, list[float]] = {}
    for rid, windows in decodes.items():
        ready = firsts[rid].time_of(tokens_for(rid)) if rid in firsts else None
        if ready is not None and windows:
            submit.append((windows[0][0] - ready) * 1e3)
            decode.append((windows[0][1] - windows[0][0]) * 1e3)
        for k, (sent, back, _) in enumerate(windows[:WINDOWS_REPORTED]):
            by_window.setdefault(k, []).append((back - sent) * 1e3)
    late: dict[int, int] = {}
    for p in played:
        if p.first_underrun >= 0:
            late[p.first_underrun] = late.get(p.first_underrun, 0) + 1
    return LevelResult(
        streams=n, ttfa_ms_p50=percentile(ttfa, 50), ttfa_ms_p95=percentile(ttfa, 95),
        steady_rtf_p50=percentile(steady, 50), steady_rtf_max=max(steady),
        rtf_p50=percentile([r.rtf(sample_rate) for r in records], 50),
        rtf_max=max(r.rtf(sample_rate) for r in records),
        underruns=sum(p.underruns for p in played), streams_with_underruns=sum(1 for p in played if p.underruns),
        silence_s=sum(p.silence_s for p in played), audio_s=sum(r.audio_s(sample_rate) for r in records),
        wall_s=wall_s, onset_ms_p50=percentile(onset, 50), onset_ms_p95=percentile(onset, 95),
        underruns_fixed_delay=sum(u for u, _ in fixed),
        streams_with_underruns_fixed_delay=sum(1 for u, _ in fixed if u),
        llm_tok_s_per_stream_p50=percentile(rates, 50) if rates else math.nan,
        ttft_ms_p50=percentile(ttft, 50) if ttft else math.nan,
        first_window_tokens_ms_p50=percentile([x for x in need if not math.isnan(x)], 50) if need else math.nan,
        decode_batch_mean=batch_mean, first_submit_ms_p50=percentile(submit, 50),
        first_decode_ms_p50=percentile(decode, 50),
        decode_ms_by_window={k: [round(percentile(v, 50), 1), round(percentile(v, 95), 1)]
                             for k, v in sorted(by_window.items())},
        first_underrun_chunks=dict(sorted(late.items())))


class GcPauses:
    """gc.callbacks entry: how long each collector run took, by generation (ms)."""

    def __init__(self) -> None:
        self.ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms[info["generation"]].append((time.perf_counter() - self._t0) * 1000)


async def measure_level(synth: Any, gen: FixedLengthGenerator, n: int, *, text: str, voice: str, rounds: int = 1,
                        preroll_s: float = 0.2, decodes: DecodeLog | None = None) -> LevelResult:
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        level = await _measure_level(synth, gen, n, text=text, voice=voice, rounds=rounds, preroll_s=preroll_s,
                                     decodes=decodes)
    finally:
        gc.callbacks.remove(pauses)
    level.gc_full_collections = len(pauses.ms[2])
    level.gc_pause_ms_max = max((t for ts in pauses.ms.values() for t in ts), default=0.0)
    return level


async def _measure_level(synth: Any, gen: FixedLengthGenerator, n: int, *, text: str, voice: str, rounds: int,
                         preroll_s: float, decodes: DecodeLog | None) -> LevelResult:
    stats0 = (synth.batcher.stats.calls, synth.batcher.stats.items)
    router = _router(gen)
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
    first_tokens = schedule.first_new + schedule.right_context(0)
    mine = {r.request_id: decodes.times[r.request_id] for r in records
            if decodes is not None and r.request_id in decodes.times}
    level = summarize(n, records, times, firsts, synth.sample_rate, preroll_s, first_tokens, wall,
                      items / calls if calls else 0.0, mine, right=schedule.right_context(0))
    if lane0 is not None and lane.busy_ms > lane0[0]:
        level.lane_busy_ms, level.lane_idle_ms = lane.busy_ms - lane0[0], lane.idle_ms - lane0[1]
    return level


def _router(gen: FixedLengthGenerator) -> Any:
    """The LaneRouter behind the bench's generator, or None when the engine has no graph lane."""
    inner = getattr(gen, "inner", None)
    return inner if hasattr(inner, "lane") else None


# ---- decoder precision, seams and speed -----------------------------------------------------------------------

def stream_decode(decoder: Any, codes: Sequence[int], globals_: Sequence[int], schedule: WindowSchedule,
                  lengths: Sequence[int] = ()) -> np.ndarray:
    """Decode `codes` exactly as the pipeline does while they stream in (planner, widening, crossfade; no edge
    fades), returning the joined audio."""
    from engine.batching import widen_left

    planner, fader = WindowPlanner(schedule), Crossfader()
    spc = decoder.samples_per_code
    parts = []
    n = len(codes)
    for available in range(1, n + 1):
        done = available == n
        while (w := planner.next_window(available, done)) is not None:
            item = DecodeItem(tuple(codes[w.start:w.stop]), tuple(globals_), w.emit_start - w.start,
                              w.emit_stop - w.start)
            if lengths:
                item = widen_left(item, codes, w.start, lengths)
            (pcm,) = decoder.decode([item])
            parts.append(fader.push(pcm, w.head * spc, w.tail * spc))
    return np.concatenate(parts)


def rel_error(x: np.ndarray, ref: np.ndarray) -> float:
    """max|x - ref| / rms(ref)."""
    x64, r64 = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(x64 - r64)) / max(float(np.sqrt(np.mean(r64 ** 2))), 1e-12))


def decoder_accuracy(bicodec_dir: Path, schedules: dict[str, WindowSchedule], n_codes: int = 400, seed: int = 0,
                     devices: Sequence[tuple[str, str]] = (("cuda", "fp32"), ("cuda", "bf16"))) -> dict[str, Any]:
    """One-shot error of each (device, dtype) vs CPU fp32, and streaming seam error (dB vs the CPU fp32
    one-shot) for each schedule."""
    import torch

    from engine.backends.bicodec import BiCodecDecoder
    from engine.batching import lengths_for

    rng = np.random.default_rng(seed)
    codes = [int(c) for c in rng.integers(0, 8192, n_codes)]
    glob = [int(g) for g in rng.integers(0, 4096, 32)]
    cpu = BiCodecDecoder(bicodec_dir, device="cpu")
    ref = cpu.decode([DecodeItem(tuple(codes), tuple(glob))])[0]
    out: dict[str, Any] = {"codes": n_codes, "ref_rms": float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))}
    for name, sched in schedules.items():
        out[f"seam_db_cpu_fp32_{name}"] = seam_error_db(stream_decode(cpu, codes, glob, sched), ref)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for device, dt in devices:
        dec = BiCodecDecoder(bicodec_dir, device=device, dtype=dtypes[dt])
        one = dec.decode([DecodeItem(tuple(codes), tuple(glob))])[0]
        out[f"rel_err_{device}_{dt}_vs_cpu_fp32"] = rel_error(one, ref)
        out[f"db_{device}_{dt}_vs_cpu_fp32"] = seam_error_db(one, ref)
        for name, sched in schedules.items():
            lengths = lengths_for(sched)
            dec.warmup(lengths, batches=(1,))
            streamed = stream_decode(dec, codes, glob, sched, lengths)
            out[f"seam_db_{device}_{dt}_{name}"] = seam_error_db(streamed, ref)
            out[f"seam_db_{device}_{dt}_{name}_vs_own_oneshot"] = seam_error_db(streamed, one)
        del dec
        torch.cuda.empty_cache()
    return out


def call_times(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of each of `repeats` calls of `fn`, after one untimed call (first-use costs: kernels built per
    shape, cuDNN autotuning)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _decode_ms(decoder: Any, codes: int, batch: int, repeats: int) -> float:
    """Median ms of one decode() of `batch` windows of `codes` codes, after one untimed call."""
    items = [DecodeItem(tuple((k * 37 + j) % 8192 for k in range(codes)), tuple(range(32))) for j in range(batch)]
    return statistics.median(call_times(lambda: decoder.decode(items), repeats)) * 1e3


def _speed_rows(decoder: Any, lengths: Sequence[int], batches: Sequence[int], repeats: int,
                **labels: Any) -> list[dict[str, Any]]:
    """One row per (length, batch): `labels`, then codes, batch and the median ms per decode() call."""
    return [{**labels, "codes": n, "batch": b, "ms": round(_decode_ms(decoder, n, b, repeats), 3)}
            for n in lengths for b in batches]


def decoder_speed(bicodec_dir: Path, lengths: Sequence[int], batches: Sequence[int] = (1, 8, 32, 64),
                  dtypes: Sequence[str] = ("fp32", "bf16"), repeats: int = 10) -> list[dict[str, Any]]:
    """ms per decode call, eager vs CUDA graph, for each (dtype, length, batch); x real time of the whole window."""
    import torch

    from engine.backends.bicodec import BiCodecDecoder

    rows = []
    for dt in dtypes:
        dec = BiCodecDecoder(bicodec_dir, device="cuda", dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dt])
        dec.max_batch = max(batches)
        for mode in ("eager", "graph"):
            if mode == "graph":
                dec.warmup(lengths, batches)
            rows += [row | {"xrt": round(row["batch"] * row["codes"] * 0.02 / (row["ms"] / 1e3), 1)}
                     for row in _speed_rows(dec, lengths, batches, repeats, dtype=dt, mode=mode)]
        del dec
        torch.cuda.empty_cache()
    return rows


def decoder_snake(bicodec_dir: Path, lengths: Sequence[int], batches: Sequence[int] = (1, 8, 32, 64),
                  repeats: int = 10) -> dict[str, Any]:
    """fp32 CUDA-graph decode with Snake as eager PyTorch ops vs the fused Triton kernel (engine.backends.
    snake_fused), same fixed cuDNN algorithms in both: ms per call for each (length, batch), and how far the
    fused decode is from the eager one (dB, on a 128-code window)."""
    import torch

    from engine.backends import snake_fused
    from engine.backends.bicodec import BiCodecDecoder

    rows, audio = [], {}
    window = [DecodeItem(tuple((k * 53 + 11) % 8192 for k in range(128)), tuple(range(32)))]
    was = snake_fused.enabled
    try:
        for fused in (False, True):
            snake_fused.enabled = fused
            dec = BiCodecDecoder(bicodec_dir, device="cuda", autotune="none")
            capture_s = dec.warmup(lengths, batches)
            rows += _speed_rows(dec, lengths, batches, repeats, snake="fused" if fused else "eager",
                                capture_s=round(capture_s, 1))
            audio[fused] = dec.decode(window)[0]
            del dec
            torch.cuda.empty_cache()
    finally:
        snake_fused.enabled = was
    diff = float(np.sqrt(np.mean((audio[True] - audio[False]) ** 2)))
    ref = float(np.sqrt(np.mean(audio[False] ** 2)))
    return {"available": snake_fused.available(), "rows": rows,
            "db_fused_vs_eager": 20 * math.log10(max(diff, 1e-12) / max(ref, 1e-12))}


def decoder_algorithms(bicodec_dir: Path, lengths: Sequence[int], batches: Sequence[int] = (1, 8, 32, 64),
                       repeats: int = 10, device: str = "cuda") -> list[dict[str, Any]]:
    """fp32 CUDA-graph decode with the streaming engine's cuDNN algorithms ("default": batch-1 graphs autotuned,
    the rest fixed, see BiCodecDecoder._pick_algorithms) vs cuDNN's fixed deterministic ones everywhere
    (export's engine): graph capture seconds and ms per call for each (length, batch). Capture seconds are only
    comparable on a fresh process (cuDNN keeps what it timed for earlier shapes)."""
    import torch

    from engine.backends.bicodec import BiCodecDecoder

    rows = []
    was = torch.backends.cudnn.deterministic
    try:
        for algorithms in ("default", "fixed"):
            dec = BiCodecDecoder(bicodec_dir, device=device, deterministic=algorithms == "fixed")
            capture_s = dec.warmup(lengths, batches)
            rows += _speed_rows(dec, lengths, batches, repeats, algorithms=algorithms, capture_s=round(capture_s, 1))
            del dec
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        torch.backends.cudnn.deterministic = was  # BiCodecDecoder(deterministic=True) sets it process-wide
    return rows


# ---- the reference pipeline -------------------------------------------------------------------------------------

def reference_pipeline(model_dir: Path, tokens: int, globals_: Sequence[int], text: str = SENTENCE,
                       runs: int = 1, device: str = "cuda") -> dict[str, Any]:
    """The upstream reference, `spark_tts_lib.SparkTTS.inference()` (HF transformers `generate()` + its BiCodec
    detokenize), on the same checkpoint. What is changed, and why:

    - its speaker path (`BiCodecTokenizer.tokenize`: wav2vec2 + encoder on a reference clip) is replaced by the
      same stored 32 globals our pipeline uses, put into the prompt exactly as `process_prompt` formats them
      (format b'); `BiCodecTokenizer` is built without wav2vec2 (synthetic checkpoints have none; inference()
      with given globals never runs it);
    - `generate()` gets max_new_tokens = min_new_tokens = `tokens` and a logits processor that keeps only
      semantic ids (applied before its temperature/top-k/top-p warpers): random weights would otherwise sample
      anywhere in the 166k vocabulary and never stop. Everything else runs as shipped.
    Not streaming: its time to first audio is its whole run.
    """
    import importlib

    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    sparktts_module = importlib.import_module("spark_tts_lib.SparkTTS")  # the module (the package rebinds the name)
    from spark_tts_lib.models.audio_tokenizer import BiCodecTokenizer
    from spark_tts_lib.models.bicodec import BiCodec

    class DecodeOnlyTokenizer(BiCodecTokenizer):
        def _initialize_model(self) -> None:
            self.model = BiCodec.load_from_checkpoint(f"{self.model_dir}/BiCodec").to(self.device)

    sparktts_module.BiCodecTokenizer = DecodeOnlyTokenizer
    t_load = time.perf_counter()
    tts = sparktts_module.SparkTTS(Path(model_dir), device=torch.device(device))
    load_s = time.perf_counter() - t_load
    semantic_base = tts.tokenizer.convert_tokens_to_ids("<|bicodec_semantic_0|>")

    class SemanticOnly(LogitsProcessor):
        def __init__(self) -> None:
            self.bias: torch.Tensor | None = None

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if self.bias is None or self.bias.shape[-1] != scores.shape[-1]:
                bias = torch.full((scores.shape[-1],), float("-inf"), device=scores.device, dtype=scores.dtype)
                bias[semantic_base: semantic_base + 8192] = 0
                self.bias = bias
            return scores + self.bias

    original_generate = tts.model.generate
    forced = {"n": tokens}

    def fixed_generate(**kwargs: Any) -> Any:
        kwargs.update(max_new_tokens=forced["n"], min_new_tokens=forced["n"],
                      logits_processor=LogitsProcessorList([SemanticOnly()]))
        return original_generate(**kwargs)

    tts.model.generate = fixed_generate
    global_tokens = "".join(f"<|bicodec_global_{g}|>" for g in globals_)
    prompt = "".join(["<|task_tts|>", "<|start_content|>", text, "<|end_content|>", "<|start_global_token|>",
                      global_tokens, "<|end_global_token|>"])
    global_ids = torch.tensor(list(globals_), dtype=torch.long)[None, None]
    tts.process_prompt = lambda text, prompt_speech_path, prompt_text=None: (prompt, global_ids)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    forced["n"] = 8
    tts.inference(text, prompt_speech_path=Path("unused.wav"))  # warm-up (CUDA init, kernels)
    forced["n"] = tokens
    walls, samples = [], 0
    gen_s = []
    for _ in range(runs):
        sync()
        t = time.perf_counter()
        tg = {}

        def timed_generate(**kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = fixed_generate(**kwargs)
            sync()
            tg["s"] = time.perf_counter() - t0
            return result

        tts.model.generate = timed_generate
        wav = tts.inference(text, prompt_speech_path=Path("unused.wav"))
        walls.append(time.perf_counter() - t)
        gen_s.append(tg.get("s", math.nan))
        samples = int(np.asarray(wav).size)
    audio_s = samples / 16000
    wall = statistics.median(walls)
    return {"tokens": tokens, "audio_s": audio_s, "wall_s": wall, "ttfa_ms": wall * 1e3, "rtf": wall / audio_s,
            "generate_s": statistics.median(gen_s), "llm_tok_s": tokens / statistics.median(gen_s),
            "load_s": load_s, "llm_dtype": str(next(tts.model.parameters()).dtype).replace("torch.", ""),
            "runs": runs, "rtf_runs": [round(w / audio_s, 4) for w in walls]}


# ---- the whole benchmark -----------------------------------------------------------------------------------------

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
    reference: bool = True
    reference_tokens: int | None = None
    decoder_checks: bool = True
    backend: str = "auto"
    decoder_dtype: str = "auto"
    decoder_autotune: str = "all"
    """As `voicectl serve` (the many-streams configuration this measures); see EngineConfig.decoder_autotune."""
    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    threads: int | None = None
    variants: dict[str, tuple[Variant, Sequence[int]]] = field(default_factory=dict)
    """Other configurations to measure, each at its own stream counts, on the same engine."""


async def run_pipeline_bench(opts: BenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    from engine.events import Notice
    from engine.factory import EngineConfig, build_synthesizer
    from engine.voices import VoiceBank

    notices: list[str] = []
    decodes = DecodeLog()

    def on_event(event: Any) -> None:
        decodes.record(event)
        if isinstance(event, Notice):
            notices.append(event.message)
            log(f"  [engine] {event.message}")

    with tempfile.TemporaryDirectory(prefix="voiceapp-bench-") as tmp:
        voice = write_voice(Path(tmp) / "voices")
        t0 = time.perf_counter()
        synth = build_synthesizer(EngineConfig(model=str(opts.model), backend=opts.backend, schedule=opts.schedule,
                                               voices=VoiceBank([Path(tmp) / "voices"]), cache_dir=str(Path(tmp)),
                                               threads=opts.threads, decoder_dtype=opts.decoder_dtype,
                                               decoder_autotune=opts.decoder_autotune,
                                               lane_rows=None),  # a lane sized for crowds, as `voicectl serve`
                                  events=on_event)
        build_s = time.perf_counter() - t0
        inner = synth.generator
        gen = FixedLengthGenerator(inner, opts.tokens, synth.token_ids.stop_ids)
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
                result["levels"].append(_level_json(level))
                log(f"  {n:>4} streams: {_describe(level)}")
            for name, (variant, levels) in opts.variants.items():
                result.setdefault("variants", {})[name] = await _measure_variant(
                    synth, gen, variant, levels, opts, text=text, voice=voice, log=log, name=name, decodes=decodes)
            lane = getattr(inner, "lane", None)
            if lane is not None:
                result["lane"] = {"streams": inner.lane_streams, "served": lane.served,
                                  "capture_s": round(lane.capture_s, 1)}
            result["batcher"] = {"calls": synth.batcher.stats.calls, "items": synth.batcher.stats.items,
                                 "max_batch": synth.batcher.stats.max_batch,
                                 "mean_batch": round(synth.batcher.stats.mean_batch, 2)}
        finally:
            await synth.close()
    return result


def _level_json(level: LevelResult) -> dict[str, Any]:
    return level.__dict__ | {"realtime": level.realtime, "realtime_fixed_delay": level.realtime_fixed_delay}


def _describe(level: LevelResult) -> str:
    return (f"TTFA p50 {level.ttfa_ms_p50:.0f} ms p95 {level.ttfa_ms_p95:.0f} ms (first window: tokens "
            f"{level.first_window_tokens_ms_p50:.1f}, to decoder {level.first_submit_ms_p50:.1f}, decode "
            f"{level.first_decode_ms_p50:.1f} ms), onset p50 {level.onset_ms_p50:.0f} ms, steady RTF p50 "
            f"{level.steady_rtf_p50:.3f} max {level.steady_rtf_max:.3f}, underruns {level.underruns} "
            f"({level.streams_with_underruns} streams; fixed-delay player {level.underruns_fixed_delay}), "
            f"LLM {level.llm_tok_s_per_stream_p50:.0f} tok/s/stream, decode batch {level.decode_batch_mean:.1f}, "
            f"decode ms by window {level.decode_ms_by_window}"
            + (f", lane GPU busy {level.lane_busy_ms:.0f} ms idle {level.lane_idle_ms:.0f} ms"
               if not math.isnan(level.lane_busy_ms) else "")
            + f", GC: {level.gc_full_collections} full, longest {level.gc_pause_ms_max:.0f} ms"
            + (f", first underrun before chunk {level.first_underrun_chunks}" if level.underruns else ""))


async def _measure_variant(synth: Any, gen: FixedLengthGenerator, variant: Variant, levels: Sequence[int],
                           opts: BenchOptions, *, text: str, voice: str, log: Callable[[str], None], name: str,
                           decodes: DecodeLog | None = None) -> dict[str, Any]:
    """TTFA etc. with another window schedule (graphs captured for its shapes first) or with the graph lane off,
    on the same engine; the original settings are restored afterwards."""
    from engine.batching import lengths_for

    schedule = variant.schedule
    saved = (synth.schedule, synth._shape_lengths)  # noqa: SLF001 - benchmark-only swap of the schedule
    router = _router(gen)
    lane_was = router.enabled if router is not None else None
    bursts_were = router.lane.bursts if router is not None else None
    switch_was = sys.getswitchinterval()
    if router is not None:
        router.enabled = variant.lane
        if variant.burst is not None:
            router.lane.bursts = tuple((most, n if most is None else variant.burst) for most, n in bursts_were)
    if variant.switch_s is not None:
        sys.setswitchinterval(variant.switch_s)
    try:
        if synth.decoder.fixed_shapes:
            synth.decoder.warmup(lengths_for(schedule))
            synth._shape_lengths = lengths_for(schedule)  # noqa: SLF001
        synth.schedule = schedule
        out: dict[str, Any] = {"schedule": {k: getattr(schedule, k) for k in schedule.__slots__},
                               "lane": variant.lane, "switch_s": sys.getswitchinterval(),
                               "burst": variant.burst, "levels": []}
        for n in levels:
            rounds = opts.rounds_1 if n == 1 else 1
            level = await measure_level(synth, gen, n, text=text, voice=voice, rounds=rounds, preroll_s=opts.preroll_s,
                                        decodes=decodes)
            out["levels"].append(_level_json(level))
            log(f"  [{name}] {n:>4} streams: {_describe(level)}")
        return out
    finally:
        synth.schedule, synth._shape_lengths = saved  # noqa: SLF001
        sys.setswitchinterval(switch_was)
        if router is not None:
            router.enabled, router.lane.bursts = lane_was, bursts_were


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The summary keys of docs/benchmarks/latest.json."""
    levels = {lv["streams"]: lv for lv in result["pipeline"]["levels"]}
    ref = result.get("reference") or {}
    out = {
        "device": result["device"],
        "ttfa_ms_p50_1": _r(levels.get(1, {}).get("ttfa_ms_p50")),
        "ttfa_ms_p95_32": _r(levels.get(32, {}).get("ttfa_ms_p95")),
        "max_realtime_streams": _max_realtime(levels, "realtime"),
        "export_xrt": _r((result["pipeline"].get("export") or {}).get("xrt")),
        "ours_rtf_1": _r(levels.get(1, {}).get("rtf_p50"), 4),
        "reference_rtf_1": _r(ref.get("rtf"), 4),
        "reference_ttfa_ms_1": _r(ref.get("ttfa_ms")),
        "onset_ms_p50_1": _r(levels.get(1, {}).get("onset_ms_p50")),
        "max_realtime_streams_fixed_delay": _max_realtime(levels, "realtime_fixed_delay"),
    }
    if out["ours_rtf_1"] and out["reference_rtf_1"]:
        out["rtf_ratio_reference_over_ours"] = _r(out["reference_rtf_1"] / out["ours_rtf_1"])
    if out["ttfa_ms_p50_1"] and out["reference_ttfa_ms_1"]:
        out["ttfa_ratio_reference_over_ours"] = _r(out["reference_ttfa_ms_1"] / out["ttfa_ms_p50_1"])
    return out


def _max_realtime(levels: dict[int, dict[str, Any]], key: str) -> int:
    """The largest level such that it and every smaller level were real time by `key`."""
    best = 0
    for n in sorted(levels):
        if not levels[n].get(key, False):
            break
        best = n
    return best


def _r(x: Any, digits: int = 1) -> Any:
    return round(float(x), digits) if isinstance(x, (int, float)) and not math.isnan(float(x)) else None


def format_table(result: dict[str, Any]) -> str:
    """The pipeline levels as a Markdown table, then each variant's levels (labelled), then the lane's counters."""
    lines = ["| streams | TTFA p50 (ms) | TTFA p95 (ms) | onset p50 (ms) | steady RTF p50 | steady RTF max | RTF max "
             "| underruns (streams) | fixed-delay underruns (streams) | LLM tok/s/stream | TTFT p50 (ms) | "
             "decode batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pipeline = result["pipeline"]
    rows = [(str(lv["streams"]), lv) for lv in pipeline["levels"]]
    rows += [(f"{lv['streams']} ({name})", lv) for name, variant in (pipeline.get("variants") or {}).items()
             for lv in variant["levels"]]
    for label, lv in rows:
        lines.append(f"| {label} | {lv['ttfa_ms_p50']:.0f} | {lv['ttfa_ms_p95']:.0f} | "
                     f"{lv.get('onset_ms_p50', math.nan):.0f} | "
                     f"{lv['steady_rtf_p50']:.3f} | {lv['steady_rtf_max']:.3f} | {lv['rtf_max']:.3f} | "
                     f"{lv['underruns']} ({lv['streams_with_underruns']}) | "
                     f"{lv.get('underruns_fixed_delay', 0)} ({lv.get('streams_with_underruns_fixed_delay', 0)}) | "
                     f"{lv['llm_tok_s_per_stream_p50']:.0f} | {lv['ttft_ms_p50']:.0f} | "
                     f"{lv['decode_batch_mean']:.1f} |")
    lane = pipeline.get("lane")
    if lane:
        lines.append(f"\ngraph lane: {lane['streams']} streams started there, graphs captured in "
                     f"{lane['capture_s']} s")
    return "\n".join(lines)
