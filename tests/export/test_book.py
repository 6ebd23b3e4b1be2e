"""engine.book: chapters and sentences from .txt, .md and .epub (EPUBs are built here with zipfile)."""
import io
import zipfile

import pytest

from engine.book import FRONT_MATTER, book_sentences, read_book
from engine.errors import InputError


def titles(book):
    return [c.title for c in book.chapters]


# ---- plain text -------------------------------------------------------------------------------------------

GUTENBERG = """PRIDE AND PREJUDICE

By Jane Austen


CHAPTER I.

It is a truth universally acknowledged, that a single man in possession
of a good fortune, must be in want of a wife.

Chapter 2: The Visit

Mr. Bennet was among the earliest of those who waited on Mr. Bingley.

CHAPTER THREE
The Ball

Text three.

Chapter Twenty-One

Late text.

Epilogue

The end.
"""


def test_txt_chapters_from_heading_lines():
    book = read_book("pp.txt", GUTENBERG)
    assert titles(book) == [FRONT_MATTER, "CHAPTER I", "Chapter 2: The Visit", "CHAPTER THREE: The Ball",
                            "Chapter Twenty-One", "Epilogue"]
    assert book.chapters[0].paragraphs == ("PRIDE AND PREJUDICE", "By Jane Austen")
    assert book.chapters[3].paragraphs == ("CHAPTER THREE: The Ball", "Text three.")  # titles are spoken


def test_txt_hard_wrapped_prose_is_joined_but_short_lines_are_kept():
    book = read_book("x.txt", GUTENBERG)
    assert book.chapters[1].paragraphs[1] == ("It is a truth universally acknowledged, that a single man in "
                                              "possession of a good fortune, must be in want of a wife.")
    poem = read_book("p.txt", "Roses are red\nViolets are blue\nSugar is sweet\n")
    assert poem.chapters[0].paragraphs == ("Roses are red", "Violets are blue", "Sugar is sweet")


@pytest.mark.parametrize("line", ["Chapter 1 was the best part of the book and everyone said so at length, truly.",
                                  "Part of the plan.", "The chapter 1 heading", "Book it now!"])
def test_txt_prose_is_not_a_heading(line):
    book = read_book("x.txt", f"Intro text here.\n\n{line}\n\nMore text.\n")
    assert len(book.chapters) == 1 and titles(book) == ["x"]


def test_txt_without_chapters_is_one_chapter_named_after_the_file():
    book = read_book("notes/my_story.txt", "Just some text. Two sentences.")
    assert titles(book) == ["my_story"]
    assert [s.text for s in book_sentences(book, 280)] == ["Just some text.", "Two sentences."]


def test_sentences_are_indexed_by_chapter_and_skip_unspeakable_lines():
    book = read_book("x.txt", "Chapter 1\n\nOne. Two.\n\n* * *\n\nChapter 2\n\nThree.\n")
    assert [(s.chapter, s.text) for s in book_sentences(book, 280)] == [
        (0, "Chapter 1"), (0, "One."), (0, "Two."), (1, "Chapter 2"), (1, "Three.")]


# ---- markdown ---------------------------------------------------------------------------------------------

MARKDOWN = """---
title: front matter is dropped
---
# The Book

## Chapter One

Some **bold**, *emphasis*, _underscored_ and `code` words with a [link](http://example.com/x) and an
image ![alt text](pic.png) and a footnote[^1] and <span>html</span> and snake_case_name.

```python
print("code is not read")
```

- first item
- second item

> A quoted
> passage.

| Name | Age |
|------|-----|
| Ann  | 30  |

[ref]: http://example.com

Chapter Two
-----------

Escaped \\*stars\\* stay.
"""


def test_markdown_headings_become_chapters_and_syntax_is_stripped():
    book = read_book("b.md", MARKDOWN)
    assert book.title == "The Book"
    assert titles(book) == ["Chapter One", "Chapter Two"]  # the lone H1 opens the first chapter
    one = book.chapters[0].paragraphs
    assert one[:2] == ("The Book", "Chapter One")
    assert one[2] == ("Some bold, emphasis, underscored and code words with a link and an image and a footnote "
                      "and html and snake_case_name.")
    assert one[3:] == ("first item", "second item", "A quoted passage.", "Name, Age", "Ann, 30")
    assert book.chapters[1].paragraphs == ("Chapter Two", "Escaped *stars* stay.")
    text = " ".join(p for c in book.chapters for p in c.paragraphs)
    assert "print" not in text and "http" not in text and "front matter" not in text and "#" not in text


def test_markdown_chapter_level_is_the_top_repeated_heading():
    book = read_book("b.md", "# One\n\nText.\n\n### Sub\n\nMore.\n\n# Two\n\nText two.\n")
    assert titles(book) == ["One", "Two"] and "Sub" in book.chapters[0].paragraphs


def test_markdown_intro_before_the_first_chapter_is_front_matter():
    book = read_book("b.md", "Some intro text.\n\n# One\n\nText.\n\n# Two\n\nMore.\n")
    assert titles(book) == [FRONT_MATTER, "One", "Two"]


