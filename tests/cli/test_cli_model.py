"""`voicectl model synth|info|download` in a subprocess: success paths and one-line errors without tracebacks."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import cli_helpers
from tests.cli_helpers import one_line_error

REPO_ROOT = Path(__file__).resolve().parents[2]


def voicectl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return cli_helpers.voicectl(*args, env={"PYTHONPATH": str(REPO_ROOT), **(env or {})}, text=True, cwd=REPO_ROOT)


def test_synth_then_info(tmp_path):
    pytest.importorskip("engine.synthetic.bicodec")
    model = tmp_path / "tiny"
    proc = voicectl("model", "synth", "--size", "tiny", str(model))
    assert proc.returncode == 0, proc.stderr
    assert f"--model {model}" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no temp dirs left behind

    proc = voicectl("model", "info", "--model", str(model))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "valid        yes" in out and "LLM/model.safetensors" in out and "BiCodec/model.safetensors" in out
    assert "global 151665..155760" in out and "semantic 155761..163952" in out and "im_end 151645" in out

    proc = voicectl("model", "info", env={"VOICEAPP_MODEL": str(model)})  # found through the environment
    assert proc.returncode == 0 and "valid        yes" in proc.stdout, proc.stderr


def test_info_on_missing_dir(tmp_path):
    err = one_line_error(voicectl("model", "info", "--model", str(tmp_path / "nope")))
    assert "no such directory" in err and "voicectl model download" in err


def test_info_on_invalid_dir_names_the_file(tmp_path):
    (tmp_path / "config.yaml").write_text("sample_rate: 16000\n")
    proc = voicectl("model", "info", "--model", str(tmp_path))
    err = one_line_error(proc)
    assert str(tmp_path / "LLM" / "config.json") in err and "missing" in err
    assert "LLM/model.safetensors" in proc.stdout and "missing" in proc.stdout  # layout still shown


def test_info_with_nothing_found(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "VOICEAPP_MODEL": ""}
    err = one_line_error(voicectl("model", "info", env=env))
    assert "voicectl model download" in err and "voicectl model synth --size tiny DIR" in err


def test_synth_refuses_non_empty_dir(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    err = one_line_error(voicectl("model", "synth", str(tmp_path)))
    assert "not empty" in err
    err = one_line_error(voicectl("model", "synth", "--force", str(tmp_path)))
    assert "does not look like a checkpoint" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_download_offline_is_one_line(tmp_path):
    pytest.importorskip("huggingface_hub")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "home")}
    err = one_line_error(voicectl("model", "download", "--dir", str(tmp_path / "dl"), env=env))
    assert "offline" in err and "--model DIR" in err


def test_model_without_action_prints_help():
    proc = voicectl("model")
    assert proc.returncode == 2 and "synth" in proc.stderr and "Traceback" not in proc.stderr
