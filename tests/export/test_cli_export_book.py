"""`voicectl export` of books, in subprocesses: resume after a kill is byte-identical, chapters, CUE, split output,
loudness, manifest errors, disk full keeping finished parts."""
import os
import shutil
import signal
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import one_line_error, small_tmpfs, voicectl
from tests.export.test_book import DOCS, NAV, make_epub

FAKE = ["--backend", "fake"]
FAST = [*FAKE, "--jobs", "16"]
"""For exports that run to the end: the fake engine is paced like a model, and --jobs does not change the bytes."""
BOOK = "\n\n".join(f"Chapter {c}\n\n" + " ".join(f"Chapter {c} sentence {i} is here." for i in range(12))
                   for c in range(1, 6)) + "\n"


def ok(proc):
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stderr.decode()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """An uninterrupted export of BOOK: (source, out.wav bytes, out.cue text)."""
    d = tmp_path_factory.mktemp("clean")
    src = d / "book.txt"
    src.write_text(BOOK)
    ok(voicectl("export", str(src), "-o", str(d / "out.wav"), *FAKE, "--jobs", "7"))
    return src, (d / "out.wav").read_bytes(), (d / "out.cue").read_text()


def start_export(args, parts: Path, at_least=6, **popen) -> subprocess.Popen:
    """Start `voicectl ARGS` and return once `parts` holds at least `at_least` finished sentences."""
    proc = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", *args], stderr=subprocess.PIPE, **popen)
    end = time.monotonic() + 60
    while time.monotonic() < end and (not parts.is_dir() or len(list(parts.glob("*.part"))) < at_least):
        time.sleep(0.005)
    return proc


def interrupt(args, parts: Path, sig, at_least=6, **popen):
    """Start an export, wait until some sentences are finished, then send `sig`."""
    proc = start_export(args, parts, at_least, **popen)
    proc.send_signal(sig)
    err = proc.stderr.read().decode()
    return proc.wait(30), err


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_export_resumes_to_the_same_bytes(clean, tmp_path, sig):
    src, want_wav, want_cue = clean
    out = tmp_path / "out.wav"
    args = ["export", str(src), "-o", str(out), *FAKE, "--jobs", "2"]
    code, err = interrupt(args, tmp_path / "out.wav.parts", sig)
    assert code == (-9 if sig == signal.SIGKILL else 130), err
    assert not out.exists() and (tmp_path / "out.wav.manifest.json").exists()
    assert (tmp_path / "out.wav.lock").exists() == (sig == signal.SIGKILL)  # a killed export's lock file stays
    finished = len(list((tmp_path / "out.wav.parts").glob("*.part")))
    assert 6 <= finished < 60
    if sig == signal.SIGINT:
        assert err.strip() == (f"voicectl: interrupted; {finished} of 65 sentences are finished and kept in "
                               f"{tmp_path / 'out.wav.parts'}: rerun with --resume to continue"), err
    err = ok(voicectl("export", str(src), "-o", str(out), *FAST, "--resume"))
    assert f"{finished} were already done" in err
    assert out.read_bytes() == want_wav and (tmp_path / "out.cue").read_text() == want_cue
    # the parts are gone; the manifest is now the record of the finished export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.cue", "out.wav", "out.wav.manifest.json"]


@pytest.mark.slow
def test_killed_torch_export_resumes_to_the_same_bytes(tiny_model, tmp_path):
    """The real engine on the CPU (the tiny checkpoint): rendering 3 sentences at once, its whole process group
    SIGKILLed, then resumed one sentence at a time, it gives the bytes of a clean export with the default --jobs."""
    src = tmp_path / "in.txt"
    src.write_text(" ".join(f"Sentence number {i} is right here." for i in range(12)))
    engine = ["--model", str(tiny_model), "--backend", "torch", "--max-tokens", "150"]
    ok(voicectl("export", str(src), "-o", str(tmp_path / "clean.wav"), *engine))
    out, parts = tmp_path / "out.wav", tmp_path / "out.wav.parts"
    proc = start_export(["export", str(src), "-o", str(out), *engine, "--jobs", "3"], parts, at_least=3,
                        start_new_session=True)
    assert proc.poll() is None, proc.stderr.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.stderr.close()
    assert proc.wait(30) == -9 and not out.exists()
    finished = len(list(parts.glob("*.part")))
    assert 3 <= finished < 12
    err = ok(voicectl("export", str(src), "-o", str(out), *engine, "--resume", "--jobs", "1"))
    assert f"{finished} were already done" in err
    assert out.read_bytes() == (tmp_path / "clean.wav").read_bytes()


