"""A novel through `voicectl export` (issue 23): A Study in Scarlet, made into an EPUB by scripts/make_epub.py and
exported with the fake engine. Every sentence of the book is in the WAV, whole and in order; the CUE marks each
chapter where its first sentence starts; --normalize-loudness puts every chapter within 1 dB of the target.

The expected audio comes from rendering each sentence on its own, in this process, as the export's request for
that index (the fake engine's audio is a function of the sentence's text and seed); its length is checked against
what the fake makes of a sentence: `tokens_per_sentence` codes (fewer when the text's token cap is lower) of
`samples_per_code` samples each, so a sentence the pipeline re-split or cut would show.
"""
import asyncio
import inspect
import lzma
import re
import subprocess
import sys
import wave
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest

from engine.book import book_sentences, read_book
from engine.config import SamplingOptions, SynthesisRequest
from engine.export_plan import pause_samples, to_pcm16
from engine.factory import EngineConfig, build_synthesizer
from engine.fakes import ScriptedGenerator, ToneDecoder
from engine.pipeline import JoinConfig, sentence_seed
from engine.text import normalize, sentence_token_cap
from engine.voices import VoiceBank
from voiceapp.cli.export import export_config
from tests.cli_helpers import voicectl

ROOT = Path(__file__).resolve().parents[2]
NOVEL = ROOT / "tests" / "data" / "a-study-in-scarlet.txt.xz"
MAKE_EPUB = ROOT / "scripts" / "make_epub.py"
JOIN = JoinConfig()
RATE = ToneDecoder.sample_rate
PAUSE = pause_samples(JOIN.pause_s, RATE)
CD_FRAME = RATE / 75
JOBS = "64"
"""The fake engine sleeps per token like a model; --jobs does not change the bytes, only how long the test takes."""
TITLE_LAST = re.compile(r"\b(?:Mr|Mrs|Dr|St|Messrs)\.$")
"""A sentence never ends with a title: that would cut "Mr. Holmes" or "Messrs. Lestrade and Gregson" in two."""
WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
AUTHOR = "Arthur Conan Doyle"


def words(text: str) -> list[str]:
    return WORD.findall(text)


@pytest.fixture(scope="module")
def source() -> str:
    """The novel's text as the book speaks it: from the first part heading on, footnote markers out (make_epub)."""
    text = lzma.decompress(NOVEL.read_bytes()).decode()
    return re.sub(r"\[\d+\]", " ", text[text.index("PART I."):])


