"""Fixtures for the TUI tests: the fake engine, an in-memory sink with a simulated real-time consumer."""
from __future__ import annotations

import pytest
from memory_sink import MemorySink

from voiceapp.tui.bridge import TuiOptions
from tui_helpers import RecordingApp, fake_options


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