def test_killed_twice_in_a_row_resumes_to_the_same_bytes(clean, tmp_path):
    src, want_wav, want_cue = clean
    out, parts = tmp_path / "out.wav", tmp_path / "out.wav.parts"
    args = ["export", str(src), "-o", str(out), *FAKE, "--jobs", "2"]
    assert interrupt(args, parts, signal.SIGKILL)[0] == -9
    first = len(list(parts.glob("*.part")))
    code, err = interrupt([*args, "--resume"], parts, signal.SIGKILL, at_least=first + 6)
    assert code == -9 and not out.exists(), err
    second = len(list(parts.glob("*.part")))
    assert first + 6 <= second < 65
    err = ok(voicectl("export", str(src), "-o", str(out), *FAST, "--resume"))
    assert f"{second} were already done" in err
    assert out.read_bytes() == want_wav and (tmp_path / "out.cue").read_text() == want_cue


@pytest.mark.parametrize("lost", ["every other part", "the parts folder"])
def test_resume_renders_the_parts_that_were_deleted_again(clean, tmp_path, lost):
    src, want_wav, _ = clean
    out, parts = tmp_path / "out.wav", tmp_path / "out.wav.parts"
    interrupt(["export", str(src), "-o", str(out), *FAKE, "--jobs", "2"], parts, signal.SIGKILL, at_least=10)
    finished = sorted(parts.glob("*.part"))
    if lost == "the parts folder":
        shutil.rmtree(parts)
    for part in finished[::2] if lost == "every other part" else []:
        part.unlink()
    err = ok(voicectl("export", str(src), "-o", str(out), *FAST, "--resume"))
    kept = len(finished) // 2 if lost == "every other part" else 0
    assert (f"{kept} were already done" in err) == bool(kept), err
    assert out.read_bytes() == want_wav


def test_an_interrupted_export_is_not_discarded_without_asking(clean, tmp_path):
    src, want_wav, _ = clean
    out = tmp_path / "out.wav"
    interrupt(["export", str(src), "-o", str(out), *FAKE], tmp_path / "out.wav.parts", signal.SIGKILL)
    err = one_line_error(voicectl("export", str(src), "-o", str(out), *FAKE))
    assert "interrupted export" in err and "--resume" in err and "--restart" in err
    ok(voicectl("export", str(src), "-o", str(out), *FAST, "--restart"))
    assert out.read_bytes() == want_wav


@pytest.mark.parametrize("change,match", [(["--seed", "7"], "seed was 0, now 7"),
                                          (["--voice", "leo"], "voice was 'ava', now 'leo'"),
                                          ("input", "the input file changed")])
def test_resume_with_different_settings_is_refused(clean, tmp_path, change, match):
    src, _, _ = clean
    mine = tmp_path / "book.txt"
    mine.write_text(BOOK)
    out = tmp_path / "out.wav"
    interrupt(["export", str(mine), "-o", str(out), *FAKE], tmp_path / "out.wav.parts", signal.SIGKILL)
    extra = []
    if change == "input":
        mine.write_text(BOOK.replace("sentence 3 ", "sentence three "))
    else:
        extra = change
    err = one_line_error(voicectl("export", str(mine), "-o", str(out), *FAKE, "--resume", *extra))
    assert match in err and err.endswith("or pass --restart to discard it and start over"), err
    ok(voicectl("export", str(mine), "-o", str(out), *FAST, "--restart", *extra))  # what the message says works


