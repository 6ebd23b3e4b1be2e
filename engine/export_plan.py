"""Provides resumable book export: sentences rendered concurrently into finished parts, then assembled in order.

Every sentence is its own `synthesize` request seeded with `sentence_seed(seed, index)`, so its audio depends on
nothing but the settings and its index: not on --jobs, not on which run rendered it. Each finished sentence is
written atomically as a part file (header + the 16-bit PCM samples the WAV will hold + CRC) in a `.parts`
directory, so the parts take as much disk as the finished WAV, no more; a JSON manifest beside the output records
what decides the audio (input, model, backend, voice, seed, sampling, join and window settings).
`--resume` checks the manifest, keeps every valid part and renders only the rest; assembly then writes the parts
in order with the streaming path's inter-sentence pause, so a resumed export is byte-identical to an uninterrupted
one. A WAV is assembled once rendering ends (`assemble`, a copy at disk speed); M4B, MP3 and Opus, whose encoding
costs as much as a fast render, are encoded beside the rendering, part by part in book order
(`FollowingAssembly`). The optional loudness gains are measured there, one per chapter.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import os
import shutil
import struct
import threading
import time
import wave
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Protocol, get_type_hints
from uuid import uuid4

import numpy as np

from engine.atomic import writing
from engine.book import Book, Sentence
from engine.config import SamplingOptions, SynthesisRequest
from engine.errors import InputError
from engine.pipeline import Synthesizer, sentence_seed

MANIFEST_FORMAT = "voiceapp-export"
MANIFEST_VERSION = 3
"""3: settings name the platform; 2: parts hold 16-bit PCM (1 held float32)."""
PART_MAGIC = b"VAP2"
PART_HEADER = struct.Struct("<4sIQI")
"""magic, sentence index, sample count, CRC-32 of the samples' bytes (16-bit little-endian PCM)."""
SAVE_EVERY_S = 2.0
"""The manifest's progress list is rewritten at most this often (parts on disk are the real record)."""

LOUDNESS_TARGET_DBFS = -20.0
"""Default RMS target of --normalize-loudness (audiobook practice: -23..-18 dB RMS)."""
PEAK_CEILING_DBFS = -3.0
"""A chapter's gain never lifts its highest peak above this."""


RESTART = "pass --restart to discard it and start over"
"""What every message about an export that cannot be resumed says to do (--resume continues one that can)."""


class ManifestError(InputError):
    """The manifest cannot be read or belongs to a different export."""


CPU_JOBS = 4
"""Default --jobs on the CPU, which gains little from more."""
GPU_SPARE_JOBS = 32
"""Default --jobs on a GPU: the lane's rows plus these, so a row that frees while its sentence decodes is taken
at once by a sentence already waiting."""


def default_jobs(lane_rows: int) -> int:
    """Sentences an engine renders at once by default: its graph lanes' rows and GPU_SPARE_JOBS, or CPU_JOBS
    without a lane."""
    return lane_rows + GPU_SPARE_JOBS if lane_rows else CPU_JOBS

