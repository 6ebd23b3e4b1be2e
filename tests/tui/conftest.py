"""Fixtures for the TUI tests: the fake engine, an in-memory sink with a simulated real-time consumer."""
from __future__ import annotations

import functools

import pytest
import textual.app
import textual.pilot
from memory_sink import MemorySink

from voiceapp.tui.bridge import TuiOptions
from tui_helpers import RecordingApp, fake_options


IDLE_WAIT_S = 0.05
"""Longest wait of Pilot's "is the process idle" check per call (textual's default: 1 s)."""


@pytest.fixture(autouse=True)
def short_idle_waits(monkeypatch):
    """Pilot.press waits, twice per key, until the process uses under half a core, for at most 1 s. A playing app
    re-renders its metrics and the sink's thread consumes audio: on a slow 2-core machine (CI's kind) that is
    about half a core, so each key took ~2 s and whole utterances (1.7 s at the test sink's speed) played out
    before a stop or skip key landed. Every test waits for the state it needs itself (`wait_until`); Pilot's own
    wait for messages to be handled (`_wait_for_screen`) is untouched."""
    for module in (textual.app, textual.pilot):
        original = module.wait_for_idle
        monkeypatch.setattr(module, "wait_for_idle", functools.partial(original, max_sleep=IDLE_WAIT_S))


@pytest.fixture
def sink():
    """Plays at 4x real time: fill and underrun numbers move, tests stay short."""
    s = MemorySink(speed=4.0)
    yield s
    s.close()


@pytest.fixture
def make_app(sink):
    def make(options: TuiOptions | None = None, **kw) -> RecordingApp:
        return RecordingApp(options or fake_options(**kw), sink=sink)
    return make


