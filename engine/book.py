"""Provides book reading for export: .txt / .md / .epub -> chapters of paragraphs -> sentences. Pure (the standard
library, and markdown-it-py for Markdown).

Rules (each has a test):
- Paragraphs are separated by blank lines. Hard-wrapped prose (lines near the paragraph's longest line, itself at
  least WRAP_MIN_WIDTH characters) is joined with spaces; other line breaks end a sentence, as in `say -`.
- .txt chapters start at a paragraph whose first line is a heading: "Chapter 12", "CHAPTER XII.", "Chapter Twelve:
  The Storm", "Book 2", "Part One", "Prologue", "Epilogue", ... (a short second line is taken as its title), or a
  markdown "# Heading".
- .md (CommonMark and tables, parsed by markdown-it-py): YAML front matter, code blocks, images, HTML tags and
  blocks, footnote markers and link targets are dropped; link texts, emphasis and inline code keep their words;
  list items, table rows and quotes are read as lines. A code fence never closed would hide the rest of the book:
  its opening line is dropped and what follows is read, with a notice.
  Chapters start at the most important heading level used more than once (so a lone "# Book Title" above
  "## Chapter" headings is not a chapter); other headings are read as lines.
- .epub: META-INF/container.xml -> the OPF -> spine order (navigation documents and linear="no" items skipped).
  Chapters start where the table of contents points (the EPUB 3 nav of epub:type toc, else the EPUB 2 NCX; a
  link's #fragment cuts a document at that element), titled by the entry and the entries it is nested in ("PART
  II, CHAPTER I."); a spine document the table does not point into continues the chapter before it, unless it
  opens with a heading. Without a table of contents, or with one that points at no document of the book, each
  spine document is a chapter titled by its first heading (split at its top headings where it holds several),
  with a notice. Scripts, styles, <pre> blocks and ruby annotations are not read. Title, author, language and
  cover image come from the OPF.
- Chapter titles are spoken (they are the chapter's first lines). Text before the first chapter heading is a
  chapter of its own ("Front matter") unless it is only headings (a book title), which then opens the first
  chapter. Chapters without speakable text are dropped.
"""
from __future__ import annotations

import dataclasses
import io
import posixpath
import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import unquote
from xml.etree import ElementTree

from engine.errors import InputError
from engine.text import is_speakable, normalize, split_sentences

WRAP_MIN_WIDTH = 50
"""A paragraph whose longest line is shorter than this is not hard-wrapped prose (a list, a poem, an address)."""
WRAP_SLACK = 20
"""A line this close to the paragraph's longest line was wrapped there: it continues on the next line."""
MAX_HEADING_CHARS = 80
MAX_TEXT_BYTES = 4 * 1024 * 1024
"""Default cap on a book's text (UTF-8 bytes); the front end passes its --max-mb instead."""
MARKUP_FACTOR = 4
"""An EPUB member may be this many times the text cap uncompressed: its markup is not text."""
FRONT_MATTER = "Front matter"


@dataclass(frozen=True, slots=True)
class Chapter:
    title: str
    paragraphs: tuple[str, ...]
    """Text to speak, in order; each item is one paragraph or line (no newlines)."""


@dataclass(frozen=True, slots=True)
class Book:
    title: str
    chapters: tuple[Chapter, ...]
    author: str = ""
    """The EPUB's first dc:creator ("" when unknown or not an EPUB)."""
    language: str = ""
    """The EPUB's dc:language as written there, a BCP 47 tag such as "en" or "en-GB" ("" when unknown)."""
    cover: bytes | None = None
    """The EPUB's cover image as stored (not checked to be an image: the front end does that), or None."""
    notices: tuple[str, ...] = ()
    """What the reader had to work around (a code fence never closed, a table of contents it could not use), one
    line each, for the front end to show."""


