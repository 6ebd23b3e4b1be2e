"""`voicectl export` given bad input, in subprocesses: an output that is its own input, two exports to one output,
a manifest with fields of the wrong type or from another version. Each gets one line and a non-zero exit, and
leaves the input and any earlier export's work as they were."""
import json
import os
import signal

import pytest

from engine.export_plan import MANIFEST_VERSION
from tests.cli_helpers import one_line_error, voicectl
from tests.export.test_cli_export_book import (BOOK, FAKE, FAST, clean, interrupt, ok,  # noqa: F401 - clean: a fixture
                                               start_export)


def place_input(tmp_path, case):
    """(input, -o argument) for `case`: the input file is, or is linked from, a file the export would write."""
    out = tmp_path / "out.wav"
    if case == "same name":
        return out, str(out)
    if case == "hard link":
        (tmp_path / "in.txt").write_text(BOOK)
        os.link(tmp_path / "in.txt", out)
        return tmp_path / "in.txt", str(out)
    if case == "symlink":
        (tmp_path / "in.txt").write_text(BOOK)
        out.symlink_to("in.txt")
        return tmp_path / "in.txt", str(out)
    if case == "chapter file":
        (tmp_path / "book").mkdir()
        return tmp_path / "book" / "03 - Chapter 3.wav", f"{tmp_path / 'book'}/"
    if case == "split chapter file":
        return tmp_path / "out 02 - Chapter 2.wav", str(out)
    if case == "cue sheet":
        return tmp_path / "out.cue", str(out)
    (tmp_path / "out.wav.parts").mkdir()
    return tmp_path / "out.wav.parts" / "in.txt", str(out)


@pytest.mark.parametrize("case", ["same name", "hard link", "symlink", "chapter file", "split chapter file",
                                  "cue sheet", "inside the parts"])
def test_an_export_never_overwrites_its_own_input(tmp_path, case):
    src, out = place_input(tmp_path, case)
    if not src.exists():
        src.write_text(BOOK)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    split = ["--split-chapters"] if case == "split chapter file" else []
    err = one_line_error(voicectl("export", str(src), "-o", out, *FAKE, *split))
    assert "overwrite its own input" in err or "which the export deletes" in err, err
    assert src.read_text() == BOOK
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_second_export_to_the_same_output_refuses_at_once(clean, tmp_path):
    src, want_wav, want_cue = clean
    out = tmp_path / "out.wav"
    first = start_export(["export", str(src), "-o", str(out), *FAKE, "--jobs", "1"], tmp_path / "out.wav.parts",
                         at_least=3)
    try:
        for extra in ([], ["--restart"], ["--resume"]):
            err = one_line_error(voicectl("export", str(src), "-o", str(out), *FAKE, *extra))
            assert err == (f"voicectl: {out}: another export to it is running (pid {first.pid}); wait for it to "
                           f"end, or choose another -o"), err
            assert first.poll() is None, "the first export ended before the second was tried"
        assert (tmp_path / "out.wav.lock").read_text() == f"{first.pid}\n"
        assert first.wait(60) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert out.read_bytes() == want_wav and (tmp_path / "out.cue").read_text() == want_cue
    # no parts or lock are left; the manifest is the record of the finished export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.cue", "out.wav", "out.wav.manifest.json"]
    ok(voicectl("export", str(src), "-o", str(out), *FAST))  # the lock is free again


def test_exports_to_different_outputs_run_side_by_side(clean, tmp_path):
    src, want_wav, _ = clean
    first = start_export(["export", str(src), "-o", str(tmp_path / "a.wav"), *FAKE, "--jobs", "1"],
                         tmp_path / "a.wav.parts", at_least=3)
    try:
        ok(voicectl("export", str(src), "-o", str(tmp_path / "b.wav"), *FAST))
        assert first.wait(60) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes() == want_wav


def interrupted_export(src, tmp_path):
    """An export of `src` to tmp_path/out.wav, SIGKILLed once some sentences are finished: (out, manifest data)."""
    out = tmp_path / "out.wav"
    interrupt(["export", str(src), "-o", str(out), *FAKE], tmp_path / "out.wav.parts", signal.SIGKILL)
    return out, json.loads((tmp_path / "out.wav.manifest.json").read_text())


@pytest.mark.parametrize("field,value,flags", [("done", 7, []), ("done", ["1"], ["--resume"]),
                                               ("sentences", "65", [])])
def test_a_manifest_field_of_the_wrong_type_is_one_line(clean, tmp_path, field, value, flags):
    src, _, _ = clean
    out, data = interrupted_export(src, tmp_path)
    (tmp_path / "out.wav.manifest.json").write_text(json.dumps({**data, field: value}))
    err = one_line_error(voicectl("export", str(src), "-o", str(out), *FAKE, *flags))
    assert f"is corrupt ('{field}' " in err and err.endswith("pass --restart to discard it and start over"), err


def test_a_manifest_of_another_version_is_refused_until_restart(clean, tmp_path):
    src, want_wav, _ = clean
    out, data = interrupted_export(src, tmp_path)
    (tmp_path / "out.wav.manifest.json").write_text(json.dumps({**data, "version": 1}))
    finished = sorted((tmp_path / "out.wav.parts").iterdir())
    for flags in ([], ["--resume"]):
        err = one_line_error(voicectl("export", str(src), "-o", str(out), *FAKE, *flags))
        assert err == (f"voicectl: {tmp_path / 'out.wav.manifest.json'} was written by another version of voicectl "
                       f"(manifest version 1; this one reads version {MANIFEST_VERSION}), so its finished sentences "
                       f"cannot be resumed; pass --restart to discard it and start over")
    assert sorted((tmp_path / "out.wav.parts").iterdir()) == finished and not out.exists()
    ok(voicectl("export", str(src), "-o", str(out), *FAST, "--restart"))
    assert out.read_bytes() == want_wav
