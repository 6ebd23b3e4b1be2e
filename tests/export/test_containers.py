"""`voicectl export -o BOOK.m4b | .mp3 | .opus`: chapters, tags and cover read back with PyAV, the duration of
the WAV export within one codec frame, resume after a kill or a full disk (the same bytes as a clean export), and
bad covers and formats as one line each. The whole novel to M4B is in test_longform."""
import errno
import io
import os
import signal
import subprocess
import wave
from pathlib import Path

import av
import numpy as np
import pytest

from engine.export_plan import CUE_MAX_FRAMES, cue_fits, cue_sheet
from tests.cli_helpers import one_line_error, small_tmpfs, voicectl
from tests.export.test_cli_export_book import BOOK, FAKE, FAST, interrupt, ok

FRAME = {".m4b": 1024, ".mp3": 1152, ".opus": 960}
"""One codec frame in samples at 16 and 24 kHz (Opus: 20 ms at 48 kHz, what it decodes to)."""


def png(width: int, height: int) -> bytes:
    """A real PNG of that size, encoded by FFmpeg."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="image2pipe") as c:
        s = c.add_stream("png")
        s.width, s.height, s.pix_fmt = width, height, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 120, np.uint8), format="rgb24")
        for packet in [*s.encode(frame), *s.encode(None)]:
            c.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """BOOK's text, a cover, and its WAV export's length in seconds and CUE sheet."""
    d = tmp_path_factory.mktemp("containers")
    (d / "book.txt").write_text(BOOK)
    (d / "cover.png").write_bytes(png(32, 24))
    ok(voicectl("export", str(d / "book.txt"), "-o", str(d / "book.wav"), *FAST))
    with wave.open(str(d / "book.wav")) as w:
        seconds = w.getnframes() / w.getframerate()
    return d, seconds, (d / "book.cue").read_text()


def cue_starts(cue: str) -> list[float]:
    import re

    return [(int(m) * 60 + int(s)) + int(f) / 75 for m, s, f in re.findall(r"INDEX 01 (\d+):(\d+):(\d+)", cue)]


def read_back(path):
    """(duration s, container tags, audio stream tags, chapters as (title, start s), cover bytes or None)."""
    with av.open(str(path)) as c:
        audio = c.streams.audio[0]
        tags = dict(c.metadata) or dict(audio.metadata)  # Ogg keeps its comments on the stream
        duration = float(audio.duration * audio.time_base) if audio.duration else c.duration / 1e6
        chapters = [(ch["metadata"]["title"], float(ch["start"] * ch["time_base"])) for ch in c.chapters()]
        pictures = [s for s in c.streams.video if s.disposition & av.stream.Disposition.attached_pic]
        cover = bytes(next(c.demux(pictures[0]))) if pictures else None
        return duration, tags, dict(audio.metadata), chapters, cover


@pytest.mark.parametrize("suffix", [".m4b", ".mp3", ".opus"])
def test_a_container_holds_the_chapters_tags_and_cover(book, suffix):
    d, seconds, cue = book
    out = d / f"book{suffix}"
    ok(voicectl("export", str(d / "book.txt"), "-o", str(out), *FAST, "--title", "The Test Book", "--author",
                "A. N. Author", "--cover", str(d / "cover.png")))
    duration, tags, audio_tags, chapters, cover = read_back(out)
    assert abs(duration - seconds) <= FRAME[suffix] / 16000, (duration, seconds)
    assert [t for t, _ in chapters] == [f"Chapter {c}" for c in range(1, 6)]
    for (_, at), want in zip(chapters, cue_starts(cue)):
        assert abs(at - want) <= 1 / 75 + 0.001
    lower = {k.lower(): v for k, v in tags.items()}
    assert (lower["title"], lower["artist"], lower["genre"]) == ("The Test Book", "A. N. Author", "Audiobook")
    assert cover == (d / "cover.png").read_bytes()  # Ogg's picture comment is read back as a picture stream too


def test_split_chapters_to_m4b_tags_each_file(book):
    d, _, _ = book
    ok(voicectl("export", str(d / "book.txt"), "-o", str(d / "split.m4b"), *FAST, "--split-chapters"))
    files = sorted(d.glob("split *.m4b"))
    assert [f.name for f in files] == [f"split 0{c} - Chapter {c}.m4b" for c in range(1, 6)]
    _, tags, _, chapters, _ = read_back(files[1])
    assert (tags["title"], tags["album"], tags["track"], chapters) == ("Chapter 2", "book", "2", [])


def test_an_epub_gives_its_title_author_language_and_cover(tmp_path):
    from tests.export.test_book import DOCS, make_epub

    cover = png(16, 16)
    (tmp_path / "b.epub").write_bytes(make_epub(DOCS, ["c1.xhtml", "c2.xhtml"], title="Test Book",
                                                author="Jane Writer", language="fr", cover=cover))
    ok(voicectl("export", str(tmp_path / "b.epub"), "-o", str(tmp_path / "b.m4b"), *FAST))
    _, tags, audio_tags, _, got = read_back(tmp_path / "b.m4b")
    assert (tags["title"], tags["artist"], audio_tags["language"], got) == ("Test Book", "Jane Writer", "fra", cover)


def test_a_killed_m4b_export_resumes_to_the_same_bytes(book, tmp_path):
    d, _, _ = book
    ok(voicectl("export", str(d / "book.txt"), "-o", str(tmp_path / "clean.m4b"), *FAST))
    args = ["export", str(d / "book.txt"), "-o", str(tmp_path / "out.m4b"), *FAKE, "--jobs", "2"]
    code, err = interrupt(args, tmp_path / "out.m4b.parts", signal.SIGKILL)
    assert code == -9 and not (tmp_path / "out.m4b").exists(), err
    assert "were already done" in ok(voicectl(*args, "--resume"))
    assert (tmp_path / "out.m4b").read_bytes() == (tmp_path / "clean.m4b").read_bytes()


@pytest.mark.parametrize("case,said", [
    ("text", "the cover is not a PNG or JPEG image"),
    ("wide", "the cover is 5000x8 pixels; at most 4096 a side"),
    ("large", "the cover is larger than 10 MB"),
    ("missing", "no such file"),
])
def test_a_bad_cover_is_one_line_before_any_work(book, tmp_path, case, said):
    d, _, _ = book
    cover = tmp_path / "cover.png"
    if case == "text":
        cover.write_text("not an image at all")
    elif case == "wide":
        cover.write_bytes(png(5000, 8))
    elif case == "large":
        cover.write_bytes(png(8, 8) + bytes(10 * 1024 * 1024))
    err = one_line_error(voicectl("export", str(d / "book.txt"), "-o", str(tmp_path / "o.m4b"), *FAKE,
                                  "--cover", str(cover)))
    assert said in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if case == "missing" else ["cover.png"])


def test_a_format_ffmpeg_cannot_write_is_one_line_listing_what_can(book, tmp_path):
    d, _, _ = book
    err = one_line_error(voicectl("export", str(d / "book.txt"), "-o", str(tmp_path / "o.flac"), *FAKE))
    assert err == f"voicectl: {tmp_path / 'o.flac'}: cannot write .flac here; export writes .wav, .m4b, .mp3, .opus"


def test_a_cue_sheet_is_written_only_while_its_minutes_have_two_digits():
    rate = 24000
    last = CUE_MAX_FRAMES * rate // 75
    assert cue_fits([("One", 0), ("Two", last)], rate)
    assert not cue_fits([("One", 0), ("Two", last + rate // 75)], rate)
    assert cue_sheet("B", "b.wav", [("One", 0), ("Two", last)], rate).rstrip().endswith("INDEX 01 99:59:74")


def test_a_book_too_long_for_a_cue_sheet_gets_none_and_a_notice(tmp_path, capsys, monkeypatch):
    import engine.export_plan
    from voiceapp.cli import main

    (tmp_path / "b.txt").write_text(BOOK)
    (tmp_path / "b.cue").write_text("an earlier sheet")
    monkeypatch.setattr(engine.export_plan, "CUE_MAX_FRAMES", 75)  # a second: the second chapter starts later
    code = main(["export", str(tmp_path / "b.txt"), "-o", str(tmp_path / "b.wav"), *FAST, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0 and "no b.cue: the last chapter starts after 99:59" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt", "b.wav", "b.wav.manifest.json"]


def _used_bytes(mnt) -> int:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@pytest.mark.parametrize("suffix", [".m4b", ".mp3", ".opus"])
def test_a_disk_that_fills_while_encoding_keeps_the_parts_and_resume_completes(book, tmp_path, suffix):
    """Issue 38: the disk fills while the finished parts are encoded. A real tmpfs: a first run is stopped
    before encoding by a directory planted at the encoder's temp name (so every part is on disk, whatever the
    timing); the tmpfs is then shrunk to what it holds plus half the encoded file, and --resume runs out of
    space while encoding. One line, no file left looking complete, every part kept; once the tmpfs is grown,
    --resume writes the same file a clean export writes."""
    d, _, _ = book
    want = d / f"clean{suffix}"
    args = [str(d / "book.txt"), *FAST]
    ok(voicectl("export", *args, "-o", str(want)))
    with small_tmpfs(tmp_path / "mnt", "16m") as mnt:
        out = mnt / f"o{suffix}"
        (mnt / f".{out.name}.partial").mkdir()  # neither created nor removed: the run stops before encoding
        one_line_error(voicectl("export", *args, "-o", str(out)))
        parts = sorted(os.listdir(mnt / f"o{suffix}.parts"))
        assert len(parts) >= 60, parts
        (mnt / f".{out.name}.partial").rmdir()
        size = -(-(_used_bytes(mnt) + want.stat().st_size // 2) // 4096) * 4096
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)
        err = one_line_error(voicectl("export", *args, "-o", str(out), "--resume"))
        assert "disk full" in err and f"{len(parts)} finished sentences are kept" in err and "--resume" in err, err
        assert sorted(os.listdir(mnt)) == [out.name + ".manifest.json", out.name + ".parts"]
        assert sorted(os.listdir(mnt / f"o{suffix}.parts")) == parts
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        assert f"{len(parts)} were already done" in ok(voicectl("export", *args, "-o", str(out), "--resume"))
        assert sorted(os.listdir(mnt)) == [out.name, out.name + ".manifest.json"]
        assert out.read_bytes() == want.read_bytes()


class FillingFile(io.BytesIO):
    """A file whose disk holds `room` bytes: a write past them raises ENOSPC, as do later seeks (a buffered
    file's seek writes what it holds first)."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room, self.full = room, False

    def write(self, data) -> int:
        if self.full or self.tell() + len(data) > self.room:
            self.full = True
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)

    def seek(self, offset, whence=0):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().seek(offset, whence)


