"""The export check: does `voicectl export` give the same bytes in every process?

Fresh `voicectl export` processes render one generated book, as a user runs them: a clean export (default
--jobs); a second with other --jobs, killed (SIGKILL, whole process group) once a quarter of its sentences are
finished, then resumed with default --jobs; a third rendering the sentences in reverse order with yet other --jobs.
The WAVs are compared byte for byte (the generated book has one chapter: no CUE sheet). Each process is timed from launch to its first finished
sentence and to its exit, and reports its own render speed, so the same runs give the export's speed end to end
(start-up included) and while rendering. The report's keys are docs/benchmarks/export.json's; the summary goes to
stdout, the report to --json, and the exit status is non-zero when the exports differ. Run from the repository root:

    python -m lab.export_check --synthetic tiny --export-sentences 8 --json $OUT/export.json
    python -m lab.export_check --model $MODEL --json $OUT/export.json --timeout 240
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from lab import lab_cli
from lab.startup_cases import Bench, export_run, write_book
from voiceapp.cmd_bench import checkpoint_for, command_line, log, write_json

PROG = "python -m lab.export_check"
SENTENCES = 800
"""--export-sentences' default book: ~9,000 words, an hour read aloud."""
TIMEOUT_S = 900.0
"""--timeout's default: a first run on a fresh machine compiles its kernels."""

OTHER_JOBS = (16, 50)
"""--jobs of the killed export and of the reversed one: both unlike the default (the lane's rows and some)."""
KILL_SHARE = 0.25
"""The killed export dies once this share of its sentences is on disk."""


def export_check(bench: Bench, book: Path) -> dict:
    """The three exports (four processes) and their comparison: the report the module docstring names."""
    write_book(book, bench.export_sentences)
    outs = {name: bench.work / f"{name}.wav" for name in ("clean", "resumed", "reversed")}
    runs = [export_run(bench, book, outs["clean"], name="clean"),
            export_run(bench, book, outs["resumed"], "--jobs", str(OTHER_JOBS[0]), name="killed",
                       kill_at=max(1, int(bench.export_sentences * KILL_SHARE))),
            export_run(bench, book, outs["resumed"], "--resume", name="resumed"),
            export_run(bench, book, outs["reversed"], "--jobs", str(OTHER_JOBS[1]), name="reversed", reverse=True)]
    clean = runs[0]
    comparisons = {name: compare(outs["clean"], outs[name]) for name in ("resumed", "reversed")}
    audio_s = clean.stats["audio_s"]
    return {"resume_identical": all(c["identical"] for c in comparisons.values()),
            "processes_compared": len(runs), "sentences": bench.export_sentences, "audio_s": audio_s,
            "render_xrt": clean.stats["xrt"], "e2e_xrt": audio_s / clean.exit_s, "e2e_s": clean.exit_s,
            "export_first_sentence_s": clean.first_sentence_s, "comparisons": comparisons,
            "runs": [asdict(r) for r in runs]}


def compare(a: Path, b: Path) -> dict:
    """Whether two WAVs are the same bytes; where they are not, how many samples differ and where the first is."""
    da, db = a.read_bytes(), b.read_bytes()
    result = {"identical": da == db, "sha256": [hashlib.sha256(da).hexdigest(), hashlib.sha256(db).hexdigest()]}
    if da != db:
        import soundfile as sf

        xa, rate = sf.read(str(a), dtype="int16")
        xb, _ = sf.read(str(b), dtype="int16")
        n = min(len(xa), len(xb))
        diff = np.flatnonzero(xa[:n] != xb[:n])
        result.update(samples=[len(xa), len(xb)], differing=int(diff.size),
                      first_difference_s=float(diff[0] / rate) if diff.size else None)
    return result


def export_speed(model: Path, sentences: int, timeout_s: float, log) -> dict:
    """One fresh `voicectl export` of a generated book of `sentences` sentences: its --json summary (render speed
    `xrt`, and `e2e_xrt` from launch), launch to the first finished sentence and to exit. The warm benchmark's export
    figure: the path users run, not one of the benchmark's own."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="voiceapp-export-") as work:
        bench = Bench(model, Path(work), 1, timeout_s, sentences, log)
        book = write_book(Path(work) / "book.txt", sentences)
        run = export_run(bench, book, Path(work) / "book.wav")
    return {**run.stats, "first_sentence_s": run.first_sentence_s, "exit_s": run.exit_s}


def build_parser() -> argparse.ArgumentParser:
    p = lab_cli.parser(PROG, "fresh `voicectl export` processes of one generated book (clean; other --jobs, killed "
                             "and resumed; another order) compared byte for byte, with their speed end to end")
    p.add_argument("--export-sentences", type=int, default=SENTENCES,
                   help=f"sentences in the book (default {SENTENCES}: a text read in about an hour)")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"longest any one process may take (default {TIMEOUT_S:g})")
    return p


def run(args: argparse.Namespace) -> int:
    """export_check on fresh processes; the summary on stdout, the report to --json. CaseFailed when the exports
    differ."""
    import tempfile

    from engine.errors import InputError
    from lab.startup_cases import CaseFailed, describe_device, git_commit

    if args.export_sentences < 4:
        raise InputError("--export-sentences must be at least 4")
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, log) as (model, checkpoint), \
            tempfile.TemporaryDirectory(prefix="voiceapp-export-check-") as work:
        device, _ = describe_device(args.timeout)
        result = export_check(Bench(model, Path(work), 1, args.timeout, args.export_sentences, log),
                              Path(work) / "book.txt")
    result = {"device": device, "date": started.date().isoformat(), "git": git_commit(),
              "command": command_line(PROG), "model": checkpoint, **result}
    print(f"{device}: {result['processes_compared']} processes, identical: {result['resume_identical']}; "
          f"{result['audio_s']:.0f} s of audio, {result['render_xrt']:.0f}x rendering, {result['e2e_xrt']:.0f}x "
          f"end to end ({result['e2e_s']:.1f} s from launch), first sentence after "
          f"{result['export_first_sentence_s']:.1f} s")
    if args.json:
        write_json(Path(args.json), result)
    if not result["resume_identical"]:
        raise CaseFailed("the exports differ: " + ", ".join(n for n, c in result["comparisons"].items()
                                                            if not c["identical"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    return lab_cli.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
