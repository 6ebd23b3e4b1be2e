"""Provides `voicectl export-many DIR_OR_LIST -o OUTDIR`: every book of a folder (its .txt, .md and .epub files) or of
a list (a text file naming one book a line) exported to OUTDIR/NAME.FORMAT, each exactly as `voicectl export` would
(its own manifest, parts and --resume), on one engine loaded once, or with --ray on the cluster in one dataset
(voiceapp.cluster.export: the engines load once for all the books)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

BOOK_SUFFIXES = (".txt", ".md", ".epub")
"""What a folder's books are."""
FORMATS = ("m4b", "mp3", "opus", "wav")


def add_parser(sub) -> None:
    from voiceapp.cli.export import add_shared_args

    p = sub.add_parser("export-many", help="render every book of a folder (or a list of books) to audiobook files "
                                           "in OUTDIR; resumable")
    p.add_argument("input", metavar="DIR_OR_LIST",
                   help="a folder (its .txt, .md and .epub files) or a text file naming one book a line (relative "
                        "to the list's folder; blank lines and # comments skipped)")
    p.add_argument("-o", "--out", required=True, metavar="OUTDIR", help="where NAME.FORMAT goes for each book NAME")
    p.add_argument("--format", choices=FORMATS, default="m4b", help="the files' format (default m4b)")
    p.add_argument("--jobs", type=int, help="sentences rendered at once (as `voicectl export`)")
    p.add_argument("--resume", action="store_true", help="continue interrupted exports; finished books are skipped")
    p.add_argument("--restart", action="store_true", help="discard interrupted exports and start over")
    add_shared_args(p, "print a JSON summary (one object per book) on stdout")
    p.set_defaults(run=run)


def books_of(source: str) -> list[Path]:
    """The books a folder holds (sorted by name) or a list names; one line where there are none or one is
    missing."""
    from engine.errors import InputError

    path = Path(source)
    if path.is_dir():
        books = sorted(p for p in path.iterdir() if p.suffix.lower() in BOOK_SUFFIXES and p.is_file())
        if not books:
            raise InputError(f"{source} holds no books ({', '.join(BOOK_SUFFIXES)} files)")
        return books
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{source}: not a folder nor a readable list of books ({err})") from None
    books = [path.parent / line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    missing = [str(b) for b in books if not b.is_file()]
    if missing:
        raise InputError(f"{source} names {len(missing)} books that are not there, first {missing[0]}")
    if not books:
        raise InputError(f"{source} names no books")
    return books


def book_args(args: argparse.Namespace, book: Path, outdir: Path) -> argparse.Namespace:
    """The options `voicectl export BOOK -o OUTDIR/NAME.FORMAT` would have: export's defaults, then ours."""
    from voiceapp.cli import build_parser

    defaults = vars(build_parser("export").parse_args(["export", "-", "-o", "x.wav"]))
    return argparse.Namespace(**{**defaults, **vars(args), "command": "export", "input": str(book),
                                 "out": str(outdir / f"{book.stem}.{args.format}")})


def run(args: argparse.Namespace) -> int:
    from engine.errors import InputError
    from voiceapp.cli import export as ex

    if args.resume and args.restart:
        raise InputError("--resume and --restart exclude each other")
    ex.check_ray_options(args)
    books = books_of(args.input)
    stems = [b.stem for b in books]
    if len(set(stems)) < len(stems):
        twice = next(s for s in stems if stems.count(s) > 1)
        raise InputError(f"two books would both be written to {twice}.{args.format}; rename one")
    outdir = Path(args.out)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot make {outdir}: {err.strerror or err}") from None
    show = None if args.no_progress else "bar" if sys.stderr.isatty() else "lines"
    with contextlib.ExitStack() as locks:
        jobs = []
        for book in books:
            options = book_args(args, book, outdir)
            layout = ex.Layout.from_args(options)
            plan = ex.make_plan(options)
            ex.refuse_overwriting_input(options.input, layout, plan)
            ex.refuse_read_only_outputs(layout, plan)
            tags = ex.book_tags(options, plan.book, layout)
            locks.enter_context(ex.lock_output(layout))
            if not args.restart and ex.already_complete(plan, layout, options, tags):
                continue
            jobs.append(ex.book_job(plan, layout, options, tags))
        if not jobs:
            return 0
        try:
            results = asyncio.run(ex.export_books(jobs, args, show))
        except KeyboardInterrupt:
            raise ex.interrupted(jobs[0].layout, len(jobs[0].plan.sentences)) from None
    for job, stats in zip(jobs, results):
        ex.report(job.plan, job.layout, stats)
    if args.json:
        print(json.dumps([{"input": job.args.input, **stats, "sentences": len(job.plan.sentences)}
                          for job, stats in zip(jobs, results)]))
    return 0
