"""`voicectl export-many`: every book of a folder or a list, each the bytes `voicectl export` gives it, on one engine;
a finished set run again renders nothing; a list naming a missing book is one line."""
from __future__ import annotations

from tests.cli_helpers import one_line_error, voicectl
from tests.export.test_cli_export_book import ok

FAKE = ["--backend", "fake", "--no-progress"]
BOOKS = {"alpha.txt": "Chapter 1\n\nOne sentence here. Another one there.\n\nChapter 2\n\nA third one now.\n",
         "beta.md": "# Beta\n\nA short book of two sentences. That is all.\n"}


def write_books(folder):
    folder.mkdir()
    for name, text in BOOKS.items():
        (folder / name).write_text(text)
    (folder / "notes.json").write_text("{}")  # not a book
    return folder


def test_a_folder_of_books_gives_each_books_own_export(tmp_path):
    books = write_books(tmp_path / "books")
    for name in BOOKS:
        ok(voicectl("export", str(books / name), "-o", str(tmp_path / f"{name}.wav"), *FAKE))
    out = tmp_path / "out"
    err = ok(voicectl("export-many", str(books), "-o", str(out), "--format", "wav", *FAKE))
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".wav") == ["alpha.wav", "beta.wav"]
    for name in BOOKS:
        assert (out / f"{name.split('.')[0]}.wav").read_bytes() == (tmp_path / f"{name}.wav").read_bytes()
    assert err.count("wrote ") == 2
    err = ok(voicectl("export-many", str(books), "-o", str(out), "--format", "wav", *FAKE))
    assert err.count("is already complete") == 2 and "wrote" not in err


def test_a_list_of_books_and_one_that_is_missing(tmp_path):
    books = write_books(tmp_path / "books")
    listing = tmp_path / "list.txt"
    listing.write_text("# my books\nbooks/beta.md\n\n")
    ok(voicectl("export-many", str(listing), "-o", str(tmp_path / "out"), "--format", "wav", *FAKE))
    assert [p.name for p in (tmp_path / "out").glob("*.wav")] == ["beta.wav"]
    listing.write_text("books/beta.md\nbooks/gamma.txt\n")
    proc = voicectl("export-many", str(listing), "-o", str(tmp_path / "out2"), *FAKE)
    assert proc.returncode == 2
    assert f"names 1 books that are not there, first {books / 'gamma.txt'}" in one_line_error(proc)
