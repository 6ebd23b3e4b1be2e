"""Build an EPUB 3 from a novel's plain text (Project Gutenberg layout), byte for byte the same for the same input.

    python scripts/make_epub.py tests/data/a-study-in-scarlet.txt.xz OUT.epub

For the long-form export tests (tests/export/test_longform.py): a real book with parts, chapters, dialogue,
numbers, abbreviations and very long paragraphs. Stdlib only.

Input: UTF-8 text, plain or .xz/.gz compressed, without Gutenberg's header and licence: paragraphs separated by
blank lines, hard-wrapped lines, "PART I." and "CHAPTER I. TITLE." heading lines, _underscores_ for italics,
"--" for dashes, [n] footnote markers. Text before the first heading is the book's title.
Output: `mimetype` (first, stored), META-INF/container.xml, OEBPS/content.opf (metadata, manifest, spine),
OEBPS/nav.xhtml (the table of contents, chapters nested under their parts) and one XHTML document per chapter; a
part's heading and subtitle open its first chapter's document. Fixed timestamps, member order and identifier
(from the text's hash) make the bytes depend on the input alone.
Conversion: wrapped lines are joined with spaces. An indented paragraph (a list, an inscription, verse) keeps its
lines, except that a line indented JOIN_INDENT columns deeper than the paragraph's first continues the line
before (a wrapped list item). _x_ becomes <em>x</em>, "--" an em dash; footnote markers are dropped (the notes
are not in the text). The longest paragraph of A Study in Scarlet is about 1,800 characters, so all paragraphs of
chapter --join-chapter (default LONG_CHAPTER, a narrative one) are joined into one: a paragraph of tens of
thousands of characters, dialogue included.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import lzma
import re
import sys
import zipfile
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

LONG_CHAPTER = 8
"""Chapter (1-based, across parts) whose paragraphs are joined into one: Part II, chapter I of A Study in Scarlet,
the desert crossing, mostly narrative (about 24,000 characters)."""
JOIN_INDENT = 8
"""In an indented paragraph, a line this much deeper than the first line continues the line before."""
ZIP_TIME = (2000, 1, 1, 0, 0, 0)
"""Every member's timestamp (zip needs one; the build time would make every build's bytes differ)."""
MODIFIED = "2000-01-01T00:00:00Z"
"""The OPF's required dcterms:modified, fixed for the same reason."""

_PART = re.compile(r"PART\s+([IVXLC]+|\d+)\.?(?:\s+(.*))?")
_CHAPTER = re.compile(r"CHAPTER\s+([IVXLC]+|\d+)\b.*")
_FOOTNOTE = re.compile(r"\s*\[\d+\]")
_ITALIC = re.compile(r"_([^_]+)_")
_XHTML_HEAD = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml" '
               'xmlns:epub="http://www.idpf.org/2007/ops" xml:lang="en" lang="en">\n<head><title>{title}</title>'
               '</head>\n<body>\n')
CONTAINER = ('<?xml version="1.0" encoding="utf-8"?>\n<container version="1.0" '
             'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
             'full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>\n')


@dataclass
class Chapter:
    """One chapter: one XHTML document of the EPUB."""

    heading: str
    part: str | None = None
    """Set on the first chapter of a part: the part's heading."""
    part_subtitle: list[str] = field(default_factory=list)
    paragraphs: list[list[str]] = field(default_factory=list)
    """Each paragraph as its lines (one line unless it keeps its line breaks)."""


def read_text(path: Path) -> str:
    """The file's text, decompressed by its suffix."""
    data = path.read_bytes()
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    elif path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8-sig").replace("\r\n", "\n")


def parse_novel(text: str) -> tuple[str, list[Chapter]]:
    """(title, chapters): parts and chapters from their heading lines, paragraphs unwrapped."""
    title: list[str] = []
    chapters: list[Chapter] = []
    part: Chapter | None = None
    # a part heading waiting for its first chapter, which it opens, with the paragraphs between them
    for lines in _paragraphs(text):
        first = _inline(lines[0].strip())
        part_heading = _PART.fullmatch(first)
        if part_heading:
            subtitle = part_heading.group(2)
            part = Chapter("", f"PART {part_heading.group(1)}.", [subtitle] if subtitle else [])
        elif _CHAPTER.fullmatch(first) and len(lines) == 1:
            chapters.append(Chapter(first, part.part, part.part_subtitle) if part else Chapter(first))
            part = None
        elif part is not None:
            part.part_subtitle.extend(_unwrap(lines))
        elif chapters:
            chapters[-1].paragraphs.append(_unwrap(lines))
        else:
            title.extend(_unwrap(lines))
    if not chapters:
        raise ValueError("no CHAPTER heading lines found")
    return " ".join(title).rstrip(".") or "Untitled", chapters


def _paragraphs(text: str) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for line in text.split("\n"):
        if line.strip():
            out[-1].append(line.rstrip())
        elif out[-1]:
            out.append([])
    return [p for p in out if p]


def _unwrap(lines: list[str]) -> list[str]:
    """A paragraph's lines as the EPUB shows them: one line, or (indented paragraphs) its own lines."""
    indent = len(lines[0]) - len(lines[0].lstrip())
    if not indent:
        return [_inline(" ".join(line.strip() for line in lines))]
    out: list[str] = []
    for line in lines:
        if out and len(line) - len(line.lstrip()) >= indent + JOIN_INDENT:
            out[-1] += " " + line.strip()
        else:
            out.append(line.strip())
    return [_inline(line) for line in out]


