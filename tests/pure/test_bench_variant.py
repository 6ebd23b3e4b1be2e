"""`voicectl bench`'s variants run on the same engine with their settings swapped in (the interpreter's switch
interval, the lane's bursts, the lane on or off) and restored afterwards, even when a level fails."""
from __future__ import annotations

import asyncio
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from engine import bench
from engine.bench import BenchOptions, Variant, run
from engine.windowing import WindowSchedule


class _Synth:
    """The Synthesizer's schedule API, as the bench sees it."""

    def __init__(self) -> None:
        self.schedule = WindowSchedule()

    @contextmanager
    def scheduled(self, schedule):
        before, self.schedule = self.schedule, schedule
        try:
            yield ()
        finally:
            self.schedule = before


def _engine():
    lane = SimpleNamespace(bursts=((8, 2), (None, 8)))
    router = SimpleNamespace(lane=lane, enabled=True)
    return _Synth(), SimpleNamespace(inner=router), lane, router


def _run(variant: Variant, monkeypatch, fail: bool = False) -> list[tuple]:
    synth, gen, lane, router = _engine()
    seen = []

    async def level(synth_, gen_, n, **_):
        seen.append((n, sys.getswitchinterval(), lane.bursts, router.enabled, synth_.schedule))
        if fail:
            raise RuntimeError("level failed")
        return bench.LevelResult(n, *([1.0] * 15))

    monkeypatch.setattr(run, "measure_level", level)
    before = sys.getswitchinterval()
    coro = run._measure_variant(synth, gen, variant, (1, 8), BenchOptions(model=None), text="x", voice="v",
                                  log=lambda _: None, name="t")
    if fail:
        with pytest.raises(RuntimeError):
            asyncio.run(coro)
    else:
        out = asyncio.run(coro)
        assert [lv["streams"] for lv in out["levels"]] == [1, 8] and out["burst"] == variant.burst
    assert sys.getswitchinterval() == before and lane.bursts == ((8, 2), (None, 8)) and router.enabled
    assert synth.schedule == WindowSchedule() and all(s[4] == variant.schedule for s in seen)
    return seen


def test_a_variant_swaps_the_switch_interval_and_bursts_in_and_back(monkeypatch) -> None:
    seen = _run(Variant(WindowSchedule(first_new=8), switch_s=0.0002, burst=4), monkeypatch)
    assert [s for _, s, _, _, _ in seen] == [pytest.approx(0.0002)] * 2
    assert all(b == ((8, 4), (None, 8)) for _, _, b, _, _ in seen)


def test_a_plain_variant_changes_nothing_and_a_failing_one_restores(monkeypatch) -> None:
    default = sys.getswitchinterval()
    assert all(s == default and b == ((8, 2), (None, 8)) and on for _, s, b, on, _ in _run(Variant(), monkeypatch))
    assert not _run(Variant(lane=False, switch_s=0.001), monkeypatch, fail=True)[0][3]
