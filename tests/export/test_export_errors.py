"""`voicectl export` in-process: write failures injected (no root needed, unlike the tmpfs test): a full disk
while rendering or while assembling is one clear line, the finished sentences are kept, and --resume completes
with the same bytes as an export that never failed. And the progress report (ETA, x real time)."""
import errno
import os
import wave
from pathlib import Path

import pytest

import engine.export_plan as export_plan
from voiceapp.cli import main

TEXT = "One sentence here. Another one there. A third one now. And a fourth. Then the fifth. The last."


def export(capsys, *args):
    code = main(["export", *args, "--backend", "fake", "--jobs", "2", "--no-progress"])
    return code, capsys.readouterr().err.strip()


def full_disk(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def clean(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text(TEXT)
    code, err = export(capsys, str(src), "-o", str(tmp_path / "want.wav"))
    assert code == 0, err
    return src, (tmp_path / "want.wav").read_bytes()


def test_disk_full_while_rendering_keeps_the_finished_sentences(clean, tmp_path, capsys, monkeypatch):
    src, want = clean
    out = tmp_path / "o.wav"
    write = export_plan.Parts.write
    calls = []

    def fails_on_the_fourth(self, index, samples):
        calls.append(index)
        if len(calls) >= 4:
            full_disk()
        write(self, index, samples)

    monkeypatch.setattr(export_plan.Parts, "write", fails_on_the_fourth)
    code, err = export(capsys, str(src), "-o", str(out))
    assert code == 1 and "\n" not in err, err
    assert err == (f"voicectl: disk full while writing {out}; the 3 finished sentences are kept in "
                   f"{tmp_path / 'o.wav.parts'}: free some space and rerun with --resume")
    assert not out.exists() and len(list((tmp_path / "o.wav.parts").glob("*.part"))) == 3
    monkeypatch.undo()
    code, err = export(capsys, str(src), "-o", str(out), "--resume")
    assert code == 0 and "3 were already done" in err, err
    assert out.read_bytes() == want


def test_disk_full_while_assembling_keeps_every_sentence(clean, tmp_path, capsys, monkeypatch):
    src, want = clean
    out = tmp_path / "o.wav"
    monkeypatch.setattr(wave.Wave_write, "writeframes", full_disk)
    code, err = export(capsys, str(src), "-o", str(out))
    assert code == 1 and "disk full" in err and "the 6 finished sentences are kept" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "o.wav.manifest.json", "o.wav.parts", "want.wav",
                                                         "want.wav.manifest.json"]
    monkeypatch.undo()
    code, err = export(capsys, str(src), "-o", str(out), "--resume")
    assert code == 0 and "6 were already done" in err, err
    assert out.read_bytes() == want


def test_disk_full_before_any_sentence_leaves_nothing(clean, tmp_path, capsys, monkeypatch):
    src, _ = clean
    monkeypatch.setattr(export_plan.Parts, "write", full_disk)
    code, err = export(capsys, str(src), "-o", str(tmp_path / "o.wav"))
    assert code == 1 and err == f"voicectl: disk full while writing {tmp_path / 'o.wav'}; nothing was written", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "want.wav", "want.wav.manifest.json"]


def test_progress_reports_eta_and_speed_from_this_runs_pace(capsys):
    from voiceapp.cli import export as cmd_export

    now = [100.0]
    chars = [10] * 20 + [40] * 10 + [10] * 60  # 1,200 characters; the first 20 sentences were resumed
    progress = cmd_export.Progress(chars, set(range(20)), sample_rate=16000, show="lines", clock=lambda: now[0])
    assert progress.line() == "20/90 sentences, 16% of the text, 0.0x real time, ETA -"
    for i in range(20, 30):  # 10 sentences of 40 characters (3 s of audio each) in 10 s: 40 characters a second
        now[0] += 1.0
        progress.update(i, 3 * 16000)
    assert progress.line() == "30/90 sentences, 50% of the text, 3.0x real time, ETA 0m15s"  # 600 left
    assert capsys.readouterr().err == ""  # off a terminal: a line every PROGRESS_LINE_EVERY_S only
    now[0] += cmd_export.PROGRESS_LINE_EVERY_S
    progress.update(30, 3 * 16000)
    assert capsys.readouterr().err.startswith("voicectl: 31/90 sentences, 50% of the text, ")