def _inline(text: str) -> str:
    """Plain-text conventions to what an EPUB shows: no footnote markers, em dashes, single spaces."""
    return " ".join(_FOOTNOTE.sub("", text).replace("--", "\u2014").split())


def join_chapter(chapter: Chapter) -> None:
    """All the chapter's paragraphs, kept lines included, as one paragraph of one line."""
    chapter.paragraphs = [[" ".join(line for p in chapter.paragraphs for line in p)]]


# ---- EPUB -------------------------------------------------------------------------------------------------

def xhtml_text(text: str) -> str:
    """Escaped for XHTML, _italics_ as <em>."""
    return _ITALIC.sub(r"<em>\1</em>", escape(text, quote=False))


def chapter_xhtml(chapter: Chapter) -> str:
    body = []
    if chapter.part:
        body.append(f"<h1>{xhtml_text(chapter.part)}</h1>")
        body += [f'<p class="subtitle">{xhtml_text(line)}</p>' for line in chapter.part_subtitle]
    body.append(f"<h2>{xhtml_text(chapter.heading)}</h2>")
    body += ["<p>" + "<br/>".join(xhtml_text(line) for line in lines) + "</p>" for lines in chapter.paragraphs]
    return _XHTML_HEAD.format(title=xhtml_text(plain(chapter.heading))) + "\n".join(body) + "\n</body>\n</html>\n"


def plain(text: str) -> str:
    """Text without the italics marks (titles, labels)."""
    return _ITALIC.sub(r"\1", text)


def nav_xhtml(title: str, chapters: list[Chapter], names: list[str]) -> str:
    """The table of contents: chapters linked, nested under their part's (unlinked) heading."""
    items: list[str] = []
    for chapter, name in zip(chapters, names):
        if chapter.part:
            items.append(("</ol></li>\n" if items else "") + f"<li><span>{escape(plain(chapter.part))}</span><ol>")
        items.append(f'<li><a href="{name}">{escape(plain(chapter.heading))}</a></li>')
    if chapters[0].part:
        items.append("</ol></li>")
    return (_XHTML_HEAD.format(title=escape(title)) + f'<nav epub:type="toc" id="toc"><h1>{escape(title)}</h1>'
            "<ol>\n" + "\n".join(items) + "\n</ol></nav>\n</body>\n</html>\n")


def opf(title: str, author: str | None, identifier: str, names: list[str]) -> str:
    creator = f"<dc:creator>{escape(author)}</dc:creator>" if author else ""
    manifest = ['<item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>']
    manifest += [f'<item id="c{i}" href="{n}" media-type="application/xhtml+xml"/>' for i, n in enumerate(names, 1)]
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(1, len(names) + 1))
    return ('<?xml version="1.0" encoding="utf-8"?>\n<package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
            'unique-identifier="id" xml:lang="en">\n<metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
            f'<dc:identifier id="id">{identifier}</dc:identifier><dc:title>{escape(title)}</dc:title>{creator}'
            f'<dc:language>en</dc:language><meta property="dcterms:modified">{MODIFIED}</meta></metadata>\n'
            f'<manifest>\n' + "\n".join(manifest) + f'\n</manifest>\n<spine>{spine}</spine>\n</package>\n')


def zip_epub(members: list[tuple[str, str]]) -> bytes:
    """The EPUB container: `mimetype` first and stored (readers sniff it at offset 38), the rest deflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in [("mimetype", "application/epub+zip"), ("META-INF/container.xml", CONTAINER), *members]:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, text.encode(), compresslevel=9)
    return buf.getvalue()


def make_epub(text: str, *, title: str | None = None, author: str | None = None,
              long_chapter: int = LONG_CHAPTER) -> bytes:
    """The EPUB's bytes for a novel's plain text; `long_chapter` (1-based; 0: none) is joined into one paragraph."""
    found_title, chapters = parse_novel(text)
    if long_chapter:
        if not 1 <= long_chapter <= len(chapters):
            raise ValueError(f"--join-chapter {long_chapter}: the text has {len(chapters)} chapters")
        join_chapter(chapters[long_chapter - 1])
    title = title or found_title
    names = [f"chapter-{i:02d}.xhtml" for i in range(1, len(chapters) + 1)]
    digest = hashlib.sha256(text.encode()).hexdigest()
    identifier = f"urn:uuid:{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    members = [("OEBPS/content.opf", opf(title, author, identifier, names)),
               ("OEBPS/nav.xhtml", nav_xhtml(title, chapters, names))]
    members += [(f"OEBPS/{n}", chapter_xhtml(c)) for n, c in zip(names, chapters)]
    return zip_epub(members)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input", type=Path, help="the novel's text: .txt, .txt.xz or .txt.gz")
    p.add_argument("out", type=Path, help="the .epub to write")
    p.add_argument("--title", help="book title (default: the text before the first heading)")
    p.add_argument("--author")
    p.add_argument("--join-chapter", type=int, default=LONG_CHAPTER, metavar="N",
                   help=f"join chapter N's paragraphs into one very long paragraph (default {LONG_CHAPTER}; 0: none)")
    args = p.parse_args()
    try:
        text = read_text(args.input)
    except (OSError, UnicodeDecodeError, lzma.LZMAError, gzip.BadGzipFile) as err:
        raise SystemExit(f"make_epub: cannot read {args.input}: {err}") from None
    try:
        data = make_epub(text, title=args.title, author=args.author, long_chapter=args.join_chapter)
    except ValueError as err:
        raise SystemExit(f"make_epub: {args.input}: {err}") from None
    args.out.write_bytes(data)
    print(f"{args.out}: {len(data)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
