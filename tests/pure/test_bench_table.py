"""`voicectl bench`'s printed table: main levels, then each variant's levels labelled, then the lane line."""
from __future__ import annotations

from engine.bench import format_table


def _level(streams: int, ttfa: float) -> dict:
    return {"streams": streams, "ttfa_ms_p50": ttfa, "ttfa_ms_p95": ttfa + 1, "onset_ms_p50": ttfa + 10,
            "steady_rtf_p50": 0.05, "steady_rtf_max": 0.06, "rtf_max": 0.07, "underruns": 0,
            "streams_with_underruns": 0, "llm_tok_s_per_stream_p50": 900, "ttft_ms_p50": 2, "decode_batch_mean": 1.0}


def test_variants_and_lane_appear_in_the_table() -> None:
    result = {"pipeline": {"levels": [_level(1, 28)],
                           "variants": {"no_lane": {"levels": [_level(1, 54), _level(32, 169)]}},
                           "lane": {"streams": 35, "served": 35, "capture_s": 23.2}}}
    lines = format_table(result).splitlines()
    assert lines[2].startswith("| 1 | 28 | 29 | 38 |")
    assert lines[3].startswith("| 1 (no_lane) | 54 |") and lines[4].startswith("| 32 (no_lane) | 169 |")
    assert lines[-1] == "graph lane: 35 streams started there, graphs captured in 23.2 s"


def test_no_variants_no_lane() -> None:
    lines = format_table({"pipeline": {"levels": [_level(8, 60)]}}).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| 8 | 60 |")