def test_an_unclosed_code_fence_does_not_drop_the_rest_of_the_book():
    text = "# One\n\nFirst text.\n\n```\nx = 1\n\n# Two\n\nThe rest of the book.\n"
    book = read_book("b.md", text)
    assert titles(book) == ["One", "Two"] and book.chapters[1].paragraphs == ("Two", "The rest of the book.")
    assert book.chapters[0].paragraphs == ("One", "First text.", "x = 1")
    assert book.notices == ("b.md: the code block opened at line 5 is never closed; the 5 lines after it are read "
                            "as text",)


def test_closed_code_fences_are_not_read_even_in_quotes_and_lists():
    text = "# One\n\n> ```\n> quoted()\n> ```\n\n- item\n\n  ~~~~\n  listed()\n  ~~~~\n\nEnd.\n"
    book = read_book("b.md", text)
    assert book.chapters[0].paragraphs == ("One", "item", "End.") and book.notices == ()


def test_markdown_of_only_code_has_no_sentences():
    assert book_sentences(read_book("c.md", "```\nx = 1\n```\n"), 280) == []


# ---- epub -------------------------------------------------------------------------------------------------

def xhtml(body: str) -> str:
    return ('<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml" '
            'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>Not read</title>'
            f'<style>p {{ color: red }}</style></head><body>{body}</body></html>')


CONTAINER = ('<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
             '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
             '</rootfiles></container>')


def make_epub(docs: dict[str, str], spine: list[str], *, nav: str | None = None, ncx: str | None = None,
              extra: dict[str, str] | None = None, title="A Tiny Book", opf: str | None = None,
              author: str = "", language: str = "", cover: bytes | None = None) -> bytes:
    items = "".join(f'<item id="{n}" href="{n}" media-type="application/xhtml+xml"/>' for n in docs)
    if nav:
        items += '<item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>'
    if ncx:
        items += '<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>'
    marked = ' properties="cover-image"' if cover is not None else ""
    items += f'<item id="img" href="cover.png" media-type="image/png"{marked}/>'
    meta = (f"<dc:creator>{author}</dc:creator>" if author else "") + (
        f"<dc:language>{language}</dc:language>" if language else "")
    refs = "".join(f'<itemref idref="{n}"/>' for n in spine)
    opf = opf or ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
           f'<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{title}</dc:title>{meta}</metadata>'
           f'<manifest>{items}</manifest><spine>{refs}</spine></package>')
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("mimetype", "application/epub+zip")
        z.writestr("META-INF/container.xml", CONTAINER)
        z.writestr("OEBPS/content.opf", opf)
        z.writestr("OEBPS/cover.png", b"\x89PNG fake" if cover is None else cover)
        for name, body in docs.items():
            z.writestr(f"OEBPS/{name}", xhtml(body))
        if nav:
            z.writestr("OEBPS/nav.xhtml", xhtml(nav))
        if ncx:
            z.writestr("OEBPS/toc.ncx", ncx)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return buf.getvalue()


DOCS = {
    "cover.xhtml": '<div><img src="cover.png"/></div>',
    "c1.xhtml": "<h1>Chapter One</h1><p>It was a dark night.</p><p>The rain fell <em>hard</em>"
                "<sup><a epub:type=\"noteref\" href=\"#n1\">1</a></sup>.</p><script>alert('no')</script>",
    "c2.xhtml": "<h2>Second</h2><p>Line one<br/>line two</p><pre>code()</pre><p>R&amp;D &#8212; done.</p>",
}
NAV = ('<nav epub:type="toc"><ol><li><a href="c1.xhtml">1. Darkness</a></li>'
       '<li><a href="c2.xhtml#start">2. Light</a></li></ol></nav>')


def test_epub_spine_order_toc_titles_and_text():
    book = read_book("b.epub", make_epub(DOCS, ["cover.xhtml", "c2.xhtml", "c1.xhtml"], nav=NAV))
    assert book.title == "A Tiny Book"
    assert titles(book) == ["2. Light", "1. Darkness"]  # spine order; the image-only cover is dropped
    assert book.chapters[0].paragraphs == ("Second", "Line one", "line two", "R&D \u2014 done.")
    assert book.chapters[1].paragraphs == ("Chapter One", "It was a dark night.", "The rain fell hard.")


PARTS = {
    "p1c1.xhtml": "<h1>PART I.</h1><h2>CHAPTER I.</h2><p>First of part one.</p>",
    "p1c2.xhtml": "<h2>CHAPTER II.</h2><p>Second of part one.</p><h3 id='s2'>A Section</h3><p>Its text.</p>",
    "p2c1.xhtml": "<h1>PART II.</h1><h2>CHAPTER I.</h2><p>First of part two.</p>",
    "p2c1b.xhtml": "<p>The same chapter, in a second file.</p>",
}
PARTS_NAV = ('<nav epub:type="toc"><ol>'
             '<li><span>PART I.</span><ol><li><a href="p1c1.xhtml">CHAPTER I.</a></li>'
             '<li><a href="p1c2.xhtml">CHAPTER II.</a><ol><li><a href="p1c2.xhtml#s2">A Section</a></li></ol></li>'
             '</ol></li><li><span>PART II.</span><ol><li><a href="p2c1.xhtml">CHAPTER I.</a></li></ol></li>'
             '</ol></nav><nav epub:type="landmarks"><ol><li><a href="p2c1b.xhtml">Not the toc</a></li></ol></nav>')