@dataclass(frozen=True, slots=True)
class ExportSettings:
    """Everything that decides a sentence's audio. A resumed export must match all of it."""

    input_sha256: str
    voice: str
    voice_fingerprint: str
    seed: int
    sampling: str
    """SamplingOptions without the seed."""
    join: str
    """JoinConfig: pause, fades, sentence length."""
    schedule: str
    """WindowSchedule: streaming decode windows."""
    model_hash: str = ""
    backend: str = ""
    sample_rate: int = 0
    platform: str = ""
    """Where the arithmetic ran: device, driver and library versions (factory.describe_platform). The same seed
    renders the same bytes only there."""

    ENGINE_KEYS = ("model_hash", "backend", "sample_rate", "platform")
    """Known only once the engine is built; the rest is checked before loading the model."""


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """What to render: the book's sentences and the settings that make them reproducible."""

    book: Book
    sentences: tuple[Sentence, ...]
    settings: ExportSettings
    options: SamplingOptions

    def request(self, index: int) -> SynthesisRequest:
        """Sentence `index` as its own request; its seed depends only on the export seed and the index."""
        options = dataclasses.replace(self.options, seed=sentence_seed(self.settings.seed, index))
        request_id = f"export-{index}-{uuid4().hex[:12]}"  # never reused: a backend may remember aborted ids
        return SynthesisRequest(self.sentences[index].text, voice=self.settings.voice, options=options,
                                request_id=request_id)

    def chapter_ranges(self) -> list[range]:
        """Sentence indices of each chapter (every chapter of a parsed Book has at least one sentence)."""
        starts = [i for i, s in enumerate(self.sentences) if i == 0 or s.chapter != self.sentences[i - 1].chapter]
        return [range(a, b) for a, b in zip(starts, starts[1:] + [len(self.sentences)])]

    def chapter_title(self, sentences: range) -> str:
        """The title of the chapter that `sentences` (one of chapter_ranges()) belong to."""
        return self.book.chapters[self.sentences[sentences.start].chapter].title


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- parts ------------------------------------------------------------------------------------------------

class Parts:
    """A directory of finished sentences, one file each, written atomically (temp file + rename)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, index: int) -> Path:
        return self.dir / f"{index:06d}.part"

    def write(self, index: int, samples: np.ndarray) -> None:
        """Store float samples as the 16-bit PCM the WAV will hold (to_pcm16)."""
        data = to_pcm16(samples)
        with writing(self.path(index)) as f:
            f.write(PART_HEADER.pack(PART_MAGIC, index, len(data) // 2, zlib.crc32(data)))
            f.write(data)

    def read(self, index: int) -> np.ndarray | None:
        """The sentence's 16-bit samples ("<i2"), or None when the part is missing, torn or corrupt."""
        try:
            raw = self.path(index).read_bytes()
        except OSError:
            return None
        if len(raw) < PART_HEADER.size:
            return None
        magic, stored_index, samples, crc = PART_HEADER.unpack_from(raw)
        data = memoryview(raw)[PART_HEADER.size:]
        if magic != PART_MAGIC or stored_index != index or len(data) != samples * 2 or zlib.crc32(data) != crc:
            return None
        return np.frombuffer(data, dtype="<i2")

    def samples(self, index: int) -> int:
        """The sentence's sample count from its part's header alone (InputError when the part is missing or is
        not one); read() checks the samples themselves."""
        try:
            with open(self.path(index), "rb") as f:
                head = f.read(PART_HEADER.size)
        except OSError:
            head = b""
        if len(head) == PART_HEADER.size:
            magic, stored_index, samples, _ = PART_HEADER.unpack(head)
            if magic == PART_MAGIC and stored_index == index:
                return samples
        raise InputError(f"finished sentence {index} in {self.dir} is missing or corrupt; rerun with --resume "
                         f"to render it again")

    def written(self) -> int:
        """How many part files are there now, without reading them (progress watchers; 0 without the folder)."""
        try:
            return sum(1 for _ in self.dir.glob("*.part"))
        except OSError:
            return 0

    def finished(self, count: int) -> set[int]:
        """Indices below `count` whose part is intact (corrupt ones are deleted, to be rendered again)."""
        done = set()
        for i in range(count):
            if self.path(i).exists():
                if self.read(i) is not None:
                    done.add(i)
                else:
                    self.path(i).unlink(missing_ok=True)
        return done

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- manifest ---------------------------------------------------------------------------------------------

