"""`voicectl export` given bad input, in subprocesses: an output that is its own input. Each gets one line and a non-zero exit, and leaves the input and any earlier export's work as they were."""
import os

import pytest

from tests.cli_helpers import one_line_error, voicectl
from tests.export.test_cli_export_book import BOOK, FAKE


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
