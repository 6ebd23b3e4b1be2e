"""One level's numbers from its records (percentiles, LevelResult), and the report's headline and table. Pure."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from engine.bench.generator import TokenTimes
from engine.bench.playback import StreamRecord, simulate_playback, simulate_player

def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class LevelResult:
    """One level's numbers: every stream of every round at one stream count."""

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
    """When our player (simulate_player) would start playing: TTFA plus the wait for its pre-roll."""
    onset_ms_p95: float = math.nan
    underruns_fixed_delay: int = 0
    """Underruns of the stricter fixed-delay player (simulate_playback), the measure of the earliest runs."""
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
    decode_calls: int = 0
    """Decoder calls during the level."""
    decode_capped: int = 0
    """Of them, calls cut below the batch limit for the most pressing window (BatchStats.capped)."""
    decode_first_calls: list[int] = field(default_factory=list)
    """Windows in each of the level's first decoder calls (FIRST_CALLS_REPORTED): how a crowd's first windows were
    batched, which the cost model learnt on earlier levels decides."""

    @property
    def played_through(self) -> bool:
        """Every stream played by our player without an underrun, however close to real time it was made."""
        return self.underruns == 0

    @property
    def realtime(self) -> bool:
        """Every stream played by our player without an underrun, and generated at RTF <= 0.5: with the headroom
        that a crowd's next arrival or a longer sentence does not push it into one."""
        return self.played_through and self.steady_rtf_max <= 0.5

    @property
    def realtime_fixed_delay(self) -> bool:
        return self.underruns_fixed_delay == 0 and self.steady_rtf_max <= 0.5


FIRST_CALLS_REPORTED = 12
"""A level's first decoder calls whose sizes it reports (LevelResult.decode_first_calls)."""
WINDOWS_REPORTED = 6
"""Windows of the first sentence whose decode latency a level reports (p50, p95 in ms)."""


def summarize(n: int, records: list[StreamRecord], times: list[TokenTimes], firsts: dict[str, TokenTimes],
              sample_rate: int, preroll_s: float, first_tokens: int, wall_s: float, batch_mean: float,
              decodes: dict[str, list[tuple[float, float, int]]] | None = None, right: int = 0,
              tokens_per_code: int = 1) -> LevelResult:
    """One level's numbers. `first_tokens`: tokens the first window needs; where `decodes` knows a stream's first
    window, its own size + `right` codes is used instead (under load, streams that started before the engine counted
    as busy got the small first window, later ones the busy one), at `tokens_per_code` LLM tokens a code (Orpheus:
    seven a SNAC frame)."""
    ttfa = [r.ttfa() * 1e3 for r in records]
    steady = [r.steady_rtf(sample_rate) for r in records]
    fixed = [simulate_playback(r.chunks, sample_rate, preroll_s) for r in records]
    played = [simulate_player(r.chunks, sample_rate, preroll_s) for r in records]
    onset = [(p.onset - r.start) * 1e3 for p, r in zip(played, records)]
    rates = [x for x in (t.rate() for t in times) if x]
    ttft = [(t.deltas[0][0] - t.start) * 1e3 for t in firsts.values() if t.deltas]
    decodes = decodes or {}

    def tokens_for(rid: str) -> int:
        return (decodes[rid][0][2] + right) * tokens_per_code if decodes.get(rid) else first_tokens

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


def level_json(level: LevelResult) -> dict[str, Any]:
    """The level as the report's JSON stores it, its verdicts included."""
    return level.__dict__ | {"realtime": level.realtime, "realtime_fixed_delay": level.realtime_fixed_delay,
                             "played_through": level.played_through}


def describe_level(level: LevelResult) -> str:
    """The level in one log line."""
    return (f"TTFA p50 {level.ttfa_ms_p50:.0f} ms p95 {level.ttfa_ms_p95:.0f} ms (first window: tokens "
            f"{level.first_window_tokens_ms_p50:.1f}, to decoder {level.first_submit_ms_p50:.1f}, decode "
            f"{level.first_decode_ms_p50:.1f} ms), onset p50 {level.onset_ms_p50:.0f} ms, steady RTF p50 "
            f"{level.steady_rtf_p50:.3f} max {level.steady_rtf_max:.3f}, underruns {level.underruns} "
            f"({level.streams_with_underruns} streams; fixed-delay player {level.underruns_fixed_delay}), "
            f"LLM {level.llm_tok_s_per_stream_p50:.0f} tok/s/stream, decode batch {level.decode_batch_mean:.1f} "
            f"({level.decode_calls} calls, {level.decode_capped} capped; first {level.decode_first_calls}), "
            f"decode ms by window {level.decode_ms_by_window}"
            + (f", lane GPU busy {level.lane_busy_ms:.0f} ms idle {level.lane_idle_ms:.0f} ms"
               if not math.isnan(level.lane_busy_ms) else "")
            + f", GC: {level.gc_full_collections} full, longest {level.gc_pause_ms_max:.0f} ms"
            + (f", first underrun before chunk {level.first_underrun_chunks}" if level.underruns else ""))


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
        "max_streams_0_underruns": _max_realtime(levels, "played_through"),
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