class Manifest:
    """The JSON record beside the output: settings, sentence and chapter counts, finished sentences."""

    def __init__(self, path: Path, parts: Parts) -> None:
        self.path, self.parts = path, parts
        self._saved_at = 0.0

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> dict[str, Any]:
        """The manifest's contents; ManifestError (one line, with what to do) when unreadable or not ours."""
        try:
            data = json.loads(self.path.read_text())
        except OSError as err:
            raise ManifestError(f"cannot read {self.path}: {err.strerror or err}") from None
        except ValueError:
            raise self._corrupt("not valid JSON") from None
        except RecursionError:  # json recurses once a level: Python's own limit is the depth limit
            raise self._corrupt("nested too deep to be a manifest") from None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise self._corrupt("not a voiceapp export manifest")
        if data.get("version") != MANIFEST_VERSION:
            raise ManifestError(f"{self.path} was written by another version of voicectl (manifest version "
                                f"{data.get('version')!r}; this one reads version {MANIFEST_VERSION}), so its "
                                f"finished sentences cannot be resumed; {RESTART}")
        problem = manifest_problem(data)
        if problem:
            raise self._corrupt(problem)
        return data

    def _corrupt(self, why: str) -> ManifestError:
        return ManifestError(f"{self.path} is corrupt ({why}), so its export cannot be resumed; {RESTART}")

    def check(self, data: dict[str, Any], plan: ExportPlan, keys: tuple[str, ...]) -> None:
        """Refuse to resume an export whose audio would differ: input, model, voice, seed or settings changed."""
        now = dataclasses.asdict(plan.settings)
        for key in keys:
            if key == "platform" and data["settings"].get(key) != now[key]:
                raise ManifestError(f"cannot resume {self.path.name}: its finished sentences were rendered on "
                                    f"{data['settings'].get(key)!r}, this is {now[key]!r}, and the bytes would "
                                    f"differ; resume it there, or pass --restart to render everything here")
            if data["settings"].get(key) != now[key]:
                what = "the input file changed" if key == "input_sha256" else \
                    f"{key.replace('_', ' ')} was {data['settings'].get(key)!r}, now {now[key]!r}"
                raise ManifestError(f"cannot resume {self.path.name}: {what}; rerun with the original settings, "
                                    f"or {RESTART}")
        if data["sentences"] != len(plan.sentences):
            raise ManifestError(f"cannot resume: {self.path} lists {data['sentences']} sentences, the input has "
                                f"{len(plan.sentences)}; {RESTART}")

    def save(self, plan: ExportPlan, done: set[int], outputs: list[str], force: bool = True) -> None:
        """Write atomically (temp + fsync + rename); without `force`, at most every SAVE_EVERY_S seconds."""
        now = time.monotonic()
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        data = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "settings": dataclasses.asdict(plan.settings),
                "sentences": len(plan.sentences), "outputs": outputs, "parts": self.parts.dir.name,
                "chapters": [{"title": plan.book.chapters[plan.sentences[r.start].chapter].title, "first": r.start}
                             for r in plan.chapter_ranges()],
                "done": sorted(done)}
        with writing(self.path, mode="w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())

    def finish(self, plan: ExportPlan, outputs: list[Path], assembly: dict[str, Any]) -> None:
        """Record a finished export in place of an unfinished one, then delete the parts: the settings, the
        assembly's (`assembly`: output format, loudness, metadata) and each output's name and size, so that a rerun
        can say it is complete without rendering anything (`completed`)."""
        data = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "settings": dataclasses.asdict(plan.settings),
                "sentences": len(plan.sentences), "outputs": [p.name for p in outputs], "parts": self.parts.dir.name,
                "chapters": [{"title": plan.chapter_title(r), "first": r.start} for r in plan.chapter_ranges()],
                "done": [], "complete": {"assembly": assembly, "files": {p.name: p.stat().st_size for p in outputs},
                                         "at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}}
        with writing(self.path, mode="w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        self.parts.remove()

    def remove(self) -> None:
        """Delete the manifest and the parts; ManifestError where the manifest's name holds a directory (not ours:
        it is left as it is)."""
        if self.path.is_dir() and not self.path.is_symlink():
            raise ManifestError(f"{self.path} is a directory, not an export manifest; move it away or choose "
                                f"another -o")
        self.path.unlink(missing_ok=True)
        self.parts.remove()


def completed_problem(data: dict[str, Any], plan: ExportPlan, assembly: dict[str, Any], folder: Path) -> str | None:
    """Why a finished export's record (Manifest.finish) does not stand for this run's output, or None when it
    does: a setting that decides the audio or its assembly changed (named, old and new), or an output file is
    gone or another size. Settings known only from the engine (model hash, platform) are not compared: the record
    is read before any model is loaded."""
    done = data["complete"]
    now = dataclasses.asdict(plan.settings)
    for key in (k for k in now if k not in ExportSettings.ENGINE_KEYS):
        if data["settings"].get(key) != now[key]:
            return "the input changed" if key == "input_sha256" else \
                f"{key.replace('_', ' ')} was {data['settings'].get(key)!r}, now {now[key]!r}"
    if data["sentences"] != len(plan.sentences):
        return f"it had {data['sentences']} sentences, the input now has {len(plan.sentences)}"
    for key in sorted(set(done.get("assembly", {})) | set(assembly)):
        before = done.get("assembly", {}).get(key)
        if before != assembly.get(key):
            return f"{key.replace('_', ' ')} was {before!r}, now {assembly.get(key)!r}"
    for name, size in done.get("files", {}).items():
        try:
            actual = (folder / name).stat().st_size
        except OSError:
            return f"{name} is gone"
        if actual != size:
            return f"{name} changed since (size {actual}, was {size})"
    return None


MANIFEST_FIELDS = {"settings": dict, "sentences": int, "outputs": list, "parts": str, "chapters": list,
                   "done": list}
"""The fields Manifest.save writes besides format and version, and their JSON types."""


def manifest_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's fields (missing, of the wrong type, out of range), or None."""
    for key, kind in MANIFEST_FIELDS.items():
        if not _is(data.get(key), kind):
            return f"{key!r} is missing or of the wrong type (expected {kind.__name__})"
    for key, kind in get_type_hints(ExportSettings).items():
        if not _is(data["settings"].get(key), kind):
            return f"setting {key!r} is missing or of the wrong type (expected {getattr(kind, '__name__', kind)})"
    if not all(_is(path, str) for path in data["outputs"]):
        return "'outputs' is not a list of file names"
    count = data["sentences"]
    if not all(isinstance(c, dict) and _is(c.get("title"), str) and _is(c.get("first"), int)
               and 0 <= c["first"] < count for c in data["chapters"]):
        return "'chapters' is not a list of titles and first sentences"
    if not all(_is(i, int) and 0 <= i < count for i in data["done"]):
        return f"'done' is not a list of sentence numbers below {count}"
    done = data.get("complete")
    if done is not None and not (isinstance(done, dict) and isinstance(done.get("assembly"), dict)
                                 and isinstance(done.get("files"), dict)
                                 and all(_is(v, int) for v in done["files"].values())):
        return "'complete' is not a record of a finished export"
    return None


def _is(value: Any, kind: type) -> bool:
    """isinstance, where JSON's true and false are not ints."""
    return isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)


# ---- rendering --------------------------------------------------------------------------------------------

async def render_parts(synth: Synthesizer, plan: ExportPlan, parts: Parts, todo: list[int], jobs: int,
                       on_done: Callable[[int, int], None]) -> None:
    """Render `todo` with up to `jobs` requests in flight (lowest index first); each finished sentence is written
    to `parts` before `on_done(index, samples)`. The first failure cancels the rest and is raised."""
    pending: Iterator[int] = iter(todo)

    async def worker() -> None:
        for index in pending:  # shared: each index is taken by exactly one worker
            audio = await synth.render(plan.request(index))
            parts.write(index, audio)
            on_done(index, len(audio))

    tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(jobs, len(todo))))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- assembly ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Track:
    """One output file and the sentences it holds."""

    path: Path
    sentences: range


