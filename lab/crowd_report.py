"""Device probe helper for lab/gpu_load.sh: merges what the crowd harness measured into the issue's two files.

  python lab/crowd_report.py OUT
  reads  OUT/load_http.json (`voicectl bench --load ... --http ... --json`), OUT/tuning_1.json (lab/http_latency.py
         at 1 client while the server tuned itself), OUT/tuning_status.json (`voicectl status --json` after it),
         OUT/bench.json (`voicectl bench --levels ... --json`) and OUT/env.txt (the machine)
  writes OUT/load.json: device, rates (per rate: rate, first_ms_p50, first_ms_p95, first_ms_max, underran_share,
         refused, served, peak_concurrency, refusal_reasons), tuning_first_ms_p95_1, tuning_first_ms_p50_1, tuning_still_running;
         OUT/latest_streams.json: device, max_realtime_streams, ttfa_ms_p50_1 and each level's figures
A file that is missing leaves its keys null (the harness ran out of time there), never a guess.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

LEVEL_KEYS = ("streams", "ttfa_ms_p50", "ttfa_ms_p95", "underruns", "streams_with_underruns", "steady_rtf_p50",
              "decode_batch_mean", "llm_tok_s_per_stream_p50")
RATE_KEYS = ("rate", "first_ms_p50", "first_ms_p95", "first_ms_max", "underran_share", "refused", "served",
             "streams", "peak_concurrency", "refusal_reasons")


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def device_of(out: Path) -> str | None:
    """The GPU's name from env.txt's nvidia-smi line (its first field after the header)."""
    try:
        lines = (out / "env.txt").read_text().splitlines()
    except OSError:
        return None
    return lines[1].split(",")[0].strip() if len(lines) > 1 and "," in lines[1] else None


def load_report(out: Path) -> dict[str, Any]:
    load = read(out / "load_http.json") or {}
    tuning = read(out / "tuning_1.json") or {}
    status = read(out / "tuning_status.json") or {}
    first = tuning.get("first_byte_ms") or {}
    return {"device": device_of(out), "target": load.get("target"), "options": load.get("options"),
            "rates": [{k: r.get(k) for k in RATE_KEYS} for r in load.get("rates", [])],
            "tuning_first_ms_p95_1": first.get("p95"), "tuning_first_ms_p50_1": first.get("p50"),
            "tuning_requests": first.get("n"), "tuning_failed": tuning.get("failed"),
            "tuning_still_running": None if not status else not status.get("tuning", {}).get("done", True)}


def streams_report(out: Path) -> dict[str, Any]:
    bench = read(out / "bench.json") or {}
    levels = (bench.get("pipeline") or {}).get("levels", [])
    return {"device": device_of(out), "max_realtime_streams": bench.get("max_realtime_streams"),
            "max_realtime_streams_fixed_delay": bench.get("max_realtime_streams_fixed_delay"),
            "max_streams_0_underruns": bench.get("max_streams_0_underruns"),
            "ttfa_ms_p50_1": bench.get("ttfa_ms_p50_1"),
            "levels": [{k: level.get(k) for k in LEVEL_KEYS} for level in levels]}


def main() -> None:
    out = Path(sys.argv[1])
    for name, report in (("load.json", load_report(out)), ("latest_streams.json", streams_report(out))):
        (out / name).write_text(json.dumps(report, indent=1) + "\n")
        print(name, json.dumps(report))


if __name__ == "__main__":
    main()
