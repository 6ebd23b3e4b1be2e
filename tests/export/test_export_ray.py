"""`voicectl export --ray` on a local Ray cluster, two CPU workers of the tiny checkpoint's real engine: the book is
byte for byte the one-process export, also with a worker killed mid-book, and an export killed mid-book resumes
with --ray to the same bytes; without Ray, --ray is one line; a worker has two batches under way at once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.cli_helpers import ROOT, descendants, one_line_error, voicectl
from tests.export.test_cli_export_book import ok, start_export

pytest.importorskip("ray", reason="the Ray tests need the extra: pip install 'voiceapp[ray]'")
# a local Ray cluster starts in each (seconds on 2 cores); one cluster at a time under xdist (the "ray" group):
# two would share its session folder and contend for the two cores while starting
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

TEXT = "Chapter 1\n\n" + " ".join(f"Sentence number {i} is right here." for i in range(4)) + \
       "\n\nChapter 2\n\n" + " ".join(f"And sentence {i} follows it." for i in range(4)) + "\n"


@pytest.fixture(scope="module")
def clean(tiny_model, tmp_path_factory):
    """The one-process export of TEXT on the tiny checkpoint (one torch thread, as each Ray worker has)."""
    d = tmp_path_factory.mktemp("clean")
    src = d / "book.txt"
    src.write_text(TEXT)
    engine = ["--model", str(tiny_model), "--backend", "torch", "--max-tokens", "120", "--threads", "1"]
    ok(voicectl("export", str(src), "-o", str(d / "out.wav"), *engine, "--no-progress"))
    return src, engine, (d / "out.wav").read_bytes(), (d / "out.cue").read_text()


def test_an_export_on_ray_is_byte_identical_and_resumes(clean, tmp_path):
    src, engine, want_wav, want_cue = clean
    out, parts = tmp_path / "out.wav", tmp_path / "out.wav.parts"
    # a worker killed mid-book: Ray Data starts another and renders the batch again, or (on a loaded machine, CI's
    # once) gives the run up; either way the book comes out the same, resumed in the second case (issue 39)
    proc = start_export(["export", str(src), "-o", str(out), *engine, "--ray", "--ray-workers", "2", "--jobs", "1",
                         "--no-progress"], parts, at_least=1)
    workers = [pid for pid, command in descendants(proc.pid) if "SentenceRenderer" in command]
    finished = len(list(parts.glob("*.part")))
    assert len(workers) == 2 and finished < 10, (workers, finished)  # 10 sentences: the kill is mid-book
    os.kill(workers[0], signal.SIGKILL)
    err = proc.stderr.read().decode()
    assert err.count("the Ray cluster has no GPUs: 2 CPU workers render the sentences") == 1
    if proc.wait(120) != 0:
        assert not out.exists(), err
        ok(voicectl("export", str(src), "-o", str(out), *engine, "--ray", "--ray-workers", "2", "--resume",
                    "--no-progress"))
    assert out.read_bytes() == want_wav and (tmp_path / "out.cue").read_text() == want_cue

    resumed, parts = tmp_path / "resumed.wav", tmp_path / "resumed.wav.parts"
    proc = start_export(["export", str(src), "-o", str(resumed), *engine, "--jobs", "1", "--no-progress"], parts,
                        at_least=2, start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.stderr.close()
    assert proc.wait(30) == -9 and not resumed.exists()
    finished = len(list(parts.glob("*.part")))
    assert 2 <= finished < 8
    err = ok(voicectl("export", str(src), "-o", str(resumed), *engine, "--ray", "--ray-workers", "2", "--resume",
                      "--no-progress"))
    assert f"{finished} were already done" in err
    assert resumed.read_bytes() == want_wav


def test_ray_workers_without_ray_is_one_line(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("One sentence.")
    proc = voicectl("export", str(src), "-o", str(tmp_path / "o.wav"), "--backend", "fake", "--ray-workers", "2")
    assert proc.returncode == 2 and "--ray-workers is an option of --ray" in one_line_error(proc)
    blocker = tmp_path / "noray"  # Ray not installed: `import ray` fails
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('no ray here')\n")
    proc = voicectl("export", str(src), "-o", str(tmp_path / "o.wav"), "--backend", "fake", "--ray",
                    env={"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 2 and "pip install 'voiceapp[ray]'" in one_line_error(proc)
    assert not (tmp_path / "o.wav").exists()


def test_export_many_on_ray_gives_each_book_its_own_bytes(tmp_path):
    from tests.export.test_export_many import BOOKS, FAKE, write_books

    books = write_books(tmp_path / "books")
    for name in BOOKS:
        ok(voicectl("export", str(books / name), "-o", str(tmp_path / f"{name}.wav"), *FAKE))
    out = tmp_path / "out"
    ok(voicectl("export-many", str(books), "-o", str(out), "--format", "wav", *FAKE, "--ray", "--ray-workers", "2",
                "--jobs", "2"))
    for name in BOOKS:  # each sentence went to its own book's parts
        assert (out / f"{name.split('.')[0]}.wav").read_bytes() == (tmp_path / f"{name}.wav").read_bytes()


def test_a_worker_renders_its_next_batch_while_this_one_ends(tmp_path):
    """One CPU worker, two batches of three, two sentences at once (tests/export/ray_overlap.py): Ray Data has both
    calls in the worker at once, and a sentence of one batch starts on the engine before the other batch's last
    one ends; every sentence's samples are those of the batches rendered one after another in this process."""
    import hashlib

    import numpy as np

    from engine.factory import EngineConfig
    from tests.export.test_export_plan import make_plan
    from voiceapp.cli.export import export_config
    from voiceapp.cluster.export import SentenceRenderer

    proc = subprocess.run([sys.executable, "-m", "tests.export.ray_overlap"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.splitlines()[-1])
    assert [r["index"] for r in rows] == list(range(6))
    first, second = sorted([rows[:3], rows[3:]], key=lambda batch: min(r["start"] for r in batch))
    assert min(r["start"] for r in second) < max(r["end"] for r in first), rows

    alone = SentenceRenderer([make_plan()], export_config(EngineConfig(backend="fake")), jobs=2)
    try:
        samples = [s for keys in ([0, 1, 2], [3, 4, 5])
                   for s in alone({"book": np.zeros(3, int), "index": np.array(keys)})["samples"]]
    finally:
        alone.close()
    assert [r["sha"] for r in rows] == [hashlib.sha256(s).hexdigest() for s in samples]
