"""Issue 38's ETA target on a recorded run: at 10, 30, 50 and 80% of the text, export's ETA is within 20% of the
time that was really left. The run (tests/data/eta-run-scarlet.json, written by `python -m lab.eta_record`) is a
real export of A Study in Scarlet: each sentence's index, characters and the second it finished, replayed here
through `Progress` on its own clock."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from voiceapp.cli.export import Progress

RUN = Path(__file__).resolve().parents[1] / "data" / "eta-run-scarlet.json"
MARKS = (0.10, 0.30, 0.50, 0.80)


def replay(finished: list[list[float]]) -> list[tuple[float, float, float, float]]:
    """(share of the text done, ETA, time really left, ETA a count of sentences would give) after each sentence."""
    chars = [0] * len(finished)
    for index, n, _ in finished:
        chars[int(index)] = int(n)
    now = [0.0]
    progress = Progress(chars, set(), 16000, None, clock=lambda: now[0])
    end = finished[-1][2]
    out = []
    for done, (index, _, t) in enumerate(finished, 1):
        now[0] = t
        progress.update(int(index), 0)
        eta = progress.eta_s()
        assert eta is not None
        out.append((progress.done_chars / progress.total_chars, eta, end - t, t / done * (len(chars) - done)))
    return out


@pytest.fixture(scope="module")
def run() -> dict:
    return json.loads(RUN.read_text())


def test_the_recorded_run_is_the_whole_novel_once(run) -> None:
    indices = sorted(int(i) for i, _, _ in run["finished"])
    assert indices == list(range(run["sentences"])) and run["sentences"] > 500
    times = [t for _, _, t in run["finished"]]
    assert times == sorted(times) and times[-1] > 10 * times[0] > 0


def test_the_eta_of_the_recorded_run_is_within_a_fifth_of_the_time_left(run) -> None:
    steps = replay(run["finished"])
    errors = {}
    for mark in MARKS:
        share, eta, left, _ = next(s for s in steps if s[0] >= mark)
        errors[mark] = abs(eta - left) / left
    assert max(errors.values()) <= 0.2, errors