@dataclass(frozen=True, slots=True)
class Sentence:
    chapter: int
    """Index into Book.chapters."""
    text: str
    """Raw sentence text (the synthesizer normalizes it)."""


@dataclass(frozen=True, slots=True)
class _Block:
    """One paragraph or line of a parsed document; `level` 1-6 for a heading, 0 for body text."""

    text: str
    level: int = 0


def read_book(name: str, data: bytes | str, title: str | None = None, max_bytes: int = MAX_TEXT_BYTES) -> Book:
    """Parse a .txt, .md/.markdown or .epub file's contents (by `name`'s suffix; anything else is plain text).
    An EPUB's text may hold at most `max_bytes` (UTF-8), and each of its members at most MARKUP_FACTOR times
    that uncompressed: a small zip can expand to gigabytes."""
    title = title or posixpath.splitext(posixpath.basename(name))[0] or "Untitled"
    suffix = posixpath.splitext(name.lower())[1]
    if suffix == ".epub":
        return parse_epub(data if isinstance(data, bytes) else data.encode(), title, name, max_bytes)
    text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
    if suffix in (".md", ".markdown"):
        return parse_markdown(text, title, name)
    return parse_text(text, title)


def book_sentences(book: Book, max_chars: int) -> list[Sentence]:
    """Every speakable sentence, in reading order, split exactly as the streaming path splits text."""
    return [Sentence(i, s) for i, chapter in enumerate(book.chapters) for para in chapter.paragraphs
            for s in split_sentences(para, max_chars) if is_speakable(normalize(s))]


# ---- plain text -------------------------------------------------------------------------------------------

_NUMBER = (r"(?:\d+|[ivxlcdm]+|(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
           r"fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
           r"eighty|ninety|hundred|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last)"
           r"(?:[- ](?:one|two|three|four|five|six|seven|eight|nine|first|second|third|fourth|fifth|sixth|"
           r"seventh|eighth|ninth))?)")
_TXT_HEADING = re.compile(rf"(?:chapter|book|part|volume)\s+{_NUMBER}(?:[.:]|\s*[-\u2013\u2014:.]\s+\S.*|\s*$)"
                          rf"|(?:prologue|epilogue|preface|foreword|afterword|introduction|interlude)"
                          rf"(?:[.:]?\s*$|\s*[-\u2013\u2014:]\s*\S.*)", re.IGNORECASE)
_ATX = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def parse_text(text: str, title: str) -> Book:
    blocks: list[_Block] = []
    for lines in _paragraphs(text.splitlines()):
        heading = _txt_heading(lines)
        if heading is not None:
            blocks.append(_Block(heading, 1))
        else:
            blocks += [_Block(line) for line in _unwrap(lines)]
    return _book(title, [_Section(blocks, split_level=1)])