def pause_samples(pause_s: float, sample_rate: int) -> int:
    """The streaming path's inter-sentence silence, in samples (same rounding as the pipeline)."""
    return int(pause_s * sample_rate)


@dataclass(frozen=True, slots=True)
class ChapterGain:
    """--normalize-loudness for one chapter."""

    gain: float
    short_db: float = 0.0
    """How far below the target the peak ceiling holds the chapter (0.0: it reaches the target)."""


def chapter_gains(parts: Parts, chapters: list[range], target_dbfs: float,
                  ceiling_dbfs: float = PEAK_CEILING_DBFS) -> list[ChapterGain]:
    """Each chapter's gain: its RMS over its sentences' samples (pauses excluded) to `target_dbfs`, limited so its
    highest peak stays at or below `ceiling_dbfs`. Per chapter, not one for the book, so that every chapter a
    listener skips to plays at the target level, whatever was louder or quieter elsewhere in the book. Sums in
    float64 in index order: deterministic, and a resumed export gets the same gains."""
    return [_chapter_gain(parts, r, target_dbfs, ceiling_dbfs) for r in chapters]


def _chapter_gain(parts: Parts, sentences: range, target_dbfs: float, ceiling_dbfs: float) -> ChapterGain:
    total, n, peak = 0.0, 0, 0.0
    for i in sentences:
        x = _part(parts, i).astype(np.float64) / PCM_SCALE
        total += float(np.dot(x, x))
        n += len(x)
        peak = max(peak, float(np.max(np.abs(x))) if len(x) else 0.0)
    if n == 0 or total == 0.0:
        return ChapterGain(1.0)  # silence stays silence
    wanted = 10 ** (target_dbfs / 20) / math.sqrt(total / n)
    limit = 10 ** (ceiling_dbfs / 20) / peak
    return ChapterGain(wanted) if wanted <= limit else ChapterGain(limit, 20 * math.log10(wanted / limit))