@pytest.mark.parametrize("flags", [["--resume"], []])
def test_corrupt_manifest(clean, tmp_path, flags):
    """With or without --resume, a corrupt manifest is refused (its finished sentences are not dropped unasked);
    the message's --restart starts over."""
    src, want_wav, _ = clean
    out = tmp_path / "out.wav"
    interrupt(["export", str(src), "-o", str(out), *FAKE], tmp_path / "out.wav.parts", signal.SIGKILL)
    (tmp_path / "out.wav.manifest.json").write_text('{"format": "voiceapp-export", "vers')
    finished = sorted((tmp_path / "out.wav.parts").iterdir())
    err = one_line_error(voicectl("export", str(src), "-o", str(out), *FAKE, *flags))
    assert "corrupt" in err and err.endswith("; pass --restart to discard it and start over"), err
    assert sorted((tmp_path / "out.wav.parts").iterdir()) == finished
    ok(voicectl("export", str(src), "-o", str(out), *FAST, "--restart"))
    assert out.read_bytes() == want_wav


def test_resume_without_a_manifest_starts_from_the_beginning(clean, tmp_path):
    src, want_wav, _ = clean
    err = ok(voicectl("export", str(src), "-o", str(tmp_path / "out.wav"), *FAST, "--resume"))
    assert "nothing to resume" in err and (tmp_path / "out.wav").read_bytes() == want_wav


def test_cue_sheet_lists_the_chapters_at_their_offsets(clean):
    _, wav_bytes, cue = clean
    lines = cue.splitlines()
    assert lines[1] == 'TITLE "book"' and lines[2] == 'FILE "out.wav" WAVE'
    assert [line.strip() for line in lines if "TITLE" in line][1:] == [f'TITLE "Chapter {c}"' for c in range(1, 6)]
    indexes = [line.split()[-1] for line in lines if "INDEX" in line]
    assert indexes[0] == "00:00:00" and indexes == sorted(indexes) and len(set(indexes)) == 5


def test_directory_output_writes_one_wav_per_chapter(clean, tmp_path):
    src, want_wav, _ = clean
    ok(voicectl("export", str(src), "-o", f"{tmp_path / 'book'}/", *FAST))
    names = sorted(os.listdir(tmp_path / "book"))
    assert names.pop() == "export.manifest.json"  # the record of the finished export
    assert names == [f"0{c} - Chapter {c}.wav" for c in range(1, 6)]
    frames = 0
    for name in names:
        with wave.open(str(tmp_path / "book" / name)) as w:
            frames += w.getnframes()
    pause = int(0.18 * 16000)
    assert frames == (len(want_wav) - 44) // 2 - 4 * pause  # the same audio without the pauses between files
    ok(voicectl("export", str(src), "-o", str(tmp_path / "x.wav"), "--split-chapters", *FAST))
    assert (tmp_path / "x 03 - Chapter 3.wav").exists() and not (tmp_path / "x.wav").exists()