@pytest.mark.parametrize("suffix", [".m4b", ".mp3", ".opus"])
@pytest.mark.parametrize("room", [0.0, 0.5, -64])
def test_a_full_disk_while_encoding_is_the_disks_error_and_prints_nothing(capfd, suffix, room):
    """In-process (no tmpfs, no root): a write failing at the start, half way, or in the file's last 64 bytes
    (the trailer) reaches the caller as the disk's OSError, not FFmpeg's echo of it, and PyAV prints no dropped
    exception: MP3 and Opus seek back when closed, which failed again inside FFmpeg and printed a traceback."""
    from voiceapp.audio.containers import CONTAINERS, Mark, Tags, encode

    rate = 16000
    pcm = (np.sin(np.arange(rate * 4) / 7) * 8000).astype("<i2").tobytes()
    pieces = [pcm[i:i + rate] for i in range(0, len(pcm), rate)]
    whole = FillingFile(1 << 30)
    encode(whole, Path(f"b{suffix}"), CONTAINERS[suffix], rate, pieces, [Mark("One", 0, rate * 2)], Tags("B"))
    size = len(whole.getvalue())
    room = int(size * room) if room >= 0 else size + room
    with pytest.raises(OSError) as caught:
        encode(FillingFile(room), Path(f"b{suffix}"), CONTAINERS[suffix], rate, pieces,
               [Mark("One", 0, rate * 2)], Tags("B"))
    assert caught.value.errno == errno.ENOSPC
    out, err = capfd.readouterr()
    assert out == "" and err == "", err


@pytest.mark.parametrize("suffix", [".m4b", ".mp3", ".opus"])
def test_two_encodings_of_the_same_audio_have_the_same_bytes(suffix):
    """Resume and a clean run must agree byte for byte: Ogg's stream serial number was random in every file."""
    from voiceapp.audio.containers import CONTAINERS, Mark, Tags, encode

    pcm = (np.sin(np.arange(16000) / 5) * 6000).astype("<i2").tobytes()
    files = [io.BytesIO(), io.BytesIO()]
    for f in files:
        encode(f, Path(f"b{suffix}"), CONTAINERS[suffix], 16000, [pcm], [Mark("One", 0, 16000)], Tags("B"))
    assert files[0].getvalue() == files[1].getvalue()