def chapter_lufs_gains(parts: Parts, chapters: list[range], target_lufs: float, pause: int, sample_rate: int,
                       ceiling_dbfs: float = PEAK_CEILING_DBFS) -> list[ChapterGain]:
    """Each chapter's gain to `target_lufs` of BS.1770 integrated loudness (engine.loudness), measured on the
    chapter as it is heard, pauses included (the gating leaves silence out), limited so its highest peak stays at
    or below `ceiling_dbfs`. One chapter's audio at a time, a sentence at a time."""
    from engine.loudness import LoudnessMeter

    gains = []
    for sentences in chapters:
        meter, peak = LoudnessMeter(sample_rate), 0
        for piece in track_pcm(parts, Track(Path(), sentences), pause):
            pcm = np.frombuffer(piece, "<i2")
            meter.add(pcm, 1 / PCM_SCALE)
            peak = max(peak, int(np.abs(pcm.astype(np.int32)).max()) if len(pcm) else 0)
        measured = meter.lufs()
        if not math.isfinite(measured) or peak == 0:
            gains.append(ChapterGain(1.0))  # silence stays silence
            continue
        wanted = 10 ** ((target_lufs - measured) / 20)
        limit = 10 ** (ceiling_dbfs / 20) / (peak / PCM_SCALE)
        gains.append(ChapterGain(wanted) if wanted <= limit else
                     ChapterGain(limit, 20 * math.log10(wanted / limit)))
    return gains


@dataclass(frozen=True, slots=True)
class LoudnessTarget:
    """--normalize-loudness or --loudness: what each chapter is scaled to (a value, so that it can be handed to
    the assembly process)."""

    level: float
    lufs: bool
    """BS.1770 integrated loudness (chapter_lufs_gains); else RMS in dBFS (chapter_gains)."""

    def gain(self, parts: Parts, chapter: range, pause: int, sample_rate: int) -> ChapterGain:
        """The chapter's gain, from its finished parts."""
        if self.lufs:
            return chapter_lufs_gains(parts, [chapter], self.level, pause, sample_rate)[0]
        return chapter_gains(parts, [chapter], self.level)[0]


