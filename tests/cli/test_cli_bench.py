"""`voicectl bench` end to end on the CPU (tiny synthetic checkpoint, one short level): the JSON carries the
issue's keys at its top level, with the numbers the table printed; its help stays short; and the lab's benchmarks
over engine.bench (`python -m lab.bench`, `lab.export_check`, `lab.startup`, `lab.read_bench`) run as lab/*.sh run
them."""
from __future__ import annotations

import json
import math

import pytest

from tests.cli_helpers import lab, one_line_error, voicectl

REQUIRED = ("device", "ttfa_ms_p50_1", "ttfa_ms_p95_32", "max_realtime_streams", "export_xrt", "ours_rtf_1",
            "reference_rtf_1", "reference_ttfa_ms_1")


def test_bench_json_has_the_headline_keys_at_the_top(tmp_path) -> None:
    out = tmp_path / "bench" / "latest.json"
    proc = voicectl("bench", "--synthetic", "tiny", "--backend", "torch", "--levels", "1", "--tokens", "20",
                    "--sentences", "1", "--json", str(out), text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert all(key in result for key in REQUIRED), [k for k in REQUIRED if k not in result]
    assert {key: result[key] for key in REQUIRED} == {key: result["headline"][key] for key in REQUIRED}
    assert isinstance(result["device"], str) and result["ttfa_ms_p50_1"] > 0 and result["ours_rtf_1"] > 0
    assert result["max_realtime_streams"] in (0, 1) and result["reference_rtf_1"] is None  # the lab's, not a user's
    assert result["export_xrt"] is None and "decoder_accuracy" not in result and "variants" not in result["pipeline"]
    assert f"ttfa_ms_p50_1: {result['ttfa_ms_p50_1']}" in proc.stdout
    assert not any(isinstance(v, float) and math.isnan(v) for v in result.values())
    assert result["command"].startswith("voicectl bench --synthetic tiny")


def test_bench_help_lists_fewer_than_15_options() -> None:
    """`voicectl bench` answers one question (does this machine keep up, and how fast): the lab's switches live in
    lab/, not in its help."""
    proc = voicectl("bench", "--help", text=True)
    assert proc.returncode == 0, proc.stderr
    options = [line.split()[0].rstrip(",") for line in proc.stdout.splitlines() if line.startswith("  -")]
    assert "--load" in options and "--json" in options and len(options) < 15, options  # -h included
    for gone in ("--startup", "--export-check", "--read", "--variants", "--decoder-only", "--first-new"):
        assert gone not in proc.stdout


def test_lab_bench_runs_the_export_and_no_variant_when_told(tmp_path) -> None:
    """`python -m lab.bench`: the pipeline as `voicectl bench`, plus a fresh `voicectl export`'s speed."""
    out = tmp_path / "lab.json"
    proc = lab("bench", "--synthetic", "tiny", "--backend", "torch", "--levels", "1", "--rounds-1", "1",
               "--no-reference", "--export-sentences", "4", "--no-variants", "--tokens", "20", "--sentences", "1",
               "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert all(key in result for key in REQUIRED) and result["reference_rtf_1"] is None  # --no-reference
    export = result["pipeline"]["export"]  # a fresh `voicectl export` process: the path users run
    assert export["sentences"] == 4 and result["export_xrt"] > 0
    assert abs(export["xrt"] - result["export_xrt"]) <= 0.051  # the headline keeps one decimal
    assert 0 < export["e2e_xrt"] < export["xrt"] and export["exit_s"] > export["e2e_s"] - 1
    assert result["command"].startswith("python -m lab.bench --synthetic tiny")


def test_lab_bench_refuses_an_unknown_variant_in_one_line() -> None:
    line = one_line_error(lab("bench", "--variants", "nope", timeout=60), prog="python -m lab.bench")
    assert "--variants: unknown nope" in line


def test_export_check_compares_fresh_killed_resumed_and_reordered_exports(tmp_path) -> None:
    """The real engine (tiny checkpoint, CPU) in four processes: clean, killed with SIGKILL and resumed with other
    --jobs, reversed; the WAVs are compared byte for byte."""
    out = tmp_path / "export.json"
    proc = lab("export_check", "--synthetic", "tiny", "--export-sentences", "8", "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["resume_identical"] is True and result["processes_compared"] == 4
    assert [r["name"] for r in result["runs"]] == ["clean", "killed", "resumed", "reversed"]
    assert 1 <= result["runs"][1]["killed_after"] < 8 and result["runs"][2]["stats"]["resumed"] >= 1
    assert all(c["identical"] and c["sha256"][0] == c["sha256"][1] for c in result["comparisons"].values())
    assert result["audio_s"] > 0 and result["render_xrt"] > result["e2e_xrt"] > 0


def test_startup_bench_times_a_fresh_inprocess_say(tmp_path) -> None:
    out = tmp_path / "startup.json"
    proc = lab("startup", "--synthetic", "tiny", "--cases", "say_inprocess", "--repeats", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["say_inprocess_s"] > 0 and result["runs"]["say_inprocess_s"] == [result["say_inprocess_s"]]
    [phases] = result["say_inprocess_phases"]
    assert phases["launch"] > 0 and phases["checkpoint"] > 0 and 0 < sum(phases.values()) < result["say_inprocess_s"]
    assert result["errors"] == {} and result["cases"] == ["say_inprocess"] and isinstance(result["device"], str)
    assert "say_inprocess_s" in proc.stdout and "say_inprocess phases" in proc.stdout


@pytest.mark.parametrize("name", ["bench", "startup", "export_check", "read_bench"])
def test_every_numeric_option_of_a_lab_benchmark_has_a_row_in_the_limits_table(name) -> None:
    """The lab's benchmarks check their numbers as voicectl does (voiceapp.limits, applied by lab.lab_cli)."""
    import importlib

    from voiceapp import limits

    parser = importlib.import_module(f"lab.{name}").build_parser()
    limits.apply(parser)
    plain = [a.option_strings[-1] for a in parser._actions if a.option_strings and a.type in (int, float)]
    assert not plain, f"python -m lab.{name}: {plain} have no row in voiceapp.limits.OPTIONS"


@pytest.mark.parametrize(("args", "words"), [(["--cases", "nope"], "--cases: unknown nope"),
                                             (["--export-sentences", "0"], "--export-sentences must be at least 1")])
def test_startup_refuses_bad_input_in_one_line(args, words) -> None:
    line = one_line_error(lab("startup", *args, timeout=60), prog="python -m lab.startup")
    assert words in line


def test_read_gives_each_weights_rtf_and_its_ratio_to_the_first(tmp_path) -> None:
    """Fresh `voicectl say` processes of the tiny checkpoint, int8 then fp32, writing WAVs (--no-sound)."""
    out = tmp_path / "read.json"
    text = tmp_path / "text.txt"
    text.write_text("A first sentence to read. And a second one after it.")
    proc = lab("read_bench", "--synthetic", "tiny", "--no-sound", "--weights", "int8,none", "--text", str(text),
               "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    runs = {run["weights"]: run for run in result["runs"]}
    assert list(runs) == ["int8", "none"] and not result["errors"] and result["text_chars"] == len(text.read_text())
    for run in runs.values():
        assert run["rtf"] > 0 and run["audio_s"] > 1 and run["ttfa_s"] > 0 and run["process_s"] > run["ttfa_s"]
        assert run["underruns"] is None and run["first_sound_s"] is None and run["quiet_s"] is None  # nothing played
    assert any("int8 weights" in n for n in runs["int8"]["notices"])
    assert not any("int8 weights" in n for n in runs["none"]["notices"])
    assert result["rtf_over_first"] == {"int8": 1.0, "none": round(runs["none"]["rtf"] / runs["int8"]["rtf"], 3)}
    assert proc.stdout.splitlines()[2].split()[:2] == ["int8", f"{runs['int8']['rtf']:.3f}"]


@pytest.mark.parametrize("args, words", [
    (["--weights", "int3"], "--weights: expected distinct values"),
    (["--weights", "int8,int8"], "--weights: expected distinct values"),
    (["--text", "{tmp}/none.txt"], "no such file"),
    (["--text", "{tmp}/binary.txt"], "looks like a binary file"),
    (["--text", "{tmp}/latin1.txt"], "not valid UTF-8 text"),
    (["--text", "{tmp}/dots.txt"], "no speakable words"),
    (["--text", "{tmp}/long.txt"], "more than 3000 characters"),
])
def test_read_refuses_bad_input_before_any_model_loads(args, words, tmp_path) -> None:
    (tmp_path / "binary.txt").write_bytes(b"Hello\x00there.")
    (tmp_path / "latin1.txt").write_bytes("Caf\u00e9 au lait.".encode("latin-1"))
    (tmp_path / "dots.txt").write_text("... !!! ???")
    (tmp_path / "long.txt").write_text("word " * 700)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = lab("read_bench", "--model", str(tmp_path / "no-model"), *args, timeout=60)
    line = one_line_error(proc, prog="python -m lab.read_bench")
    assert proc.returncode == 2 and words in line, line


def test_read_without_speakers_says_to_use_no_sound_before_any_model_loads(tmp_path) -> None:
    proc = lab("read_bench", "--model", str(tmp_path / "no-model"),
               env={"PULSE_SERVER": f"unix:{tmp_path}/no-such-socket"}, timeout=60)
    line = one_line_error(proc, prog="python -m lab.read_bench")
    assert "audio output device" in line and line.endswith("--no-sound reads into WAV files instead"), line


# ---- --load ------------------------------------------------------------------------------------------------

def test_load_on_the_fake_engine_writes_each_rates_figures(tmp_path) -> None:
    out = tmp_path / "load.json"
    proc = voicectl("bench", "--load", "2,6", "--load-seconds", "1", "--load-seed", "3", "--backend", "fake",
                    "--fake-streams", "4", "--json", str(out), text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "fake engine (CPU, 4 streams' throughput)" and [r["rate"] for r in result["rates"]] == [2.0, 6.0]
    for rate in result["rates"]:
        assert {"first_ms_p50", "first_ms_p95", "underran_share", "refused"} <= set(rate)
        assert rate["refused"] == 0 and rate["served"] == rate["streams"] > 0  # in-process: nothing refuses
        assert 0 < rate["first_ms_p50"] <= rate["first_ms_p95"] <= rate["first_ms_max"]
        assert f"| {rate['rate']:g} | {rate['streams']} | {rate['served']} |" in proc.stdout


def test_load_on_the_tiny_checkpoint_runs_the_real_engine(tmp_path) -> None:
    out = tmp_path / "load.json"
    proc = voicectl("bench", "--load", "3", "--load-seconds", "1", "--synthetic", "tiny", "--backend", "torch",
                    "--json", str(out), text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"].startswith("CPU") and result["target"] == "in-process"
    (rate,) = result["rates"]
    assert rate["served"] == rate["streams"] > 0 and rate["first_ms_p50"] > 0


@pytest.mark.parametrize(("args", "words"), [
    (["--load", "0"], "--load"),
    (["--load", "nan"], "--load"),
    (["--load", "-5"], "--load"),
    (["--load", "1e9"], "--load"),
    (["--load", "5,x"], "--load"),
    (["--load", ","], "--load"),
    (["--load", "1000", "--load-seconds", "86400"], "--load-seconds"),
    (["--load", "5", "--load-seconds", "nan"], "--load-seconds"),
    (["--load", "5", "--fake-streams", "4"], "--fake-streams"),
    (["--load", "5", "--http", "ftp://x"], "--http"),
    (["--load", "5", "--http", "http://127.0.0.1:1", "--backend", "fake"], "--http"),
    (["--load-seconds", "5"], "only with --load"),
    (["--http", "http://127.0.0.1:1"], "only with --load"),
    (["--backend", "fake"], "only with --load"),
])
def test_load_refuses_bad_input_in_one_line(args, words) -> None:
    assert words in one_line_error(voicectl("bench", *args, text=True, timeout=60))


def test_load_against_a_server_that_cannot_be_reached_counts_failures_not_a_traceback(tmp_path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    err = one_line_error(voicectl("bench", "--load", "1", "--load-seconds", "1", "--http", f"http://127.0.0.1:{port}",
                                  text=True, timeout=60))
    assert "the first request failed" in err
