"""`voicectl bench` end to end on the CPU (tiny synthetic checkpoint, one short level): the JSON carries the
issue's keys at its top level, with the numbers the table printed."""
from __future__ import annotations

import json
import math

from tests.cli_helpers import voicectl

REQUIRED = ("device", "ttfa_ms_p50_1", "ttfa_ms_p95_32", "max_realtime_streams", "export_xrt", "ours_rtf_1",
            "reference_rtf_1", "reference_ttfa_ms_1")


def test_bench_json_has_the_headline_keys_at_the_top(tmp_path) -> None:
    out = tmp_path / "bench" / "latest.json"
    proc = voicectl("bench", "--synthetic", "tiny", "--backend", "torch", "--levels", "1", "--rounds-1", "1",
                    "--no-reference", "--export-sentences", "4", "--no-variants",
                    "--tokens", "20", "--sentences", "1", "--json", str(out), text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert all(key in result for key in REQUIRED), [k for k in REQUIRED if k not in result]
    assert {key: result[key] for key in REQUIRED} == {key: result["headline"][key] for key in REQUIRED}
    assert isinstance(result["device"], str) and result["ttfa_ms_p50_1"] > 0 and result["ours_rtf_1"] > 0
    assert result["max_realtime_streams"] in (0, 1) and result["reference_rtf_1"] is None  # --no-reference
    assert f"ttfa_ms_p50_1: {result['ttfa_ms_p50_1']}" in proc.stdout
    assert not any(isinstance(v, float) and math.isnan(v) for v in result.values())
    export = result["pipeline"]["export"]  # a fresh `voicectl export` process: the path users run
    assert export["sentences"] == 4 and round(export["xrt"]) == round(result["export_xrt"]) > 0
    assert 0 < export["e2e_xrt"] < export["xrt"] and export["exit_s"] > export["e2e_s"] - 1


def test_export_check_compares_fresh_killed_resumed_and_reordered_exports(tmp_path) -> None:
    """The real engine (tiny checkpoint, CPU) in four processes: clean, killed with SIGKILL and resumed with other
    --jobs, reversed; the WAVs are compared byte for byte."""
    out = tmp_path / "export.json"
    proc = voicectl("bench", "--export-check", "--synthetic", "tiny", "--export-sentences", "8", "--json", str(out),
                    text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["resume_identical"] is True and result["processes_compared"] == 4
    assert [r["name"] for r in result["runs"]] == ["clean", "killed", "resumed", "reversed"]
    assert 1 <= result["runs"][1]["killed_after"] < 8 and result["runs"][2]["stats"]["resumed"] >= 1
    assert all(c["identical"] and c["sha256"][0] == c["sha256"][1] for c in result["comparisons"].values())
    assert result["audio_s"] > 0 and result["render_xrt"] > result["e2e_xrt"] > 0


def test_startup_bench_times_a_fresh_inprocess_say(tmp_path) -> None:
    out = tmp_path / "startup.json"
    proc = voicectl("bench", "--startup", "--synthetic", "tiny", "--cases", "say_inprocess", "--repeats", "1",
                    "--json", str(out), text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["say_inprocess_s"] > 0 and result["runs"]["say_inprocess_s"] == [result["say_inprocess_s"]]
    [phases] = result["say_inprocess_phases"]
    assert phases["launch"] > 0 and phases["checkpoint"] > 0 and 0 < sum(phases.values()) < result["say_inprocess_s"]
    assert result["errors"] == {} and result["cases"] == ["say_inprocess"] and isinstance(result["device"], str)
    assert "say_inprocess_s" in proc.stdout and "say_inprocess phases" in proc.stdout


def test_startup_options_need_startup() -> None:
    proc = voicectl("bench", "--repeats", "2", text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == "voicectl: --repeats: only with --startup"
