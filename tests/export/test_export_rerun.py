"""A finished export run again: it renders nothing, says it is complete and with which settings, and exits 0;
a changed setting or a changed output file is named, and --restart renders it again."""
import subprocess
import sys
import time

import pytest

import engine.factory
from tests.cli_helpers import one_line_error, voicectl
from tests.export.test_export_errors import export

TEXT = "Chapter 1\n\nOne sentence here. Another one there.\n\nChapter 2\n\nA third one now. And the last.\n"


@pytest.fixture
def finished(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text(TEXT)
    code, err = export(capsys, str(src), "-o", str(tmp_path / "out.wav"))
    assert code == 0, err
    return src, tmp_path / "out.wav"


@pytest.fixture
def no_engine(monkeypatch):
    """Building an engine fails the test: a complete export must not render (nor load) anything."""
    built = []

    def refuse(*_args, **_kwargs):
        built.append(1)
        raise AssertionError("an engine was built")

    monkeypatch.setattr(engine.factory, "build_synthesizer", refuse)
    return built


@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_a_finished_export_rerun_renders_nothing(finished, capsys, no_engine, flags):
    src, out = finished
    files = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.parent.iterdir()}
    assert sorted(files) == ["in.txt", "out.cue", "out.wav", "out.wav.manifest.json"]  # no parts are left
    code, err = export(capsys, str(src), "-o", str(out), *flags)
    assert code == 0 and not no_engine, err
    assert err.startswith(f"voicectl: {out} is already complete (") and "\n" not in err, err
    assert "6 sentences in 2 chapters, voice ava, seed 0, backend fake" in err, err
    assert "nothing to do (pass --restart to render it again)" in err
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.parent.iterdir()} == files


@pytest.mark.parametrize("change,named", [
    (["--seed", "7"], "seed was 0, now 7"),
    (["--voice", "leo"], "voice was 'ava', now 'leo'"),
    (["--normalize-loudness"], "normalize loudness was None, now -20.0"),
    (["--split-chapters"], "output was 'one file', now 'chapter files'"),
])
def test_a_changed_setting_is_named_and_needs_restart(finished, capsys, no_engine, change, named):
    src, out = finished
    code, err = export(capsys, str(src), "-o", str(out), *change)
    assert code != 0 and not no_engine
    assert err == f"voicectl: {out} is already exported, but {named}; pass --restart to render it again", err


def test_a_changed_input_or_output_is_named(finished, capsys, no_engine):
    src, out = finished
    src.write_text(TEXT.replace("the last", "the very last"))
    code, err = export(capsys, str(src), "-o", str(out), "--resume")
    assert code != 0 and "but the input changed; pass --restart" in err, err
    src.write_text(TEXT)
    out.with_suffix(".cue").unlink()
    code, err = export(capsys, str(src), "-o", str(out))
    assert code != 0 and err.endswith("but out.cue is gone; pass --restart to render it again"), err


def test_restart_renders_a_finished_export_again(finished, capsys):
    src, out = finished
    want = out.read_bytes()
    out.write_bytes(b"damaged")
    code, err = export(capsys, str(src), "-o", str(out), "--restart")
    assert code == 0 and "already" not in err, err
    assert out.read_bytes() == want


def test_a_finished_export_rerun_is_quick_as_a_process(finished):
    src, out = finished
    t0 = time.monotonic()
    proc = voicectl("export", str(src), "-o", str(out), "--backend", "fake")
    took = time.monotonic() - t0
    assert proc.returncode == 0 and "is already complete" in proc.stderr.decode(), proc.stderr.decode()
    assert took < 5.0, took  # loose: a loaded CI machine launches slowly; what keeps it quick is checked below
    probe = ("import sys; from voiceapp.cli import main; code = main(sys.argv[1:]); "
             "print(code, 'torch' in sys.modules)")
    quick = subprocess.run([sys.executable, "-c", probe, "export", str(src), "-o", str(out), "--backend", "fake"],
                           capture_output=True, text=True, timeout=120)
    assert quick.stdout.split() == ["0", "False"], quick.stderr  # no engine, not even torch, for a finished book
    one_line_error(voicectl("export", str(src), "-o", str(out), "--backend", "fake", "--seed", "3"))
