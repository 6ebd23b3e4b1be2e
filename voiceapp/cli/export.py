"""Provides `voicectl export BOOK -o OUT.m4b | .mp3 | .opus | .wav | DIR/`: render a .txt, .md or .epub book to
an audiobook file, resumably.

Sentences render concurrently (--jobs), each with its own seed derived from --seed and its index, into finished
parts beside the output (engine.export_plan); an interrupted export continues with --resume and gives the same
bytes as an uninterrupted one. Outputs: one M4B, MP3 or Opus file with chapter marks, title, author and cover
(voiceapp.audio.containers), encoded while the sentences render (engine.assembly_process), one WAV (+ a CUE sheet of
chapters when there are several) written once they are rendered, or one file per chapter (-o DIR/, WAV, or
--split-chapters). A finished export leaves its manifest as its record: run again, it says it is complete. Without --resume an earlier unfinished export is never discarded
silently: --restart discards it. One export per output at a time: a second one refuses at once (a lock file beside
the output names the running one's pid).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from voiceapp.common import (add_engine_args, add_voice_args, engine_config, process_start_perf, read_input_bytes,
                             read_text_file, require_speakable, sampling_options)
from voiceapp.audio.wavout import check_output

from engine.export_plan import CPU_JOBS, GPU_SPARE_JOBS, ExportPlan, Manifest, default_jobs  # noqa: F401 - the lab's scripts read some

if TYPE_CHECKING:
    from voiceapp.audio.containers import Tags
MAX_EPUB_BYTES = 512 * 1024 * 1024


def add_parser(sub) -> None:
    from engine.export_plan import LOUDNESS_TARGET_DBFS, PEAK_CEILING_DBFS

    p = sub.add_parser("export", help="render a book (.txt, .md, .epub, or - for stdin) to an audiobook file; "
                                      "resumable")
    p.add_argument("input", help=".txt, .md or .epub file, or - for plain text on stdin")
    p.add_argument("-o", "--out", required=True,
                   help="OUT.m4b, OUT.mp3 or OUT.opus (chapters, title, author and cover inside), OUT.wav (plus "
                        "OUT.cue listing the chapters when there are several), or DIR/ (one WAV per chapter)")
    p.add_argument("--split-chapters", action="store_true",
                   help="one file per chapter; with -o OUT.m4b they are named 'OUT 01 - Title.m4b'")
    p.add_argument("--title", help="the book's title in the file's tags (default: the EPUB's, else the file name)")
    p.add_argument("--author", help="the author in the file's tags (default: the EPUB's)")
    p.add_argument("--cover", metavar="IMAGE", help="a PNG or JPEG cover for M4B, MP3 and Opus (default: the EPUB's)")
    p.add_argument("--jobs", type=int, help=f"sentences rendered at once (default {CPU_JOBS}; on a GPU, as many as "
                                             f"its lane holds)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted export: keep its finished sentences, render the rest")
    p.add_argument("--restart", action="store_true", help="discard an interrupted export and start over")
    p.add_argument("--normalize-loudness", nargs="?", type=float, const=LOUDNESS_TARGET_DBFS, metavar="DBFS",
                   help=f"scale each chapter to this RMS level, pauses excluded (default {LOUDNESS_TARGET_DBFS:g} "
                        f"dBFS); peaks stay <= {PEAK_CEILING_DBFS:g} dBFS, and a notice names any chapter that this "
                        f"keeps below the level")
    p.add_argument("--loudness", type=lufs_level, metavar="LUFS",
                   help="scale each chapter to this integrated loudness (ITU-R BS.1770): --loudness -18 or "
                        "--loudness=-18LUFS (argparse takes a bare -18LUFS for an option); "
                        f"peaks stay <= {PEAK_CEILING_DBFS:g} dBFS, as with --normalize-loudness")
    add_shared_args(p, "print a JSON summary on stdout when done")
    p.set_defaults(run=run)


def add_shared_args(p: argparse.ArgumentParser, json_help: str) -> None:
    """The options `voicectl export-many` takes as `voicectl export` does: input size, progress, --json, Ray, the
    voice and the engine."""
    p.add_argument("--max-mb", type=int, default=4, help="largest text input accepted, in MB (default 4)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.add_argument("--json", action="store_true", help=json_help)
    add_ray_args(p)
    add_voice_args(p, default_seed=0)
    add_engine_args(p)


def add_ray_args(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group("Ray (pip install 'voiceapp[ray]'; docs/scale.md)")
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="render the sentences on the Ray cluster at ADDRESS (a head's HOST:PORT, ray://HOST:10001 "
                        "or auto; none: a local cluster), one engine per GPU; the same bytes as without --ray")
    r.add_argument("--ray-workers", type=int, metavar="N",
                   help="engines on the cluster (default: one per GPU; on a cluster without GPUs, 1 per CPU "
                        "worker: give N)")


def check_ray_options(args: argparse.Namespace) -> None:
    """No Ray with --ray, or --ray-workers without it: one line, before anything is read."""
    from engine.errors import InputError

    if args.ray is not None:
        from voiceapp.cluster.serve import import_ray

        import_ray()
    elif args.ray_workers is not None:
        raise InputError("--ray-workers is an option of --ray")


def lufs_level(text: str) -> float:
    """--loudness's value: a number, optionally followed by LUFS ("-18LUFS", "-18 LUFS", "-18")."""
    number = text.strip()
    if number.upper().endswith("LUFS"):
        number = number[:-4].strip()
    try:
        return float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a loudness such as -18LUFS") from None