def test_epub_parts_chapters_and_sections_from_the_nav_are_nested_titles():
    book = read_book("b.epub", make_epub(PARTS, list(PARTS), nav=PARTS_NAV))
    assert titles(book) == ["PART I, CHAPTER I.", "PART I, CHAPTER II.", "PART I, CHAPTER II, A Section",
                            "PART II, CHAPTER I."]
    assert book.chapters[1].paragraphs == ("CHAPTER II.", "Second of part one.")
    assert book.chapters[2].paragraphs == ("A Section", "Its text.")
    assert book.chapters[3].paragraphs == ("PART II.", "CHAPTER I.", "First of part two.",
                                           "The same chapter, in a second file.")
    assert book.notices == ()


def test_epub2_ncx_nesting_gives_the_same_titles():
    ncx = ('<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1"><navMap>'
           '<navPoint id="a"><navLabel><text>PART I.</text></navLabel><content src="p1c1.xhtml"/>'
           '<navPoint id="b"><navLabel><text>CHAPTER I.</text></navLabel><content src="p1c1.xhtml"/></navPoint>'
           '<navPoint id="c"><navLabel><text>CHAPTER II.</text></navLabel><content src="p1c2.xhtml"/></navPoint>'
           '</navPoint><navPoint id="d"><navLabel><text>PART II.</text></navLabel><content src="p2c1.xhtml"/>'
           '</navPoint></navMap></ncx>')
    book = read_book("b.epub", make_epub(PARTS, list(PARTS), ncx=ncx))
    assert titles(book) == ["PART I, CHAPTER I.", "PART I, CHAPTER II.", "PART II."]


@pytest.mark.parametrize("nav,said", [
    (None, "b.epub: it has no table of contents; its chapters follow the spine"),
    ('<nav epub:type="toc"><ol><li><a href="gone.xhtml">Gone</a></li></ol></nav>',
     "b.epub: its table of contents points at no document of the book; its chapters follow the spine"),
])
def test_epub_without_a_usable_nav_follows_the_spine_with_a_notice(nav, said):
    book = read_book("b.epub", make_epub(PARTS, list(PARTS), nav=nav))
    assert titles(book) == ["PART I.", "CHAPTER II.", "PART II.", "Section 4"]
    assert book.notices == (said,)


def test_epub2_ncx_titles_and_heading_fallback():
    ncx = ('<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1"><navMap>'
           '<navPoint id="p1"><navLabel><text>From the NCX</text></navLabel><content src="c1.xhtml"/></navPoint>'
           '</navMap></ncx>')
    book = read_book("b.epub", make_epub(DOCS, ["c1.xhtml", "c2.xhtml"], ncx=ncx))
    assert titles(book) == ["From the NCX", "Second"]


def test_epub_document_with_several_chapters_is_split_at_its_headings():
    doc = "<h1>Part A</h1><p>Alpha text.</p><h1>Part B</h1><p>Beta text.</p><h2>Sub</h2><p>More.</p>"
    book = read_book("b.epub", make_epub({"all.xhtml": doc}, ["all.xhtml"]))
    assert titles(book) == ["Part A", "Part B"] and book.chapters[1].paragraphs == ("Part B", "Beta text.", "Sub",
                                                                                     "More.")


def test_epub_without_text_is_a_clear_error():
    data = make_epub({"cover.xhtml": DOCS["cover.xhtml"]}, ["cover.xhtml"])
    with pytest.raises(InputError, match="no readable text"):
        read_book("empty.epub", data)


@pytest.mark.parametrize("case,match", [
    ("not_zip", "not an EPUB"), ("no_container", "container.xml"), ("bad_opf", "not well-formed"),
    ("missing_doc", "missing from it"), ("drm", "DRM-protected")])
def test_broken_epubs_are_clear_errors(case, match):
    if case == "not_zip":
        data = b"plain text, not a zip"
    elif case == "no_container":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("mimetype", "application/epub+zip")
        data = buf.getvalue()
    elif case == "bad_opf":
        data = make_epub(DOCS, ["c1.xhtml"], opf="<package")
    elif case == "missing_doc":
        data = make_epub({"c1.xhtml": "x"}, ["c1.xhtml"])
        buf = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w") as dst:
            for info in src.infolist():
                if info.filename != "OEBPS/c1.xhtml":
                    dst.writestr(info, src.read(info))
        data = buf.getvalue()
    else:
        enc = ('<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
               'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:CipherData>'
               '<enc:CipherReference URI="OEBPS/c1.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>')
        data = make_epub(DOCS, ["c1.xhtml"], extra={"META-INF/encryption.xml": enc})
    with pytest.raises(InputError, match=match):
        read_book("b.epub", data)