def ceiling_notice(gains: list[ChapterGain], titles: list[str], target_dbfs: float,
                   ceiling_dbfs: float = PEAK_CEILING_DBFS, most: int = 3, option: str = "--normalize-loudness",
                   unit: str = "dBFS RMS") -> str | None:
    """One line naming the chapters the peak ceiling holds below the target (the first `most`), or None."""
    short = [(n, title, g.short_db) for n, (g, title) in enumerate(zip(gains, titles), 1) if g.short_db > 0.0]
    if not short:
        return None
    named = ", ".join(f'{n} "{title}" by {db:.1f} dB' for n, title, db in short[:most])
    more = f" and {len(short) - most} more" if len(short) > most else ""
    return (f"{option}: the {ceiling_dbfs:g} dBFS peak ceiling holds {len(short)} of {len(gains)} "
            f"chapters below {target_dbfs:g} {unit}: {named}{more}")


def sentence_starts(parts: Parts, track: Track, pause: int) -> tuple[list[int], int]:
    """Where each of the track's sentences starts, in samples from the track's start, and the track's length: from
    the parts' headers, before any audio is read (what a container's chapter marks need up front)."""
    starts, at = [], 0
    for i in track.sentences:
        if i != track.sentences.start:
            at += pause
        starts.append(at)
        at += parts.samples(i)
    return starts, at