LOUDNESS_RANGE_DBFS = (-50.0, -6.0)
"""--normalize-loudness targets accepted: quieter is near-silence, louder than the peak ceiling allows."""


def check_loudness_target(target: float | None, option: str = "--normalize-loudness", what: str = "an RMS level",
                          unit: str = "dBFS") -> None:
    """InputError unless --normalize-loudness is absent or a finite level in LOUDNESS_RANGE_DBFS (-inf would scale
    every chapter to silence, nan every sample to nothing)."""
    from engine.errors import InputError

    low, high = LOUDNESS_RANGE_DBFS
    if target is not None and not (math.isfinite(target) and low <= target <= high):
        raise InputError(f"{option} {target:g}: give {what} from {low:g} to {high:g} {unit}")


def run(args: argparse.Namespace) -> int:
    from engine.errors import InputError

    if args.max_mb < 1:
        raise InputError("--max-mb must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    if args.resume and args.restart:
        raise InputError("--resume and --restart exclude each other")
    check_ray_options(args)
    check_loudness_target(args.normalize_loudness)
    check_loudness_target(args.loudness, "--loudness", "an integrated loudness", "LUFS")
    if args.loudness is not None and args.normalize_loudness is not None:
        raise InputError("--loudness and --normalize-loudness exclude each other: one target per book")
    layout = Layout.from_args(args)
    plan = make_plan(args)
    refuse_overwriting_input(args.input, layout, plan)
    refuse_read_only_outputs(layout, plan)
    tags = book_tags(args, plan.book, layout)
    show = "bar" if sys.stderr.isatty() else "lines"
    with lock_output(layout):
        if not args.restart and already_complete(plan, layout, args, tags):
            return 0
        try:
            stats = asyncio.run(export(plan, layout, args, tags, None if args.no_progress else show))
        except KeyboardInterrupt:
            raise interrupted(layout, len(plan.sentences)) from None
    report(plan, layout, stats)
    if args.json:
        print(json.dumps({**stats, "sentences": len(plan.sentences), "chapters": len(plan.book.chapters)}))
    return 0


def report(plan, layout: Layout, stats: dict) -> None:
    """The line a finished export ends with."""
    what = ", ".join(str(t.path) for t in layout.tracks(plan)[:3]) + (" ..." if len(plan.book.chapters) > 3
                                                                      and layout.split else "")
    resumed = f"; {stats['resumed']} were already done" if stats["resumed"] else ""
    print(f"wrote {what}: {stats['audio_s']:.1f} s of audio in {stats['wall_s']:.1f} s ({stats['xrt']:.1f}x real "
          f"time; {stats['e2e_s']:.1f} s since launch, {stats['e2e_xrt']:.1f}x; {len(plan.sentences)} sentences in "
          f"{len(plan.book.chapters)} chapters{resumed}; {'encoded' if layout.suffix != '.wav' else 'written'} in "
          f"{stats['encode_s']:.1f} s, complete {stats['after_last_part_s']:.1f} s after the last sentence)",
          file=sys.stderr)


# ---- where things go --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """Output paths: the WAV(s), the CUE sheet, the manifest and the parts directory."""

    out: Path
    directory: bool
    split: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Layout":
        from engine.errors import OutputError

        from voiceapp.audio.containers import check_suffix

        out = Path(args.out)
        directory = args.out.endswith(("/", os.sep)) or out.is_dir()
        if not directory:
            check_suffix(out)
            check_output(out, any_suffix=True)
            return cls(out, False, args.split_chapters)
        if not out.parent.is_dir():
            raise OutputError(f"{out}: directory {out.parent} does not exist")
        out.mkdir(exist_ok=True)
        if not os.access(out, os.W_OK):
            raise OutputError(f"{out}: directory is not writable")
        return cls(out, True, True)

    def _beside(self, name: str) -> Path:
        """`OUT.wav.NAME` beside a WAV output, `DIR/export.NAME` in a directory one."""
        return self.out / f"export.{name}" if self.directory else self.out.with_name(f"{self.out.name}.{name}")

    @property
    def manifest(self) -> Path:
        return self._beside("manifest.json")

    @property
    def parts(self) -> Path:
        return self._beside("parts")

    @property
    def lock(self) -> Path:
        return self._beside("lock")

    @property
    def cue(self) -> Path:
        return self.out.with_suffix(".cue")

    @property
    def suffix(self) -> str:
        """The output files' suffix: .wav, or a container's (voiceapp.audio.containers)."""
        return ".wav" if self.directory else self.out.suffix.lower()

    def has_cue(self, plan) -> bool:
        """One WAV of several chapters gets a CUE sheet of them (while the sheet can mark them: cue_fits);
        the other formats hold their chapters themselves."""
        return not self.split and self.suffix == ".wav" and len(plan.book.chapters) > 1

    def files(self, plan) -> list[Path]:
        """Every file the export writes (besides the parts)."""
        return [*(t.path for t in self.tracks(plan)), *([self.cue] if self.has_cue(plan) else []), self.manifest,
                self.lock]

    def tracks(self, plan):
        from engine.export_plan import Track

        if not self.split:
            return [Track(self.out, range(len(plan.sentences)))]
        ranges = plan.chapter_ranges()
        width = max(2, len(str(len(ranges))))
        prefix = "" if self.directory else f"{self.out.stem} "
        folder = self.out if self.directory else self.out.parent
        return [Track(folder / f"{prefix}{n:0{width}d} - {_file_title(plan.chapter_title(r))}{self.suffix}", r)
                for n, r in enumerate(ranges, 1)]


def _file_title(title: str) -> str:
    return re.sub(r"[^\w ,.'()&-]+", "_", title).strip(" ._")[:60] or "chapter"


def refuse_overwriting_input(source: str, layout: Layout, plan) -> None:
    """Refuse an export that would replace its own input: an output file that is the input (same device and inode,
    so hard links and symlinks count), or a parts folder (deleted at the end) that holds it."""
    from engine.errors import InputError

    source_id = _stdin_id() if source == "-" else _file_id(source)
    if source_id is None:
        return
    for path in layout.files(plan):
        if _file_id(path) == source_id:
            raise InputError(f"{'stdin' if source == '-' else source}: the export would overwrite its own input (as "
                             f"{path}); choose another -o")
    if Path(os.path.realpath(source)).is_relative_to(os.path.realpath(layout.parts)):
        raise InputError(f"{source} is inside {layout.parts}, which the export deletes; move it or choose another -o")


def refuse_read_only_outputs(layout: Layout, plan) -> None:
    """An output file (a chapter file, the CUE sheet) marked read-only is kept, as a read-only WAV is: OutputError
    before any work, instead of replacing it."""
    from engine.errors import OutputError
    from voiceapp.audio.wavout import read_only

    for path in layout.files(plan)[:-2]:  # not the manifest and the lock: the export's own
        if path.exists() and not path.is_dir() and read_only(path):
            raise OutputError(f"{path} exists and is read-only; remove it or choose another -o")


def _stdin_id() -> tuple[int, int] | None:
    """(device, inode) of stdin where it is a regular file (`export - < FILE`); None for a pipe or a terminal."""
    import stat

    try:
        st = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _file_id(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of the file `path` names, links followed; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def lock_output(layout: Layout):
    """The output's lock, held for the whole export: a second export to the same output refuses at once."""
    from engine.errors import OutputError
    from voiceapp.lockfile import LockHeld, PidLock

    try:
        return PidLock.acquire(layout.lock)
    except LockHeld as held:
        raise OutputError(f"{layout.out}: another export to it is running (pid {held.pid}); wait for it to end, "
                          f"or choose another -o") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OutputError(f"{layout.lock} is a symbolic link, not an export's lock; remove it") from None
        raise OutputError(f"cannot create {layout.lock}: {err.strerror or err}") from None


# ---- the plan ---------------------------------------------------------------------------------------------

def make_plan(args: argparse.Namespace):
    """Read and parse the input, and fix everything that decides the audio (before any model is loaded)."""
    from engine.book import book_sentences, read_book
    from engine.errors import InputError
    from engine.export_plan import ExportPlan, ExportSettings, sha256_bytes
    from engine.families import family_of

    name, data = read_input(args.input, args.max_mb * 1024 * 1024)
    source = "stdin" if args.input == "-" else args.input
    if isinstance(data, str):
        require_speakable(data, source)
    book = read_book(name, data, max_bytes=args.max_mb * 1024 * 1024)
    for notice in book.notices:
        _print_notices(notice)
    config = engine_config(args)
    sentences = book_sentences(book, config.join.max_sentence_chars)
    if not sentences:
        raise InputError(f"{source} has no speakable text (only code, markup or symbols?)")
    family = family_of(args.model)
    voice = (config.voices or family.voices()).get(args.voice)
    options = sampling_options(args)
    settings = ExportSettings(
        input_sha256=sha256_bytes(data if isinstance(data, bytes) else data.encode()), voice=voice.name,
        voice_fingerprint=repr(voice.global_tokens) if voice.global_tokens else voice.fingerprint, seed=args.seed,
        sampling=repr(dataclasses.replace(options, seed=None)), join=repr(config.join),
        schedule=repr(export_config(config).schedule))  # the engine's
    return ExportPlan(book, tuple(sentences), settings, options)


def read_input(path: str, max_bytes: int) -> tuple[str, bytes | str]:
    """(name, contents): text for .txt/.md/stdin (size and encoding checks), bytes for .epub."""
    from engine.errors import InputError

    if path == "-" or not path.lower().endswith(".epub"):
        return ("stdin.txt" if path == "-" else path), read_text_file(path, max_bytes)
    data = read_input_bytes(path, MAX_EPUB_BYTES, kind="EPUB file")
    if data is None:
        raise InputError(f"{path} is larger than {MAX_EPUB_BYTES >> 20} MB")
    return path, data


# ---- running it -------------------------------------------------------------------------------------------

async def export(plan, layout: Layout, args: argparse.Namespace, tags, show_progress: str | None) -> dict:
    return (await export_books([book_job(plan, layout, args, tags)], args, show_progress))[0]


def book_job(plan, layout: Layout, args: argparse.Namespace, tags) -> "BookJob":
    """A book to render, with the manifest of its export and the one being resumed (checked against `args`)."""
    from engine.export_plan import Manifest, Parts

    manifest = Manifest(layout.manifest, Parts(layout.parts))
    return BookJob(plan, layout, manifest, previous_run(manifest, plan, args, str(layout.out)), tags, args)


async def export_books(books: list["BookJob"], args: argparse.Namespace, show_progress: str | None) -> list[dict]:
    """Render and assemble each book, on one engine of this process or (--ray) on the cluster; each book's stats."""
    if args.ray is not None:
        return await export_on_ray(books, args, show_progress)
    from engine.factory import build_synthesizer
    from engine.metrics import RequestMetrics
    from engine.platform_info import export_identity

    # deterministic: a sentence's bytes must not depend on what renders beside it (--jobs, where a resume
    # restarts), nor on the process, or --resume would not reproduce an uninterrupted export. No warm-up request:
    # nobody listens for an export's first sentence, whose first-use costs it may as well pay itself.
    engine = RequestMetrics()  # its start-up phases are reported; the sentences' requests are counted by Progress

    def on_event(event) -> None:
        engine.apply(event)
        _print_notices(event)

    synth = build_synthesizer(export_config(engine_config(args)), events=on_event)
    results = []
    try:
        for book in books:
            plan = engine_checked(book.plan, export_identity(synth), book.manifest, book.earlier)
            stats = await render_and_assemble(plan, LocalRenderer(synth, plan), book.manifest, book.layout,
                                              book.args, book.tags, show_progress)
            results.append({**stats, "phases": {name: round(seconds, 3) for name, seconds in engine.phases.items()}})
    finally:
        await synth.close()
    return results


@dataclasses.dataclass(frozen=True)
class BookJob:
    """One book to render and assemble (`voicectl export-many` renders several in one go): what
    render_and_assemble needs of it."""

    plan: ExportPlan
    layout: Layout
    manifest: Manifest
    earlier: dict | None
    """The manifest of the export being resumed (previous_run), or None."""
    tags: Tags | None
    args: argparse.Namespace
    """Its export's options (voiceapp.cli.export_many gives each book its own input and output)."""


async def export_on_ray(books: list[BookJob], args: argparse.Namespace, show_progress: str | None) -> list[dict]:
    """`--ray`: the books' sentences render on the cluster, in one dataset (voiceapp.cluster.export); the first
    worker's engine identity is checked against every book's manifest before any part is written; each book is
    then assembled by this process, as ever. Returns each book's stats."""
    import ray

    from voiceapp.cluster.export import RayRenderer, Workers
    from voiceapp.cluster.serve import connect

    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, connect, args.ray or None, _print_notices)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if not gpus:
        _print_notices(f"the Ray cluster has no GPUs: {args.ray_workers or 1} CPU workers render the sentences")
    renderer = RayRenderer([book.plan for book in books], export_config(engine_config(args)),
                           Workers(gpus, count=args.ray_workers, jobs=args.jobs))
    todos = []
    for book in books:
        parts = book.manifest.parts
        done = parts.finished(len(book.plan.sentences)) if parts.dir.is_dir() else set()
        todos.append([i for i in range(len(book.plan.sentences)) if i not in done])
    try:
        identity = await renderer.start([book.manifest.parts for book in books], todos)
        plans = [engine_checked(book.plan, identity, book.manifest, book.earlier) for book in books]
        return [await render_and_assemble(plan, renderer.book(k), book.manifest, book.layout, book.args, book.tags,
                                          show_progress)
                for k, (book, plan) in enumerate(zip(books, plans))]
    finally:
        renderer.close()
        ray.shutdown()


class LocalRenderer:
    """An export's sentences rendered by this process's engine (engine.export_plan.render_parts)."""

    def __init__(self, synth, plan) -> None:
        from engine.factory import lane_rows

        self.synth, self.plan = synth, plan
        self.sample_rate, self.pause_s = synth.sample_rate, synth.join.pause_s
        self.rows = lane_rows(synth.generator)
        self.started: float | None = None
        """When rendering began, where before `render` (perf_counter; None: at `render`)."""

    async def render(self, parts, todo: list[int], jobs: int | None, on_done) -> int:
        """Render `todo` (render_parts); returns the jobs it ran at once."""
        from engine.export_plan import render_parts

        jobs = jobs or default_jobs(self.rows)
        await render_parts(self.synth, self.plan, parts, todo, jobs, on_done)
        return jobs


def export_config(config):
    """The engine an export renders on: deterministic (a sentence's bytes depend on nothing that renders beside it,
    nor on the process) and decoding each sentence whole (WindowSchedule.whole: one decoder call for up to 15 s, no
    seams; an export need not stream)."""
    from engine.families import family_of
    from engine.windowing import WindowSchedule

    whole = WindowSchedule.whole(family_of(config.model).whole_codes)
    return dataclasses.replace(config, deterministic=True, warm_up=False, schedule=whole)


def assembly_settings(args: argparse.Namespace, layout: Layout, tags) -> dict:
    """What decides the output files besides the sentences' audio, and the engine asked for (its identity, model
    hash and platform, is known only once it is loaded): a finished export is complete only for the same."""
    from engine.export_plan import sha256_bytes

    settings = {"output": "chapter files" if layout.split else "one file", "normalize_loudness":
                args.normalize_loudness, "loudness_lufs": args.loudness, "engine": f"backend={args.backend} model={args.model} compute={args.compute} "
                                                   f"quantize={args.quantize}", "format": layout.suffix}
    if layout.suffix != ".wav":
        settings.update(title=tags.title, author=tags.author, language=tags.language,
                        cover=sha256_bytes(tags.cover.data)[:16] if tags.cover else None)
    return settings


def book_tags(args: argparse.Namespace, book, layout: Layout):
    """The title, author, language and cover the output's tags get: the flags, else the EPUB's. A --cover that is
    not a sane image is an InputError; an EPUB's own bad cover is left out with a notice. Checked before any model
    is loaded; WAV has no tags (its CUE names the title)."""
    from engine.errors import InputError
    from voiceapp.audio.containers import MAX_COVER_BYTES, Tags, read_cover

    if layout.suffix == ".wav":
        return Tags(args.title or book.title)
    cover = None
    if args.cover:
        data = read_input_bytes(args.cover, MAX_COVER_BYTES, kind="image file")
        if data is None:
            raise InputError(f"{args.cover}: the cover is larger than {MAX_COVER_BYTES >> 20} MB")
        cover = read_cover(data, args.cover)
    elif book.cover is not None:
        try:
            cover = read_cover(book.cover, f"{args.input}'s cover")
        except InputError as err:
            _print_notices(f"{err}; the output has no cover")
    return Tags(args.title or book.title, author=args.author or book.author, language=book.language, cover=cover)


def already_complete(plan, layout: Layout, args: argparse.Namespace, tags) -> bool:
    """True, after saying so, when the manifest records this very export as finished and its files are there;
    raises (one line naming what differs, and --restart) when it records a finished export of other settings.
    False when there is no finished export to speak of (none, or an unfinished one: previous_run decides)."""
    from engine.export_plan import Manifest, ManifestError, Parts, completed_problem

    manifest = Manifest(layout.manifest, Parts(layout.parts))
    if not manifest.exists():
        return False
    data = manifest.load()
    if data.get("complete") is None:
        return False
    problem = completed_problem(data, plan, assembly_settings(args, layout, tags), layout.manifest.parent)
    if problem:
        raise ManifestError(f"{layout.out} is already exported, but {problem}; pass --restart to render it again")
    s = data["settings"]
    _print_notices(f"{layout.out} is already complete ({data['complete'].get('at', '?')}: {data['sentences']} "
                   f"sentences in {len(data['chapters'])} chapters, voice {s['voice']}, seed {s['seed']}, backend "
                   f"{s['backend']}, model {s['model_hash'][:12]}, {s['sample_rate']} Hz); nothing to do (pass "
                   f"--restart to render it again)")
    if args.json:
        print(json.dumps({"complete": True, "sentences": data["sentences"], "chapters": len(data["chapters"]),
                          "outputs": data["outputs"]}))
    return True


def previous_run(manifest, plan, args: argparse.Namespace, out: str) -> dict | None:
    """The earlier run's manifest to resume, or None to start over. Only --restart discards an earlier export's
    finished sentences; one that cannot be resumed (corrupt, another version, other settings) is refused."""
    from engine.errors import InputError
    from engine.export_plan import ExportSettings

    if not manifest.exists():
        if args.resume:
            _print_notices(f"nothing to resume ({manifest.path} does not exist): starting from the beginning")
        manifest.parts.remove()
        return None
    if args.restart:
        manifest.remove()
        return None
    data = manifest.load()
    if not args.resume:
        raise InputError(f"{out}: an interrupted export is there ({len(data['done'])} of {data['sentences']} "
                         f"sentences recorded); pass --resume to continue it or --restart to start over")
    keys = tuple(f.name for f in dataclasses.fields(ExportSettings) if f.name not in ExportSettings.ENGINE_KEYS)
    manifest.check(data, plan, keys)
    return data


def engine_checked(plan, identity: dict, manifest, earlier: dict | None):
    """The plan completed with the engine's identity (engine.platform_info.export_identity), checked against the
    manifest being resumed."""
    from engine.export_plan import ExportSettings

    engine = identity["describe"]
    settings = dataclasses.replace(plan.settings, model_hash=engine["model"]["hash"] if engine["model"] else "fake",
                                   backend=engine["backend"], sample_rate=identity["sample_rate"],
                                   platform=identity["platform"])
    plan = dataclasses.replace(plan, settings=settings)
    if earlier is not None:
        manifest.check(earlier, plan, ExportSettings.ENGINE_KEYS)
    return plan


async def render_and_assemble(plan, renderer, manifest, layout: Layout, args, tags,
                              show_progress: str | None) -> dict:
    """Render what is left of `plan` with `renderer` (LocalRenderer, or voiceapp.cluster.export.RayRenderer) and
    assemble the output files: M4B, MP3 and Opus encoded while the sentences render, WAV once they are."""
    from engine.export_plan import pause_samples

    parts, tracks = manifest.parts, layout.tracks(plan)
    outputs = [str(t.path) for t in tracks]
    done = parts.finished(len(plan.sentences)) if parts.dir.is_dir() else set()
    resumed = len(done)
    sample_rate = renderer.sample_rate
    progress = Progress([len(s.text) for s in plan.sentences], done, sample_rate, show_progress)
    if renderer.started is not None:  # a cluster renders from before its first sentence came back
        progress.t0 = renderer.started
    pause = pause_samples(renderer.pause_s, sample_rate)
    following = container_encoder(plan, layout, tags, args, parts, pause, done, sample_rate)
    try:
        try:
            parts.dir.mkdir(exist_ok=True)
            manifest.save(plan, done, outputs)
            if following is not None:
                following.start()

            def on_done(index: int, samples: int) -> None:
                done.add(index)
                progress.update(index, samples)
                manifest.save(plan, done, outputs, force=False)
                if following is not None:
                    following.finished(index)
                    following.check()  # the encoder failed (a full disk): stop rendering what it cannot write

            try:
                todo = [i for i in range(len(plan.sentences)) if i not in done]
                jobs = await renderer.render(parts, todo, args.jobs, on_done)
            finally:
                progress.close()
                _save_quietly(manifest, plan, done, outputs)
            assembled = await asyncio.to_thread(following.join) if following is not None else \
                assemble_wav(plan, parts, tracks, pause, args, sample_rate)  # awaited: Ctrl-C interrupts
            ceiling = loudness_notice(plan, args, assembled.gains)
            if ceiling:
                _print_notices(ceiling)
            written = [t.path for t in tracks] + write_cue(plan, layout, tags, assembled.offsets, sample_rate)
            manifest.finish(plan, written, assembly_settings(args, layout, tags))
        finally:
            if following is not None:
                following.stop()  # before the parts may be removed below
    except OSError as err:
        raise output_error(err, manifest, done, layout.out) from None
    except BaseException:
        if not done:
            manifest.remove()  # nothing to resume: a manifest of no sentences would only block the next run
        raise
    end = time.perf_counter()
    wall, e2e = end - progress.t0, end - process_start_perf()
    rendered = progress.samples / sample_rate  # resumed sentences cost no time: they do not count for speed
    return {"audio_s": assembled.total / sample_rate, "wall_s": wall, "xrt": rendered / wall if wall else 0.0,
            "e2e_s": e2e, "e2e_xrt": rendered / e2e if e2e else 0.0, "resumed": resumed, "jobs": jobs,
            "encode_s": assembled.encode_s, "after_last_part_s": assembled.after_last_part_s}


def container_encoder(plan, layout: Layout, tags, args: argparse.Namespace, parts, pause: int, done: set[int],
                      sample_rate: int):
    """M4B, MP3 and Opus: the encoder that follows the rendering (an AssemblyProcess, not started yet), told
    which parts are already finished; None for WAV, written once every part is."""
    from engine.assembly_process import AssemblyProcess

    if layout.suffix == ".wav":
        return None
    return AssemblyProcess(parts=parts, tracks=layout.tracks(plan), pause=pause,
                           writer=ContainerWriter(plan, layout, tags, sample_rate), finished=set(done),
                           chapters=plan.chapter_ranges(), loudness=loudness_target(args), sample_rate=sample_rate)


def assemble_wav(plan, parts, tracks, pause: int, args: argparse.Namespace, sample_rate: int):
    """The WAV(s), once every part is finished, with the chapters' loudness gains measured first."""
    from engine.export_plan import Assembled, assemble

    start = time.perf_counter()
    target = loudness_target(args)
    gains = [target.gain(parts, r, pause, sample_rate) for r in plan.chapter_ranges()] if target else []
    per_sentence = [g.gain for g, r in zip(gains, plan.chapter_ranges()) for _ in r] if gains else None
    offsets, total = assemble(parts, tracks, sample_rate, pause, per_sentence)
    return Assembled(offsets, total, gains, time.perf_counter() - start, time.perf_counter() - start)


def write_cue(plan, layout: Layout, tags, offsets: list[list[int]], sample_rate: int) -> list[Path]:
    """One WAV of several chapters: its CUE sheet, while the sheet's minutes can mark them (else a notice and
    none). The files written."""
    from engine.export_plan import cue_fits, cue_sheet

    if not layout.has_cue(plan):
        return []
    marks = [(plan.chapter_title(r), offsets[0][r.start]) for r in plan.chapter_ranges()]
    if not cue_fits(marks, sample_rate):
        layout.cue.unlink(missing_ok=True)  # an earlier export's sheet would mark another book
        _print_notices(f"no {layout.cue.name}: the last chapter starts after 99:59, which a CUE sheet's minutes "
                       f"cannot mark in many players; export to .m4b, .mp3 or .opus for chapters in the file, or "
                       f"pass --split-chapters")
        return []
    write_text_atomic(layout.cue, cue_sheet(tags.title, layout.out.name, marks, sample_rate))
    return [layout.cue]


class ContainerWriter:
    """FollowingAssembly's writer for M4B, MP3 and Opus (voiceapp.audio.containers): one file with a chapter mark per
    chapter, or (split) one file per chapter tagged with its title, the book's as album, and its number."""

    def __init__(self, plan, layout: Layout, tags, sample_rate: int) -> None:
        from voiceapp.audio.containers import CONTAINERS

        self.plan, self.layout, self.tags, self.sample_rate = plan, layout, tags, sample_rate
        self.container = CONTAINERS[layout.suffix]
        self.numbers = {t.path: n for n, t in enumerate(layout.tracks(plan), 1)}

    def write(self, track, file, pcm, starts: list[int], length: int) -> None:
        from voiceapp.audio.containers import encode

        marks, tags = self._marks_and_tags(track, starts, length)
        encode(file, track.path, self.container, self.sample_rate, pcm, marks, tags)

    def encode(self, track, pcm, scratch) -> None:
        from voiceapp.audio.containers import encode_packets

        encode_packets(scratch, track.path, self.container, self.sample_rate, pcm)

    def finish(self, track, scratch, file, starts: list[int], length: int) -> None:
        from voiceapp.audio.containers import mux

        marks, tags = self._marks_and_tags(track, starts, length)
        mux(file, track.path, self.container, self.sample_rate, scratch, marks, tags)

    def _marks_and_tags(self, track, starts: list[int], length: int):
        from voiceapp.audio.containers import Mark

        plan = self.plan
        if self.layout.split:
            return [], dataclasses.replace(self.tags, title=plan.chapter_title(track.sentences),
                                           album=self.tags.title, track=self.numbers[track.path])
        ranges = plan.chapter_ranges()
        bounds = [starts[r.start - track.sentences.start] for r in ranges] + [length]
        return [Mark(plan.chapter_title(r), a, b) for r, a, b in zip(ranges, bounds, bounds[1:])], self.tags


def loudness_target(args: argparse.Namespace):
    """--loudness (LUFS) or --normalize-loudness (RMS dBFS) as a LoudnessTarget; None without either."""
    from engine.export_plan import LoudnessTarget

    if args.loudness is not None:
        return LoudnessTarget(args.loudness, lufs=True)
    if args.normalize_loudness is not None:
        return LoudnessTarget(args.normalize_loudness, lufs=False)
    return None


def loudness_notice(plan, args: argparse.Namespace, gains: list) -> str | None:
    """The line naming chapters the peak ceiling holds below the target (ceiling_notice), or None."""
    from engine.export_plan import ceiling_notice

    if not gains:
        return None
    titles = [plan.chapter_title(r) for r in plan.chapter_ranges()]
    if args.loudness is not None:
        return ceiling_notice(gains, titles, args.loudness, option="--loudness", unit="LUFS")
    return ceiling_notice(gains, titles, args.normalize_loudness)


def interrupted(layout: Layout, total: int):
    """Ctrl-C: how much is kept, and how to go on."""
    from engine.errors import Cancelled
    from engine.export_plan import Parts

    if not layout.manifest.exists():
        return Cancelled("interrupted")
    kept = Parts(layout.parts).written()
    return Cancelled(f"interrupted; {kept} of {total} sentences are finished and kept in {layout.parts}: rerun with "
                     f"--resume to continue")


def _save_quietly(manifest, plan, done: set[int], outputs: list[str]) -> None:
    try:
        manifest.save(plan, done, outputs)
    except OSError:
        pass  # the parts on disk are the record; a full disk must not hide the original error


def output_error(err: OSError, manifest, done: set[int], out: Path):
    """One line for a failed write; finished sentences are kept for --resume (nothing is left if there are none)."""
    from engine.errors import OutputError

    cause = "disk full" if err.errno == errno.ENOSPC else (err.strerror or str(err))
    if not done:
        manifest.remove()
        return OutputError(f"{cause} while writing {out}; nothing was written")
    return OutputError(f"{cause} while writing {out}; the {len(done)} finished sentences are kept in "
                       f"{manifest.parts.dir}: free some space and rerun with --resume")


def write_text_atomic(path: Path, text: str) -> None:
    from engine.atomic import writing

    with writing(path, mode="w") as f:
        f.write(text)


PROGRESS_LINE_EVERY_S = 30.0
"""Off a terminal (a log file, nohup), one progress line this often."""


class Progress:
    """Progress, ETA and x-real-time on stderr: a tqdm bar on a terminal ("bar"), else a line every
    PROGRESS_LINE_EVERY_S ("lines"), or nothing (None). Counts the audio rendered either way.

    Progress is measured in characters of text, not sentences: a sentence's render time follows its length, and a
    book's sentences range from a two-word title to a long period, so a count of sentences swings the ETA with
    every short one. The ETA is this run's characters per second over the whole run (resumed sentences cost it
    nothing) applied to the characters left."""

    def __init__(self, chars: list[int], done: set[int], sample_rate: int, show: str | None,
                 clock=time.perf_counter) -> None:
        self.chars, self.sample_rate, self.samples, self.clock = chars, sample_rate, 0, clock
        self.total, self.done, self.initial = len(chars), len(done), len(done)
        self.total_chars = max(sum(chars), 1)
        self.done_chars = self.initial_chars = sum(chars[i] for i in done)
        self.t0 = self._last_line = clock()
        self.lines = show == "lines"
        self.bar = None
        if show == "bar":
            from tqdm import tqdm

            # smoothing=0: tqdm's own rate and ETA are then the whole run's average too
            self.bar = tqdm(total=self.total_chars, initial=self.done_chars, unit="char", unit_scale=True,
                            smoothing=0, file=sys.stderr, dynamic_ncols=True)

    def xrt(self) -> float:
        return self.samples / self.sample_rate / max(self.clock() - self.t0, 1e-9)

    def update(self, index: int, samples: int) -> None:
        """Sentence `index` is finished: `samples` of audio."""
        self.samples += samples
        self.done += 1
        self.done_chars += self.chars[index]
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.done}/{self.total} sentences, {self.xrt():.1f}x real time",
                                     refresh=False)
            self.bar.update(self.chars[index])
        elif self.lines and self.clock() - self._last_line >= PROGRESS_LINE_EVERY_S:
            self._last_line = self.clock()
            print(f"voicectl: {self.line()}", file=sys.stderr, flush=True)

    def eta_s(self) -> float | None:
        """Seconds left at this run's average characters per second; None before its first sentence."""
        rendered = self.done_chars - self.initial_chars
        if rendered <= 0:
            return None
        return (self.clock() - self.t0) / rendered * (self.total_chars - self.done_chars)

    def line(self) -> str:
        """"412/1800 sentences, 23% of the text, 31.0x real time, ETA 12m05s"."""
        eta = self.eta_s()
        return (f"{self.done}/{self.total} sentences, {100 * self.done_chars // self.total_chars}% of the text, "
                f"{self.xrt():.1f}x real time, ETA {'-' if eta is None else _duration(eta)}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _print_notices(event) -> None:
    from engine.events import Notice

    if isinstance(event, str):
        print(f"voicectl: {event}", file=sys.stderr)
    elif isinstance(event, Notice):
        print(f"voicectl: {event.message}", file=sys.stderr)