def _paragraphs(lines: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            out[-1].append(line.strip())
        elif out[-1]:
            out.append([])
    return [p for p in out if p]


def _txt_heading(lines: list[str]) -> str | None:
    """The chapter title if this paragraph is a chapter heading (one line, or a heading line and a title line)."""
    m = _ATX.match(lines[0])
    if m and len(lines) == 1:
        return m.group(2)
    if len(lines) > 2 or any(len(line) > MAX_HEADING_CHARS for line in lines):
        return None
    if not _TXT_HEADING.fullmatch(lines[0]):
        return None
    return ": ".join([lines[0].rstrip(".:"), *lines[1:]])


def _unwrap(lines: list[str]) -> list[str]:
    """Join hard-wrapped lines of one paragraph; keep the other line breaks."""
    width = max(len(line) for line in lines)
    out = [lines[0]]
    for prev, line in zip(lines, lines[1:]):
        if width >= WRAP_MIN_WIDTH and len(prev) >= width - WRAP_SLACK:
            out[-1] = f"{out[-1]} {line}"
        else:
            out.append(line)
    return out


# ---- markdown ---------------------------------------------------------------------------------------------

_FOOTNOTE_REF = re.compile(r"\[\^[^\]\s]+\]")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")
_SKIPPED_MD = frozenset({"fence", "code_block", "html_block"})
"""Markdown blocks that are not read: code and raw HTML."""


def parse_markdown(text: str, title: str, name: str = "the Markdown file") -> Book:
    """Markdown through markdown-it-py (CommonMark and tables): headings, paragraphs, list items, quotes and table
    rows become blocks; code, HTML blocks and images are not read."""
    blocks, notices = _markdown_blocks(_drop_front_matter(text.splitlines()), name)
    levels = [b.level for b in blocks if b.level]
    repeated = sorted(level for level in set(levels) if levels.count(level) > 1)
    chapter_level = repeated[0] if repeated else min(levels, default=1)
    book_title = next((b.text for b in blocks if 0 < b.level < chapter_level), title)
    return dataclasses.replace(_book(book_title, [_Section(blocks, chapter_level)]), notices=tuple(notices))


def _drop_front_matter(lines: list[str]) -> list[str]:
    if lines and lines[0].strip() == "---":
        for i, line in enumerate(lines[1:], 1):
            if line.strip() in ("---", "..."):
                return lines[i + 1:]
    return lines


def _markdown_blocks(lines: list[str], name: str) -> tuple[list[_Block], list[str]]:
    """The document's blocks, and a notice for each code fence never closed: CommonMark runs such a fence to the
    end of the document, which would silently drop the rest of a book, so its opening line is dropped instead and
    what follows is read as text."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark").enable("table")
    notices: list[str] = []
    while True:
        tokens = parser.parse("\n".join(lines))
        start = next((t.map[0] for t in tokens if t.type == "fence" and t.map and not _closed(t, lines)), None)
        if start is None:
            break
        notices.append(f"{name}: the code block opened at line {start + 1} is never closed; the "
                       f"{len(lines) - start - 1} lines after it are read as text")
        lines = lines[:start] + [""] + lines[start + 1:]
    blocks: list[_Block] = []
    level = 0
    row: list[str] | None = None  # the cells of the table row being read
    for token in tokens:
        if token.type == "heading_open":
            level = int(token.tag[1])
        elif token.type == "heading_close":
            level = 0
        elif token.type == "tr_open":
            row = []
        elif token.type == "tr_close" and row is not None:
            blocks.append(_Block(", ".join(cell for cell in row if cell)))
            row = None
        elif token.type == "inline":
            pieces = _inline_lines(token)
            if row is not None:
                row.append(" ".join(pieces))
            elif level:
                blocks.append(_Block(" ".join(pieces), level))
            else:
                blocks.extend(_Block(piece) for piece in pieces if piece)
    return [b for b in blocks if b.text], notices


def _closed(fence, lines: list[str]) -> bool:
    """Whether a fence token ends at a closing fence line (else it ran to the end of the document)."""
    last = fence.map[1] - 1
    if last <= fence.map[0] or last >= len(lines):
        return False
    close = lines[last].strip().lstrip("> ")  # a fence may sit in a quote or a list item
    return close.startswith(fence.markup[0] * len(fence.markup)) and not close.strip(fence.markup[0])


def _inline_lines(token) -> list[str]:
    """An inline token's words as lines (a hard break starts a new one): text and inline code kept, images, raw
    HTML tags, autolinks and footnote markers dropped, soft breaks read as spaces."""
    lines, text, autolink = [], [], False
    for child in token.children or ():
        if child.type == "link_open" and child.markup == "autolink":
            autolink = True
        elif child.type == "link_close" and autolink:
            autolink = False
        elif autolink or child.type in ("image", "html_inline"):
            continue
        elif child.type in ("text", "code_inline"):
            text.append(child.content)
        elif child.type == "softbreak":
            text.append(" ")
        elif child.type == "hardbreak":
            lines.append("".join(text))
            text = []
    lines.append("".join(text))
    return [_SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(_FOOTNOTE_REF.sub("", line).split())) for line in lines]


# ---- assembling chapters ----------------------------------------------------------------------------------

@dataclass
class _Section:
    """A run of blocks that starts a chapter (a whole text file, or one EPUB spine document)."""

    blocks: list[_Block]
    split_level: int
    """Headings of this level start a new chapter (0: none)."""
    title: str | None = None
    """From a table of contents."""


def _book(title: str, sections: list[_Section]) -> Book:
    drafts: list[_Section] = []
    for section in sections:
        drafts.append(_Section([], section.split_level, section.title))
        for block in section.blocks:
            if block.level and block.level == section.split_level and drafts[-1].blocks:
                drafts.append(_Section([], section.split_level))
            drafts[-1].blocks.append(block)
    drafts = [d for d in drafts if any(is_speakable(normalize(b.text)) for b in d.blocks)]
    if len(drafts) > 1 and _title_only(drafts[0]):
        front = drafts.pop(0)
        drafts[0].blocks[:0] = front.blocks
    return Book(title, tuple(Chapter(_title(d, i, len(drafts), title), tuple(b.text for b in d.blocks))
                             for i, d in enumerate(drafts)))


def _title_only(front: _Section) -> bool:
    """Front matter that is only headings above the chapter level (a book title): it opens the first chapter."""
    return front.title is None and all(0 < b.level < front.split_level for b in front.blocks)


def _title(draft: _Section, index: int, count: int, book_title: str) -> str:
    heading = next((b.text for b in draft.blocks if b.level and draft.split_level in (0, b.level)), None)
    if title := draft.title or heading:
        return title
    if count == 1:
        return book_title
    return FRONT_MATTER if index == 0 else f"Section {index + 1}"


# ---- epub -------------------------------------------------------------------------------------------------

_NS = {"c": "urn:oasis:names:tc:opendocument:xmlns:container", "opf": "http://www.idpf.org/2007/opf",
       "dc": "http://purl.org/dc/elements/1.1/", "ncx": "http://www.daisy.org/z3986/2005/ncx/"}
_XHTML_TYPES = ("application/xhtml+xml", "text/html", "application/xml")


def parse_epub(data: bytes, title: str, name: str = "the EPUB", max_bytes: int = MAX_TEXT_BYTES) -> Book:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise InputError(f"{name} is not an EPUB (not a zip archive)") from None
    with archive:
        opf_path = _rootfile(archive, name)
        opf = _xml(archive, opf_path, name)
        base = posixpath.dirname(opf_path)
        items = {i.get("id"): i for i in opf.iterfind("opf:manifest/opf:item", _NS)}
        spine = [items[r.get("idref")] for r in opf.iterfind("opf:spine/opf:itemref", _NS)
                 if r.get("idref") in items and r.get("linear", "yes") != "no"]
        docs = [_href(base, i.get("href", "")) for i in spine
                if i.get("media-type") in _XHTML_TYPES and "nav" not in (i.get("properties") or "").split()]
        _refuse_encrypted(archive, docs, name)
        toc, found = _toc(archive, items, base)
        docs = list(dict.fromkeys(docs))  # a document the spine lists again is read once
        parsed, text_bytes = [], 0
        for doc in docs:
            parsed.append(_html_blocks(_read_member(archive, doc, name, max_bytes * MARKUP_FACTOR)))
            text_bytes += sum(len(b.text.encode()) + 1 for b in parsed[-1][0])
            if text_bytes > max_bytes:
                raise InputError(f"{name}: its text is larger than {max_bytes / 2**20:g} MB; pass --max-mb N to "
                                 f"allow more, or split it")
        book_title = _meta(opf, "title") or title
        cover = _cover(archive, opf, items, base)
    usable = [entry for entry in toc if entry.doc in docs]
    notices = []
    if usable:
        sections = _nav_sections(docs, parsed, usable)
        if len(usable) < len(toc):
            notices.append(f"{name}: {len(toc) - len(usable)} entries of its table of contents point at documents "
                           f"that are not in the book; they are left out")
    else:
        notices.append(f"{name}: " + ("its table of contents points at no document of the book" if found else
                                      "it has no table of contents") + "; its chapters follow the spine")
        sections = [_Section(blocks, _split_level(blocks)) for blocks, _ in parsed]
    book = _book(book_title, sections)
    if not book.chapters:
        raise InputError(f"{name} has no readable text (only images, or an empty or unsupported EPUB)")
    return dataclasses.replace(book, author=_meta(opf, "creator"), language=_meta(opf, "language"), cover=cover,
                               notices=tuple(notices))


@dataclass(frozen=True, slots=True)
class _TocEntry:
    """One linked entry of a table of contents."""

    labels: tuple[str, ...]
    """Its label after those of the entries it is nested in, outermost first ("PART II.", "CHAPTER I. ...")."""
    doc: str
    """The document it points at, as a path in the archive."""
    fragment: str
    """The element id it points at in that document ("": the document's start)."""

    @property
    def title(self) -> str:
        """"Part II, Chapter I": the outer labels without their closing punctuation, then its own."""
        return ", ".join([*(label.rstrip(" .:;,") for label in self.labels[:-1]), self.labels[-1]])


def _nav_sections(docs: list[str], parsed: list[tuple[list[_Block], dict[str, int]]],
                  toc: list[_TocEntry]) -> list[_Section]:
    """The spine's blocks cut where the table of contents points, each piece titled by its entry (a deeper entry
    at the same place wins: it names its parents too). A document the table does not point into continues the
    chapter before it, unless it opens with a heading; text before the first entry is a section of its own."""
    starts: dict[tuple[str, int], str] = {}
    for entry in toc:
        blocks, anchors = parsed[docs.index(entry.doc)]
        starts[entry.doc, anchors.get(entry.fragment, 0) if entry.fragment else 0] = entry.title
    pointed = {entry.doc for entry in toc}
    sections: list[_Section] = []
    for doc, (blocks, _) in zip(docs, parsed):
        for i, block in enumerate(blocks):
            title = starts.get((doc, i))
            opens = i == 0 and doc not in pointed and block.level > 0
            if title is not None or opens or not sections:
                sections.append(_Section([], 0, title))
            sections[-1].blocks.append(block)
    return sections


def _meta(opf: ElementTree.Element, key: str) -> str:
    """The OPF's first dc:`key`, whitespace collapsed ("" when there is none)."""
    return " ".join((opf.findtext(f"opf:metadata/dc:{key}", None, _NS) or "").split())


MAX_COVER_BYTES = 16 * 1024 * 1024
"""Largest cover image read from an EPUB; a larger one is left out (the front end has its own, lower, limit)."""


def _cover(archive: zipfile.ZipFile, opf: ElementTree.Element, items: dict, base: str) -> bytes | None:
    """The cover image's bytes: the manifest item marked cover-image (EPUB 3), else the one a <meta name="cover">
    names (EPUB 2); None when there is none, or it is missing or too large."""
    item = next((i for i in items.values() if "cover-image" in (i.get("properties") or "").split()), None)
    if item is None:
        meta = next((m for m in opf.iterfind("opf:metadata/opf:meta", _NS) if m.get("name") == "cover"), None)
        item = items.get(meta.get("content")) if meta is not None else None
    if item is None:
        return None
    try:
        return _read_member(archive, _href(base, item.get("href", "")), "", MAX_COVER_BYTES)
    except InputError:
        return None


def _rootfile(archive: zipfile.ZipFile, name: str) -> str:
    container = _xml(archive, "META-INF/container.xml", name)
    rootfile = container.find("c:rootfiles/c:rootfile", _NS)
    if rootfile is None or not rootfile.get("full-path"):
        raise InputError(f"{name}: META-INF/container.xml names no package document; is it a valid EPUB?")
    return rootfile.get("full-path", "")


def _read_member(archive: zipfile.ZipFile, path: str, name: str,
                 limit: int = MAX_TEXT_BYTES * MARKUP_FACTOR) -> bytes:
    """A member's bytes, at most `limit` of them uncompressed (read no further than that, whatever its header
    says)."""
    try:
        info = archive.getinfo(path)
    except KeyError:
        raise InputError(f"{name}: {path} is listed in the EPUB but missing from it") from None
    too_large = InputError(f"{name}: {path} is larger than {limit / 2**20:g} MB uncompressed; pass --max-mb N to "
                           f"allow more")
    if info.file_size > limit:
        raise too_large
    try:
        with archive.open(info) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as err:
        raise InputError(f"{name}: cannot read {path} ({err})") from None
    if len(data) > limit:
        raise too_large
    return data


def _xml(archive: zipfile.ZipFile, path: str, name: str) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(_read_member(archive, path, name))
    except ElementTree.ParseError as err:
        raise InputError(f"{name}: {path} is not well-formed XML ({err})") from None


def _href(base: str, href: str) -> str:
    return posixpath.normpath(posixpath.join(base, unquote(href.split("#", 1)[0])))


def _refuse_encrypted(archive: zipfile.ZipFile, docs: list[str], name: str) -> None:
    """DRM encrypts the text documents (font obfuscation alone, also listed in encryption.xml, is fine)."""
    if "META-INF/encryption.xml" not in archive.namelist():
        return
    root = _xml(archive, "META-INF/encryption.xml", name)
    encrypted = {unquote(el.get("URI", "")) for el in root.iter() if el.tag.endswith("CipherReference")}
    if encrypted & set(docs):
        raise InputError(f"{name} is DRM-protected (its text is encrypted); export needs a DRM-free EPUB")


def _toc(archive: zipfile.ZipFile, items: dict, base: str) -> tuple[list[_TocEntry], bool]:
    """The linked entries of the table of contents in reading order (the EPUB 3 navigation document's toc nav, else
    the EPUB 2 NCX), and whether there is a table of contents at all."""
    navs = [i for i in items.values() if "nav" in (i.get("properties") or "").split()]
    ncxs = [i for i in items.values() if i.get("media-type") == "application/x-dtbncx+xml"]
    for item in navs + ncxs:
        href = _href(base, item.get("href", ""))
        try:
            data = _read_member(archive, href, "")
        except InputError:
            continue
        if item in navs:
            parser = _NavParser()
            parser.feed(data.decode("utf-8", "replace"))
            links = parser.entries()
        else:
            try:
                nav_map = ElementTree.fromstring(data).find("ncx:navMap", _NS)
                if nav_map is None:
                    continue
                links = list(_ncx_entries(nav_map, ()))
            except (ElementTree.ParseError, TypeError):
                continue
        folder = posixpath.dirname(href)
        entries = [_TocEntry(labels, _href(folder, target), unquote(target.partition("#")[2]))
                   for labels, target in links]
        if entries:
            return entries, True
    return [], False


def _ncx_entries(parent: ElementTree.Element, outer: tuple[str, ...]):
    """(labels, src) of each navPoint under `parent`, depth first, in document order."""
    for point in parent.iterfind("ncx:navPoint", _NS):
        label = " ".join((point.findtext("ncx:navLabel/ncx:text", "", _NS) or "").split())
        labels = (*outer, label) if label else outer
        content = point.find("ncx:content", _NS)
        if label and content is not None and content.get("src"):
            yield labels, content.get("src", "")
        yield from _ncx_entries(point, labels)


def _split_level(blocks: list[_Block]) -> int:
    """Split a spine document at its top heading level only when that level occurs more than once."""
    levels = [b.level for b in blocks if b.level]
    top = min(levels, default=0)
    return top if levels.count(top) > 1 else 0


_BLOCK_TAGS = frozenset("p div section article aside blockquote li dt dd tr td th h1 h2 h3 h4 h5 h6 br hr body "
                        "header footer figure figcaption ul ol dl table caption".split())
_SKIP_TAGS = frozenset("script style head pre svg math rt rp noscript template".split())
_SKIP_TYPES = frozenset({"noteref", "pagebreak"})
"""epub:type values whose text is not read (footnote markers, print page numbers)."""


class _TextParser(HTMLParser):
    """XHTML -> blocks: block-level tags end a paragraph, h1-h6 give its level, skipped elements are not read."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[_Block] = []
        self.anchors: dict[str, int] = {}
        """Element id -> the index of the block it starts (or falls in)."""
        self._text: list[str] = []
        self._level = 0
        self._skip_tag, self._skip_depth = "", 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK_TAGS and not self._skip_depth:
            self._flush()
        for key, value in attrs:
            if key == "id" and value:
                self.anchors.setdefault(value, len(self.blocks))
        if self._skip_depth:
            self._skip_depth += tag == self._skip_tag
        elif tag in _SKIP_TAGS or any(v and _SKIP_TYPES & set(v.split()) for k, v in attrs if k.endswith("type")):
            self._skip_tag, self._skip_depth = tag, 1
        elif tag in _BLOCK_TAGS:
            self._flush()
            if len(tag) == 2 and tag[0] == "h" and tag[1].isdigit():
                self._level = int(tag[1])

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK_TAGS and not self._skip_depth:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if self._skip_depth:
            self._skip_depth -= tag == self._skip_tag
        elif tag in _BLOCK_TAGS:
            self._flush()
            self._level = 0

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self._text.append(data)

    def _flush(self) -> None:
        text = " ".join("".join(self._text).split())
        self._text.clear()
        if text:
            self.blocks.append(_Block(text, self._level))

    def close(self) -> None:
        super().close()
        self._flush()


def _html_blocks(data: bytes) -> tuple[list[_Block], dict[str, int]]:
    """The document's blocks, and where its element ids fall among them."""
    parser = _TextParser()
    parser.feed(data.decode("utf-8", "replace"))
    parser.close()
    return parser.blocks, parser.anchors


class _NavParser(HTMLParser):
    """The entries of an EPUB 3 navigation document's table of contents (the nav of epub:type toc, else every nav):
    each list item's label (its link's or span's text) with the labels of the items it is nested in, and its
    link."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: dict[bool, list[tuple[tuple[str, ...], str]]] = {True: [], False: []}
        self._nav_depth, self._toc = 0, False
        self._items: list[str] = []
        """The labels of the list items we are in ("" until a label is read)."""
        self._label: list[str] | None = None
        self._href: str | None = None

    def entries(self) -> list[tuple[tuple[str, ...], str]]:
        return self.found[True] or self.found[False]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "nav":
            self._nav_depth += 1
            self._toc = self._toc or "toc" in (a.get("epub:type") or "").split()
        elif not self._nav_depth:
            return
        elif tag == "li":
            self._items.append("")
        elif tag in ("a", "span") and self._items and not self._items[-1] and self._label is None:
            self._label, self._href = [], a.get("href") if tag == "a" else None

    def handle_data(self, data: str) -> None:
        if self._label is not None:
            self._label.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav" and self._nav_depth:
            self._nav_depth -= 1
            self._toc = self._toc and bool(self._nav_depth)
        elif tag == "li" and self._items:
            self._items.pop()
        elif tag in ("a", "span") and self._label is not None:
            label = " ".join("".join(self._label).split())
            self._label = None
            if label and self._items:
                self._items[-1] = label
                if self._href:
                    labels = tuple(item for item in self._items if item)
                    self.found[self._toc].append((labels, self._href))