@pytest.fixture(scope="module")
def epub(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("novel") / "scarlet.epub"
    subprocess.run([sys.executable, str(MAKE_EPUB), str(NOVEL), str(out), "--author", AUTHOR], check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def book(epub):
    return read_book(epub.name, epub.read_bytes())


@pytest.fixture(scope="module")
def sentences(book):
    return book_sentences(book, JOIN.max_sentence_chars)


# ---- the book ---------------------------------------------------------------------------------------------

def test_make_epub_writes_the_same_valid_epub3_every_time(epub, tmp_path):
    again = tmp_path / "again.epub"
    subprocess.run([sys.executable, str(MAKE_EPUB), str(NOVEL), str(again), "--author", AUTHOR], check=True,
                   capture_output=True)
    assert again.read_bytes() == epub.read_bytes()
    data = epub.read_bytes()
    assert data[30:58] == b"mimetypeapplication/epub+zip"  # first, stored, no extra field: what readers sniff
    with zipfile.ZipFile(epub) as z:
        assert z.infolist()[0].compress_type == zipfile.ZIP_STORED
        ns = {"c": "urn:oasis:names:tc:opendocument:xmlns:container", "opf": "http://www.idpf.org/2007/opf",
              "dc": "http://purl.org/dc/elements/1.1/"}
        opf_path = ElementTree.fromstring(z.read("META-INF/container.xml")).find(".//c:rootfile", ns).get("full-path")
        opf = ElementTree.fromstring(z.read(opf_path))
        assert opf.get("version") == "3.0"
        assert [opf.findtext(f"opf:metadata/dc:{k}", None, ns) for k in ("title", "language")] == [
            "A STUDY IN SCARLET", "en"]
        assert opf.find("opf:metadata/dc:identifier", ns).get("id") == opf.get("unique-identifier")
        assert opf.find("opf:metadata/opf:meta[@property='dcterms:modified']", ns) is not None
        items = {i.get("id"): i for i in opf.iterfind("opf:manifest/opf:item", ns)}
        assert [i.get("id") for i in items.values() if i.get("properties") == "nav"] == ["nav"]
        for item in items.values():  # every document is there and is well-formed XML
            ElementTree.fromstring(z.read(f"OEBPS/{item.get('href')}"))
        assert len(opf.findall("opf:spine/opf:itemref", ns)) == 14


def test_the_book_has_every_word_of_the_novel_in_order(book, sentences, source):
    assert [c.title for c in book.chapters][:2] == ["PART I, CHAPTER I. MR. SHERLOCK HOLMES.",
                                                     "PART I, CHAPTER II. THE SCIENCE OF DEDUCTION."]
    # the nav nests chapters under their part: two "CHAPTER I." titles are told apart, and Part II is named
    assert len(book.chapters) == 14 and book.chapters[7].title == "PART II, CHAPTER I. ON THE GREAT ALKALI PLAIN."
    assert len({c.title for c in book.chapters}) == 14 and book.notices == ()
    assert words(" ".join(s.text for s in sentences)) == words(source)
    assert all(len(s.text) <= JOIN.max_sentence_chars for s in sentences)
    assert not [s.text for s in sentences if TITLE_LAST.search(s.text)]


def test_a_very_long_paragraph_is_split_without_losing_a_word(book, sentences):
    """make_epub joins Part II chapter I into one paragraph; its sentences hold exactly its words."""
    long = [(i, len(p)) for i, c in enumerate(book.chapters) for p in c.paragraphs if len(p) > 10 * 1024]
    assert len(long) == 1 and long[0][0] == 7 and long[0][1] > 20_000
    mine = [s.text for s in sentences if s.chapter == 7]
    assert words(" ".join(mine)) == words(" ".join(book.chapters[7].paragraphs))
    assert len(mine) > 150 and max(len(s) for s in mine) <= JOIN.max_sentence_chars


def test_normalizing_the_book_keeps_every_word(sentences):
    """A word missing from a sentence's spoken form must be an abbreviation it expanded ("Mr." -> "Mister") or
    the suffix of a number it read ("4th" -> "fourth")."""
    lost = []
    for s in sentences:
        spoken = [w.lower() for w in words(normalize(s.text))]
        for m in WORD.finditer(s.text):
            if m.group().lower() in spoken:
                spoken.remove(m.group().lower())
            elif not (s.text[m.end():m.end() + 1] == "." or m.group()[:1].isdigit()):
                lost.append((m.group(), s.text))
    assert lost == []


# ---- the export -------------------------------------------------------------------------------------------

def fake_sentence_samples(text: str) -> int:
    """What the fake engine makes of one sentence: its scripted token count, or the text's cap where lower."""
    tokens = inspect.signature(ScriptedGenerator).parameters["tokens_per_sentence"].default
    return ToneDecoder.samples_per_code * min(tokens, sentence_token_cap(normalize(text)),
                                              SamplingOptions().max_tokens)


@pytest.fixture(scope="module")
def expected(sentences) -> list[np.ndarray]:
    """Each sentence rendered on its own through the library, as export's request for that index (seed 0, the
    default voice), as the 16-bit samples a WAV holds."""
    synth = build_synthesizer(export_config(EngineConfig(backend="fake")))  # as export renders
    synth.generator.delay_s = 0.0  # pacing only: the tokens do not depend on it
    voice = VoiceBank().get("default").name

    async def render_all() -> list[np.ndarray]:
        gate = asyncio.Semaphore(32)

        async def one(i: int, text: str) -> np.ndarray:
            async with gate:
                req = SynthesisRequest(text, voice=voice, options=SamplingOptions(seed=sentence_seed(0, i)),
                                       request_id=f"expected-{i}")
                return np.frombuffer(to_pcm16(await synth.render(req)), "<i2")

        try:
            return await asyncio.gather(*(one(i, s.text) for i, s in enumerate(sentences)))
        finally:
            await synth.close()

    return asyncio.run(render_all())


def sentence_starts(expected: list[np.ndarray]) -> np.ndarray:
    lengths = np.array([len(x) for x in expected])
    return np.concatenate([[0], np.cumsum(lengths + PAUSE)[:-1]])


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2")


def cue_marks(cue: str) -> list[tuple[str, float]]:
    """(title, start in samples) of each track."""
    titles = re.findall(r'^ {4}TITLE "(.*)"$', cue, re.M)
    indexes = re.findall(r"INDEX 01 (\d+):(\d+):(\d+)$", cue, re.M)
    return [(t, ((int(m) * 60 + int(s)) * 75 + int(f)) * CD_FRAME) for t, (m, s, f) in zip(titles, indexes)]


@pytest.mark.slow
def test_the_whole_novel_exports_every_sentence_whole_in_order_with_chapter_marks(epub, book, sentences, expected,
                                                                                  tmp_path):
    out = tmp_path / "scarlet.wav"
    proc = voicectl("export", str(epub), "-o", str(out), "--backend", "fake", "--jobs", JOBS, "--no-progress")
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"{len(sentences)} sentences in 14 chapters" in proc.stderr.decode()
    assert [len(x) for x in expected] == [fake_sentence_samples(s.text) for s in sentences]  # none cut or re-split
    wav = read_wav(out)
    starts = sentence_starts(expected)
    assert len(wav) == starts[-1] + len(expected[-1])
    for i, (start, want) in enumerate(zip(starts, expected)):  # each sentence where it belongs, pauses between
        assert np.array_equal(wav[start:start + len(want)], want), f"sentence {i}: {sentences[i].text!r}"
        assert not wav[start + len(want):start + len(want) + PAUSE].any()
    firsts = [next(i for i, s in enumerate(sentences) if s.chapter == c) for c in range(len(book.chapters))]
    marks = cue_marks((tmp_path / "scarlet.cue").read_text())
    assert [t for t, _ in marks] == [c.title for c in book.chapters]
    for (title, at), first in zip(marks, firsts):
        assert abs(at - starts[first]) < CD_FRAME, title


@pytest.mark.slow
def test_normalize_loudness_puts_every_chapter_of_the_novel_within_1_db_of_the_target(epub, book, sentences,
                                                                                      expected, tmp_path):
    out = tmp_path / "loud.wav"
    proc = voicectl("export", str(epub), "-o", str(out), "--backend", "fake", "--jobs", JOBS, "--no-progress",
                    "--normalize-loudness", "-23")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "peak ceiling" not in proc.stderr.decode()
    wav = read_wav(out)
    starts = sentence_starts(expected)
    assert len(wav) == starts[-1] + len(expected[-1])
    for c, chapter in enumerate(book.chapters):
        mine = [i for i, s in enumerate(sentences) if s.chapter == c]
        speech = np.concatenate([wav[starts[i]:starts[i] + len(expected[i])] for i in mine]).astype(np.float64)
        want = np.concatenate([expected[i] for i in mine]).astype(np.float64)
        rms_db = 20 * np.log10(np.sqrt(np.mean((speech / 32767) ** 2)))
        assert abs(rms_db - -23.0) <= 1.0, (chapter.title, rms_db)
        assert 20 * np.log10(np.max(np.abs(speech)) / 32767) <= -3.0 + 1e-3
        gain = np.dot(speech, want) / np.dot(want, want)  # one gain for the whole chapter, same audio otherwise
        assert np.max(np.abs(speech - want * gain)) <= 1.0, chapter.title


@pytest.mark.slow
def test_the_novel_as_m4b_has_its_chapters_tags_cover_and_the_wavs_duration(epub, book, tmp_path):
    """The EPUB's title, author and language, a --cover, a chapter mark where the WAV's CUE puts each chapter,
    and the WAV's duration to within one AAC frame (1024 samples), read back with PyAV."""
    import av

    from tests.export.test_containers import png

    (tmp_path / "cover.png").write_bytes(png(60, 90))
    for suffix, extra in ((".wav", []), (".m4b", ["--cover", str(tmp_path / "cover.png")])):
        proc = voicectl("export", str(epub), "-o", str(tmp_path / f"scarlet{suffix}"), "--backend", "fake", "--jobs",
                        JOBS, "--no-progress", *extra)
        assert proc.returncode == 0, proc.stderr.decode()
    seconds = len(read_wav(tmp_path / "scarlet.wav")) / RATE
    marks = cue_marks((tmp_path / "scarlet.cue").read_text())
    with av.open(str(tmp_path / "scarlet.m4b")) as m4b:
        audio = m4b.streams.audio[0]
        assert abs(float(audio.duration * audio.time_base) - seconds) <= 1024 / RATE
        assert (audio.codec_context.name, audio.sample_rate, audio.metadata["language"]) == ("aac", RATE, "eng")
        tags = m4b.metadata
        assert (tags["major_brand"], tags["title"], tags["artist"], tags["genre"]) == (
            "M4B ", "A STUDY IN SCARLET", AUTHOR, "Audiobook")
        chapters = m4b.chapters()
        assert [c["metadata"]["title"] for c in chapters] == [c.title for c in book.chapters]
        for c, (title, at) in zip(chapters, marks):
            assert abs(float(c["start"] * c["time_base"]) - at / RATE) <= 1 / 75, title
        assert float(chapters[-1]["end"] * chapters[-1]["time_base"]) == pytest.approx(seconds, abs=0.001)
        cover = next(s for s in m4b.streams.video if s.disposition & av.stream.Disposition.attached_pic)
        assert bytes(next(m4b.demux(cover))) == (tmp_path / "cover.png").read_bytes()