def track_pcm(parts: Parts, track: Track, pause: int, gains: list[float] | None = None,
              before: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The track's audio as 16-bit PCM pieces, one sentence or pause at a time: `pause` zeros between sentences,
    each sentence scaled by its gain in `gains` (one per sentence of the book) where given. `before(i)`, where
    given, is called before sentence i is read (FollowingAssembly waits there for its part)."""
    for i in track.sentences:
        if before is not None:
            before(i)
        if i != track.sentences.start and pause:
            yield bytes(2 * pause)
        pcm = _part(parts, i)
        gain = 1.0 if gains is None else gains[i]
        yield pcm.tobytes() if gain == 1.0 else apply_gain(pcm, gain)


def assemble(parts: Parts, tracks: list[Track], sample_rate: int, pause: int,
             gains: list[float] | None = None) -> tuple[list[list[int]], int]:
    """Write each track's sentences in order as 16-bit WAV, `pause` zeros between them (temp file, then rename),
    once every part is finished; `gains`, if given, holds one gain per sentence (its chapter's: chapter_gains).
    Returns each track's sentence start offsets in samples (for chapter marks) and the samples written in all."""
    offsets, total = [], 0
    for track in tracks:
        starts, length = sentence_starts(parts, track, pause)
        with writing(track.path, ".partial") as f:
            with wave.open(f, "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(sample_rate)
                for piece in track_pcm(parts, track, pause, gains):
                    w.writeframes(piece)
        offsets.append(starts)
        total += length
    return offsets, total


@dataclass(frozen=True, slots=True)
class Assembled:
    """What assembly wrote, for the CUE sheet, the loudness notice and the export's summary."""

    offsets: list[list[int]]
    """Each track's sentence starts, in samples from its start."""
    total: int
    """Samples written in all."""
    gains: list[ChapterGain]
    """Each chapter's loudness gain ([] without a loudness target)."""
    encode_s: float
    """Time spent reading parts, encoding and writing the files, not waiting for parts."""
    after_last_part_s: float
    """From the last part finished to the last file complete."""


class TrackWriter(Protocol):
    """How FollowingAssembly turns a track into its file: through a codec (voiceapp.audio.containers for M4B, MP3 and
    Opus). Each file argument is a new temp file that becomes the track's file when the call returns."""

    def write(self, track: Track, file: IO[bytes], pcm: Iterator[bytes], starts: list[int], length: int) -> None:
        """Every part of `track` is finished: its audio `pcm` straight into `file`, chapter marks from `starts`
        (each sentence's first sample) and `length`."""

    def encode(self, track: Track, pcm: Iterator[bytes], scratch: IO[bytes]) -> None:
        """Parts of `track` are still rendering: encode `pcm` (it waits for each part) into `scratch`."""

    def finish(self, track: Track, scratch: IO[bytes], file: IO[bytes], starts: list[int], length: int) -> None:
        """Every part is finished now: write `file` from what `encode` left in `scratch`, with the marks."""


class _Stopped(Exception):
    """FollowingAssembly.stop(): the thread leaves what it was writing."""


class FollowingAssembly:
    """Assembly beside rendering: a thread writes the tracks in book order through a TrackWriter, reading part k
    as soon as it is finished (`finished(k)` is the renderer's signal; it waits for part k, never skips ahead), so
    the file is complete shortly after the last part instead of an encode of the whole book later.

    Rendering never waits for it: the hand-off is the part file the renderer writes anyway and an index in a set;
    the thread reads the parts back one sentence at a time, so memory stays flat however far behind it falls.
    A track whose parts are all finished when the thread reaches it (a resumed export, later chapter files) is
    written in one pass; one still rendering is encoded into a scratch file in the parts folder and copied into
    its file once its last part, and with it every chapter mark, is known. A killed run's scratch file is
    rewritten from the parts. With loudness gains the thread waits for a chapter's last part before its first:
    a chapter's gain is measured on all of it."""

    SCRATCH = "track{:04d}.{}.encoding"
    """A track's encoded packets while it renders, in the parts folder (not a *.part: Parts never counts it),
    named by track and process: a killed run's encoder, still leaving, never touches the next run's."""

    def __init__(self, parts: Parts, tracks: list[Track], pause: int, writer: TrackWriter, finished: set[int],
                 chapters: list[range], loudness: LoudnessTarget | None = None, sample_rate: int = 0,
                 clock: Callable[[], float] = time.perf_counter,
                 on_end: Callable[["FollowingAssembly"], None] | None = None) -> None:
        self.parts, self.tracks, self.pause, self.writer, self.clock = parts, tracks, pause, writer, clock
        self._ready = set(finished)
        self._wake = threading.Condition()
        self._stopped = False
        self._loudness, self._sample_rate, self._on_end = loudness, sample_rate, on_end
        self._chapters = {r.start: r for r in chapters}
        self._gains = [1.0] * (chapters[-1].stop if chapters else 0) if loudness else None
        self.gains: list[ChapterGain] = []
        """Each chapter's gain in book order, once measured (with a loudness target)."""
        self.error: BaseException | None = None
        self.result: Assembled | None = None
        self.last_part_at = clock()
        self._waited = 0.0
        self._thread = threading.Thread(target=self._run, name="export-assembly", daemon=True)

    def start(self) -> None:
        self.last_part_at = self.clock()
        self._thread.start()

    def finished(self, index: int) -> None:
        """Part `index` is on disk (called by the renderer)."""
        with self._wake:
            self._ready.add(index)
            self.last_part_at = self.clock()
            self._wake.notify()

    def check(self) -> None:
        """Raise the thread's failure (a full disk, a corrupt part, FFmpeg's error), if it failed."""
        if self.error is not None:
            raise self.error

    def wait(self) -> None:
        """Until the thread has ended."""
        self._thread.join()

    def join(self) -> Assembled:
        """Wait for the last track's file; what was written, or the thread's failure raised."""
        self._thread.join()
        self.check()
        if self.result is None:
            raise InputError("the export's assembly was stopped")  # stop() came first: the caller is leaving
        return self.result

    def stop(self) -> None:
        """Leave off (rendering failed or was interrupted): the file being written is removed, as is the
        scratch; the parts stay."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        start = self.clock()
        try:
            offsets, total = [], 0
            for n, track in enumerate(self.tracks):
                starts, length = self._track(n, track)
                offsets.append(starts)
                total += length
            end = self.clock()
            with self._wake:
                after = max(0.0, end - max(self.last_part_at, start))
            self.result = Assembled(offsets, total, self.gains, end - start - self._waited, after)
        except _Stopped:
            return
        except BaseException as err:  # handed to the renderer's thread: check() and join() raise it there
            self.error = err
        if self._on_end is not None:
            self._on_end(self)

    def _track(self, n: int, track: Track) -> tuple[list[int], int]:
        pcm = track_pcm(self.parts, track, self.pause, self._gains, self._before)
        with self._wake:
            whole = self._ready.issuperset(track.sentences)
        if whole:
            starts, length = sentence_starts(self.parts, track, self.pause)
            with writing(track.path, ".partial") as f:
                self.writer.write(track, f, pcm, starts, length)
            return starts, length
        path = self.parts.dir / self.SCRATCH.format(n, os.getpid())
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            with open(fd, "w+b") as scratch:
                self.writer.encode(track, pcm, scratch)
                starts, length = sentence_starts(self.parts, track, self.pause)
                with writing(track.path, ".partial") as f:
                    self.writer.finish(track, scratch, f, starts, length)
        finally:
            path.unlink(missing_ok=True)
        return starts, length

    def _before(self, index: int) -> None:
        """Wait for part `index`; at a chapter's first sentence with gains, for the whole chapter, and measure
        its gain."""
        chapter = self._chapters.get(index) if self._loudness is not None else None
        self._wait(chapter or range(index, index + 1))
        if chapter is not None and self._loudness is not None and self._gains is not None:
            gain = self._loudness.gain(self.parts, chapter, self.pause, self._sample_rate)
            self.gains.append(gain)
            self._gains[chapter.start:chapter.stop] = [gain.gain] * len(chapter)

    def _wait(self, sentences: range) -> None:
        with self._wake:
            if self._stopped:
                raise _Stopped
            if self._ready.issuperset(sentences):
                return
            t0 = self.clock()
            while not (self._stopped or self._ready.issuperset(sentences)):
                self._wake.wait()
            self._waited += self.clock() - t0
            if self._stopped:
                raise _Stopped


def _part(parts: Parts, index: int) -> np.ndarray:
    audio = parts.read(index)
    if audio is None:
        raise InputError(f"finished sentence {index} in {parts.dir} is missing or corrupt; rerun with --resume "
                         f"to render it again")
    return audio


PCM_SCALE = 32767.0


def to_pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> little-endian 16-bit PCM (rounded, clipped)."""
    return np.clip(np.rint(samples * PCM_SCALE), -32768, 32767).astype("<i2").tobytes()


def apply_gain(pcm: np.ndarray, gain: float) -> bytes:
    """16-bit samples scaled by `gain` (rounded, clipped), as 16-bit PCM bytes."""
    return np.clip(np.rint(pcm.astype(np.float64) * gain), -32768, 32767).astype("<i2").tobytes()


CUE_MAX_FRAMES = (99 * 60 + 59) * 75 + 74
"""99:59:74, the last INDEX a CUE sheet's two-digit minutes can write (many players read no more digits)."""


def cue_fits(marks: list[tuple[str, int]], sample_rate: int) -> bool:
    """Whether every chapter start in `marks` (title, sample) can be written as MM:SS:FF with two-digit minutes."""
    return all(start * 75 // sample_rate <= CUE_MAX_FRAMES for _, start in marks)


def cue_sheet(title: str, wav_name: str, marks: list[tuple[str, int]], sample_rate: int) -> str:
    """A CUE sheet: one track per chapter at its start (MM:SS:FF, 75 frames per second)."""

    def q(text: str) -> str:
        return '"' + " ".join(text.replace('"', "'").split()) + '"'

    lines = ['REM COMMENT "voiceapp export"', f"TITLE {q(title)}", f"FILE {q(wav_name)} WAVE"]
    for n, (name, start) in enumerate(marks, 1):
        frames = start * 75 // sample_rate
        mm, rest = divmod(frames, 75 * 60)
        ss, ff = divmod(rest, 75)
        lines += [f"  TRACK {n:02d} AUDIO", f"    TITLE {q(name)}", f"    INDEX 01 {mm:02d}:{ss:02d}:{ff:02d}"]
    return "\n".join(lines) + "\n"