def in_long_zero_runs(x, length):
    """Mask of the samples inside runs of at least `length` zeros (the pauses between sentences)."""
    zero = np.concatenate([[0], (x == 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(zero))
    mask = np.zeros(len(x), bool)
    for start, stop in zip(edges[::2], edges[1::2]):
        if stop - start >= length:
            mask[start:stop] = True
    return mask


def test_normalize_loudness_hits_the_target_and_is_deterministic(clean, tmp_path):
    src, _, _ = clean
    for name in ("a.wav", "b.wav"):
        ok(voicectl("export", str(src), "-o", str(tmp_path / name), *FAST, "--normalize-loudness", "-18"))
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    with wave.open(str(tmp_path / "a.wav")) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64) / 32767
    speech = x[~in_long_zero_runs(x, int(0.18 * 16000))]  # pauses dropped, as the gain ignores them
    assert 20 * np.log10(np.sqrt(np.mean(speech ** 2))) == pytest.approx(-18.0, abs=0.2)
    assert 20 * np.log10(np.max(np.abs(x))) <= -2.99


def test_epub_export(tmp_path):
    (tmp_path / "b.epub").write_bytes(make_epub(DOCS, ["cover.xhtml", "c1.xhtml", "c2.xhtml"], nav=NAV))
    err = ok(voicectl("export", str(tmp_path / "b.epub"), "-o", str(tmp_path / "b.wav"), *FAKE))
    assert "in 2 chapters" in err
    assert 'TITLE "1. Darkness"' in (tmp_path / "b.cue").read_text()
    (tmp_path / "e.epub").write_bytes(make_epub({"cover.xhtml": DOCS["cover.xhtml"]}, ["cover.xhtml"]))
    err = one_line_error(voicectl("export", str(tmp_path / "e.epub"), "-o", str(tmp_path / "e.wav"), *FAKE))
    assert "no readable text" in err and not (tmp_path / "e.wav").exists()


def test_markdown_of_only_code_is_refused(tmp_path):
    (tmp_path / "c.md").write_text("```\nprint(1)\n```\n")
    err = one_line_error(voicectl("export", str(tmp_path / "c.md"), "-o", str(tmp_path / "c.wav"), *FAKE))
    assert "no speakable text" in err


@pytest.mark.parametrize("args,match", [(["--jobs", "0"], "--jobs"), (["--resume", "--restart"], "exclude")])
def test_bad_options(clean, tmp_path, args, match):
    src, _, _ = clean
    assert match in one_line_error(voicectl("export", str(src), "-o", str(tmp_path / "o.wav"), *FAKE, *args))


def test_disk_full_keeps_finished_parts_and_resume_completes(tmp_path):
    """A tmpfs that holds the parts but not the final WAV: the error says so, and --resume finishes after space
    is freed (here: the tmpfs is grown), with the same bytes as an export that never failed."""
    with small_tmpfs(tmp_path / "mnt", "240k") as mnt:
        src = tmp_path / "in.txt"
        src.write_text("One sentence here. Another one there. A third one now. And the last.")
        ok(voicectl("export", str(src), "-o", str(tmp_path / "want.wav"), *FAKE))
        err = one_line_error(voicectl("export", str(src), "-o", str(mnt / "o.wav"), *FAKE))
        assert "disk full" in err and "4 finished sentences are kept" in err and "--resume" in err
        assert sorted(os.listdir(mnt)) == ["o.wav.manifest.json", "o.wav.parts"]
        subprocess.run(["mount", "-o", "remount,size=2m", str(mnt)], check=True)
        err = ok(voicectl("export", str(src), "-o", str(mnt / "o.wav"), *FAKE, "--resume"))
        assert "4 were already done" in err
        assert (mnt / "o.wav").read_bytes() == (tmp_path / "want.wav").read_bytes()


def test_output_on_another_filesystem_than_the_current_directory_and_tmp(clean, tmp_path):
    """Every temp file is made beside its output, so no rename crosses filesystems: here the output is on a tmpfs,
    the current directory and $TMPDIR are not; killed, resumed, and to a directory."""
    src, want_wav, want_cue = clean
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    with small_tmpfs(tmp_path / "mnt", "16m") as mnt:
        args = ["export", str(src), "-o", "mnt/out.wav", *FAKE]
        code, err = interrupt(args, mnt / "out.wav.parts", signal.SIGKILL, cwd=tmp_path, env=env)
        assert code == -9, err
        ok(voicectl(*args, "--resume", "--jobs", "16", cwd=tmp_path, env=env))
        assert (mnt / "out.wav").read_bytes() == want_wav and (mnt / "out.cue").read_text() == want_cue
        ok(voicectl("export", str(src), "-o", "mnt/book/", *FAST, cwd=tmp_path, env=env))
        assert len(os.listdir(mnt / "book")) == 6  # 5 chapters and the manifest
        assert sorted(os.listdir(mnt)) == ["book", "out.cue", "out.wav", "out.wav.manifest.json"] and os.listdir(tmp_path / "tmp") == []
