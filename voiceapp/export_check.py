"""Provides `voicectl bench --export-check`: does `voicectl export` give the same bytes in every process?

Fresh `voicectl export` processes render one generated book, as a user runs them: a clean export (default
--jobs); a second with other --jobs, killed (SIGKILL, whole process group) once a quarter of its sentences are
finished, then resumed with default --jobs; a third rendering the sentences in reverse order with yet other --jobs.
The WAVs are compared byte for byte (the generated book has one chapter: no CUE sheet). Each process is timed from launch to its first finished
sentence and to its exit, and reports its own render speed, so the same runs give the export's speed end to end
(start-up included) and while rendering. The report's keys are docs/benchmarks/export.json's.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

import numpy as np

from voiceapp.startup_cases import Bench, export_run, write_book

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
            export_run(bench, book, outs["reversed"], "--jobs", str(OTHER_JOBS[1]), "--render-order", "reverse",
                       name="reversed")]
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
