"""Issue 41's export defects, one test each: links planted for the export's temp and lock files, EPUB bombs, a
failure before any sentence, stdin that is the output, a read-only CUE sheet, a loudness target that is not a
level, and --restart where the manifest's name is a directory. Each is one line and keeps what was there."""
import math
import os
import subprocess
import sys
import wave

import pytest

from engine.book import read_book
from engine.errors import GenerationError, InputError
from tests.cli_helpers import one_line_error, voicectl
from tests.export.test_book import make_epub
from tests.export.test_export_errors import export

TEXT = "Chapter 1\n\nOne sentence here. Another one there.\n\nChapter 2\n\nA third one now. And the last.\n"


@pytest.fixture
def src(tmp_path):
    (tmp_path / "in.txt").write_text(TEXT)
    (tmp_path / "victim.txt").write_text("keep me")
    return tmp_path / "in.txt"


def test_links_planted_at_temp_file_names_are_not_written_through(src, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    planted = [".out.wav.partial", ".out.cue.tmp", ".out.wav.manifest.json.tmp", ".out.m4b.partial"]
    for name in planted:
        (tmp_path / name).symlink_to(victim)
    for out in ("out.wav", "out.m4b"):
        code, err = export(capsys, str(src), "-o", str(tmp_path / out))
        assert code == 0, err
    assert victim.read_text() == "keep me"
    for name in ("out.wav", "out.cue", "out.m4b", "out.wav.manifest.json"):
        assert (tmp_path / name).is_file() and not (tmp_path / name).is_symlink(), name
    with wave.open(str(tmp_path / "out.wav")) as w:
        assert w.getnframes() > 0
    assert not any((tmp_path / name).exists() or (tmp_path / name).is_symlink() for name in planted)


def test_a_link_planted_as_the_lock_is_refused(src, tmp_path, capsys):
    (tmp_path / "out.wav.lock").symlink_to(tmp_path / "victim.txt")
    code, err = export(capsys, str(src), "-o", str(tmp_path / "out.wav"))
    assert code != 0 and err == f"voicectl: {tmp_path / 'out.wav.lock'} is a symbolic link, not an export's lock; " \
                                 f"remove it", err
    assert (tmp_path / "victim.txt").read_text() == "keep me" and not (tmp_path / "out.wav").exists()


# ---- EPUB bombs -------------------------------------------------------------------------------------------

MB = 1024 * 1024
PARAGRAPH = "<p>" + "A sentence of the book. " * 43_000 + "</p>"
"""About 1 MB of text, which deflate packs into a few KB."""


def deflated(data: bytes) -> bytes:
    """The EPUB with its members compressed, as a real one's are."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    return buf.getvalue()


def test_a_document_the_spine_lists_many_times_is_read_once():
    data = deflated(make_epub({"c.xhtml": PARAGRAPH}, ["c.xhtml"] * 30))
    assert len(data) < 20_000  # 30 MB of text, were it read as listed
    book = read_book("bomb.epub", data, max_bytes=4 * MB)
    assert sum(len(p) for c in book.chapters for p in c.paragraphs) < 1.1 * MB


def test_an_epubs_text_is_capped_by_max_bytes():
    docs = {f"c{i}.xhtml": PARAGRAPH for i in range(5)}
    with pytest.raises(InputError, match=r"^big.epub: its text is larger than 2 MB; pass --max-mb N"):
        read_book("big.epub", make_epub(docs, list(docs)), max_bytes=2 * MB)
    with pytest.raises(InputError, match=r"^big.epub: OEBPS/c0.xhtml is larger than 0.5 MB uncompressed"):
        read_book("big.epub", make_epub(docs, list(docs)), max_bytes=MB // 8)


def test_export_caps_an_epubs_text_with_max_mb(tmp_path):
    docs = {f"c{i}.xhtml": PARAGRAPH for i in range(3)}
    (tmp_path / "b.epub").write_bytes(make_epub(docs, list(docs)))
    err = one_line_error(voicectl("export", str(tmp_path / "b.epub"), "-o", str(tmp_path / "b.wav"),
                                  "--backend", "fake", "--max-mb", "2"))
    assert "its text is larger than 2 MB; pass --max-mb N" in err
    assert sorted(os.listdir(tmp_path)) == ["b.epub"]


# ---- the rest ---------------------------------------------------------------------------------------------

def test_a_failure_before_any_sentence_leaves_nothing_to_block_the_next_run(src, tmp_path, capsys, monkeypatch):
    from engine.pipeline import Synthesizer

    async def fails(self, request, text_stream=None):
        raise GenerationError("the model failed")

    monkeypatch.setattr(Synthesizer, "render", fails)
    code, err = export(capsys, str(src), "-o", str(tmp_path / "out.wav"))
    assert code != 0 and err == "voicectl: the model failed", err
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "victim.txt"]
    monkeypatch.undo()
    code, err = export(capsys, str(src), "-o", str(tmp_path / "out.wav"))
    assert code == 0, err


def test_stdin_that_is_the_output_file_is_refused(tmp_path):
    out = tmp_path / "x.wav"
    out.write_text(TEXT)
    with open(out, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "voiceapp.cli", "export", "-", "-o", str(out), "--backend",
                               "fake"], stdin=stdin, capture_output=True, timeout=60)
    err = one_line_error(proc)
    assert err == f"voicectl: stdin: the export would overwrite its own input (as {out}); choose another -o"
    assert out.read_text() == TEXT


def test_a_read_only_cue_sheet_is_kept(src, tmp_path, capsys):
    cue = tmp_path / "out.cue"
    cue.write_text("a sheet someone keeps")
    cue.chmod(0o444)
    code, err = export(capsys, str(src), "-o", str(tmp_path / "out.wav"))
    assert code != 0 and err == f"voicectl: {cue} exists and is read-only; remove it or choose another -o", err
    assert cue.read_text() == "a sheet someone keeps" and not (tmp_path / "out.wav").exists()


@pytest.mark.parametrize("target", ["-inf", "inf", "nan", "0", "-120"])
def test_a_loudness_target_that_is_not_a_level_is_refused(src, tmp_path, capsys, target):
    code, err = export(capsys, str(src), "-o", str(tmp_path / "out.wav"), f"--normalize-loudness={target}")
    shown = f"{float(target):g}" if math.isfinite(float(target)) else target
    assert code != 0 and err == f"voicectl: --normalize-loudness {shown}: must be a number from -50 to -6 dBFS", err
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "victim.txt"]


def test_restart_where_the_manifest_is_a_directory_is_one_line(src, tmp_path):
    (tmp_path / "out.wav.manifest.json").mkdir()
    (tmp_path / "out.wav.manifest.json" / "mine.txt").write_text("not the export's")
    for extra in (["--restart"], [], ["--resume"]):
        err = one_line_error(voicectl("export", str(src), "-o", str(tmp_path / "out.wav"), "--backend", "fake",
                                      *extra))
        assert str(tmp_path / "out.wav.manifest.json") in err, err
    assert (tmp_path / "out.wav.manifest.json" / "mine.txt").read_text() == "not the export's"


def test_a_manifest_nested_50000_deep_is_one_line(src, tmp_path):
    """A manifest (or anything at its name) nested far deeper than any manifest is: one line, not a RecursionError
    traceback; the file is left alone."""
    manifest = tmp_path / "out.wav.manifest.json"
    manifest.write_text("[" * 50_000 + "]" * 50_000)
    err = one_line_error(voicectl("export", str(src), "-o", str(tmp_path / "out.wav"), "--backend", "fake",
                                  "--resume", text=True))
    assert "nested too deep" in err and manifest.read_text().startswith("[[[")