def simulated_book(seed: int = 3) -> list[int]:
    """Sentence lengths in characters: each chapter opens with short lines (title, epigraph, quick dialogue) and
    goes on with sentences from a few words to the 280 characters a sentence is split at; the early chapters talk in short lines, the later
    ones narrate in long sentences."""
    import random

    rng = random.Random(seed)
    lengths = []
    for chapter in range(12):
        lengths += [rng.randint(8, 30) for _ in range(rng.randint(200, 300) - 15 * chapter)]
        lengths += [min(int(rng.lognormvariate(3.5 + 0.15 * chapter, 0.9)) + 5, 280) for _ in range(300)]
    return lengths


def simulate(chars: list[int], jobs: int, chars_per_s: float, resumed: int):
    """Render `chars` after the first `resumed` sentences with `jobs` at once, each sentence taking its length over
    `chars_per_s`: yields (share of the text done, the Progress's ETA, the true time left) after each sentence."""
    import heapq

    from voiceapp.cli import export as cmd_export

    now = [0.0]
    progress = cmd_export.Progress(chars, set(range(resumed)), 16000, None, clock=lambda: now[0])
    todo = iter(range(resumed, len(chars)))
    running = [(chars[i] / chars_per_s, i) for i in [next(todo) for _ in range(jobs)]]
    heapq.heapify(running)
    finished = []
    while running:
        now[0], i = heapq.heappop(running)
        progress.update(i, 0)
        finished.append((progress.done_chars / progress.total_chars, progress.eta_s(), now[0],
                         progress.done, progress.initial))
        nxt = next(todo, None)
        if nxt is not None:
            heapq.heappush(running, (now[0] + chars[nxt] / chars_per_s, nxt))
    end = now[0]
    for share, eta, t, done, initial in finished:
        yield share, eta, end - t, t / (done - initial) * (len(chars) - done)


@pytest.mark.parametrize("jobs,resumed", [(1, 0), (8, 0), (8, 150)])
def test_eta_is_within_a_fifth_when_speed_per_character_is_constant(jobs, resumed):
    """At 10, 30, 50 and 80% of the text the ETA is within 20% of the time really left, although sentence lengths
    vary from 8 to hundreds of characters; a count of sentences misses by more on the same run."""
    chars = simulated_book()
    steps = list(simulate(chars, jobs, chars_per_s=200.0, resumed=resumed))
    by_sentences = []
    for mark in (0.10, 0.30, 0.50, 0.80):
        share, eta, left, sentence_eta = next(s for s in steps if s[0] >= mark)
        assert abs(eta - left) <= 0.2 * left, (mark, eta, left)
        by_sentences.append(abs(sentence_eta - left) / left)
    assert max(by_sentences) > 0.2, by_sentences  # the book is one where counting sentences would mislead


def test_every_temp_file_is_renamed_within_its_own_directory(tmp_path, capsys, monkeypatch):
    """So that no os.replace crosses filesystems, wherever the current directory and $TMPDIR are."""
    renames = []
    replace = os.replace

    def recording(src, dst):
        renames.append((Path(src).name, Path(os.path.abspath(src)).parent, Path(os.path.abspath(dst)).parent))
        replace(src, dst)

    (tmp_path / "in.txt").write_text("Chapter 1\n\nOne here. Two there.\n\nChapter 2\n\nThree now. The last.\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(os, "replace", recording)
    for out in ("../out/o.wav", "../out/book/"):
        code, err = export(capsys, "../in.txt", "-o", out)
        assert code == 0, err
    names = {name for name, _, _ in renames}
    assert {".o.wav.partial", ".o.cue.tmp", ".o.wav.manifest.json.tmp", ".000000.part.tmp",
            ".01 - Chapter 1.wav.partial", ".export.manifest.json.tmp"} <= names, names
    assert all(src == dst for _, src, dst in renames), renames
    assert os.listdir(tmp_path / "elsewhere") == []
