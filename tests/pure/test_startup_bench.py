"""The pure half of `python -m lab.startup` (statistics, environments, the report and its table) and how the
export case sees a first finished sentence."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.export_plan import Parts
from lab.startup_bench import (CASES, CaseOutcome, ReportMeta, book_text, child_env, cpu_description,
                                    format_table, parse_cases, phase_medians, report, tuning_done)
from lab.startup_cases import last_json, last_line

META = ReportMeta(device="CPU Test, 2 cores", date="2026-01-02", git="abc", command="python -m lab.startup",
                  model="synthetic tiny", repeats=3, gpu=False)


def _outcomes() -> list[CaseOutcome]:
    say = CaseOutcome("say_inprocess")
    for seconds, phases in ((4.0, {"launch": 0.2, "llm": 1.0}), (6.0, {"launch": 0.4, "llm": 3.0}),
                            (5.0, {"launch": 0.3, "decoder": 2.0})):
        say.add("say_inprocess_s", seconds)
        say.keep("say_inprocess_phases", phases)
    auto = CaseOutcome("say_autostart", error="say with no server running did not start one")
    return [say, auto]


def test_cases_run_in_their_order_and_unknown_ones_are_named() -> None:
    assert parse_cases(None) == CASES
    assert parse_cases("export, say_inprocess") == ("say_inprocess", "export")
    with pytest.raises(ValueError, match="unknown bogus"):
        parse_cases("say_inprocess,bogus")
    with pytest.raises(ValueError):
        parse_cases(" , ")


def test_phase_medians_over_the_runs_that_have_each_phase() -> None:
    runs = [{"launch": 0.2, "llm": 1.0}, {"launch": 0.4, "llm": 3.0}, {"launch": 0.3, "decoder": 2.0}]
    assert phase_medians(runs) == {"launch": 0.3, "llm": 2.0, "decoder": 2.0}
    assert list(phase_medians(runs)) == ["launch", "llm", "decoder"]


def test_report_has_medians_runs_details_and_errors() -> None:
    result = report(META, _outcomes())
    assert result["say_inprocess_s"] == 5.0 and result["runs"]["say_inprocess_s"] == [4.0, 6.0, 5.0]
    assert len(result["say_inprocess_phases"]) == 3 and result["say_inprocess_phases_median"]["launch"] == 0.3
    assert result["say_autostart_s"] is None and result["say_server_s"] is None
    assert result["errors"] == {"say_autostart": "say with no server running did not start one"}
    assert result["device"] == "CPU Test, 2 cores" and result["cases"] == ["say_inprocess", "say_autostart"]
    assert "ttfa_ms_p50_1" not in result  # a CPU run without a warm bench file has no warm figures


def test_gpu_report_has_room_for_the_warm_figures() -> None:
    gpu = replace(META, gpu=True)
    assert report(gpu, [])["ttfa_ms_p95_32"] is None
    warm = {"ttfa_ms_p50_1": 22.3, "ttfa_ms_p95_32": 113.5, "max_realtime_streams": 128, "device": "GPU X",
            "date": "2026-01-01", "pipeline": {}}
    result = report(gpu, [], warm)
    assert (result["ttfa_ms_p50_1"], result["max_realtime_streams"], result["warm_device"]) == (22.3, 128, "GPU X")
    assert "pipeline" not in result


def test_table_lists_figures_runs_phases_and_errors() -> None:
    lines = format_table(report(META, _outcomes())).splitlines()
    assert lines[0].split() == ["case", "seconds", "runs"]
    assert lines[1].split() == ["say_inprocess_s", "5.00", "4.00", "6.00", "5.00"]
    assert lines[2].split() == ["say_autostart_s", "-"] and lines[3].split() == ["say_server_s", "-"]
    assert "say_inprocess phases (median seconds):" in lines
    assert ["launch", "0.30"] in [line.split() for line in lines]
    assert lines[-1] == "  say_autostart: say with no server running did not start one"


def test_child_env_private_socket_server_choice_and_fresh_caches() -> None:
    base = {"PATH": "/bin", "VOICEAPP_NO_SERVER": "1", "XDG_CACHE_HOME": "/home/u/.cache"}
    with_server = child_env(base, "/tmp/b/engine.sock", server=True)
    assert with_server["VOICEAPP_SOCKET"] == "/tmp/b/engine.sock" and "VOICEAPP_NO_SERVER" not in with_server
    assert with_server["XDG_CACHE_HOME"] == "/home/u/.cache" and with_server["PATH"] == "/bin"
    fresh = child_env({"PATH": "/bin"}, "/tmp/b/engine.sock", server=False, fresh_caches="/tmp/b/fresh")
    assert fresh["VOICEAPP_NO_SERVER"] == "1"
    assert fresh["XDG_CACHE_HOME"] == "/tmp/b/fresh/xdg" and fresh["TRITON_CACHE_DIR"] == "/tmp/b/fresh/triton"
    assert fresh["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/b/fresh/inductor"


def test_tuning_done_without_a_tuning_key_means_tuned() -> None:
    assert tuning_done({"pid": 1})
    assert not tuning_done({"tuning": {"done": False, "steps": ["lane"]}})
    assert tuning_done({"tuning": {"done": True, "steps": []}})


def test_cpu_description_from_cpuinfo() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU 9000\nprocessor\t: 1\n"
    assert cpu_description(cpuinfo, 2) == "CPU Example CPU 9000, 2 cores"
    assert cpu_description("", None) == "CPU unknown, ? cores"


def test_book_text_has_the_sentences_asked_for() -> None:
    from engine.book import book_sentences, read_book

    assert len(book_sentences(read_book("book.txt", book_text(12)), 400)) == 12


def test_first_finished_sentence_is_a_part_file_not_a_temp_file(tmp_path) -> None:
    parts = Parts(tmp_path / "out.wav.parts")
    assert parts.written() == 0  # no folder yet
    parts.dir.mkdir()
    (parts.dir / ".000000.tmp").write_bytes(b"half")
    assert parts.written() == 0
    (parts.dir / "000000.part").write_bytes(b"done")
    assert parts.written() == 1


def test_last_json_and_last_line(tmp_path) -> None:
    assert last_json('loading\n{"process_ttfa_ms": 12.5}\n', "say") == {"process_ttfa_ms": 12.5}
    with pytest.raises(Exception, match="printed no JSON object: oops"):
        last_json("oops\n", "say")
    log = tmp_path / "err.log"
    log.write_text("warning: x\nvoicectl: no model found\n\n")
    assert last_line(log) == "voicectl: no model found"
    assert last_line(tmp_path / "missing.log") == "(no log)"
