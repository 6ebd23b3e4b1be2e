"""Fixtures for the TUI tests: the fake engine, an in-memory sink with a simulated real-time consumer."""
from __future__ import annotations

import time
from typing import Callable

import pytest
from memory_sink import MemorySink

from engine.factory import EngineConfig
from voiceapp.tui.app import VoiceApp
from voiceapp.tui.bridge import TuiOptions

SIZE = (100, 30)


def fake_options(**kw) -> TuiOptions:
    return TuiOptions(engine=EngineConfig(backend="fake"), **kw)


@pytest.fixture
def sink():
    """Plays at 4x real time: fill and underrun numbers move, tests stay short."""
    s = MemorySink(speed=4.0)
    yield s
    s.close()


class RecordingApp(VoiceApp):
    """VoiceApp that also records every notification as (severity, message)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.notes: list[tuple[str, str]] = []

    def notify(self, message, *args, **kw) -> None:
        self.notes.append((kw.get("severity", "information"), str(message)))
        super().notify(message, *args, **kw)


@pytest.fixture
def make_app(sink):
    def make(options: TuiOptions | None = None, **kw) -> RecordingApp:
        return RecordingApp(options or fake_options(**kw), sink=sink)
    return make


async def wait_until(pilot, predicate: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    """Let the app run until `predicate()` is true (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.bridge.synth is not None, "the model to load")


async def say(pilot, text: str, typed: bool = False) -> None:
    """Put `text` in the text entry (typed key by key if `typed`: each simulated key costs tens of
    milliseconds), then press Enter."""
    if typed:
        await pilot.press(*text)
    else:
        pilot.app.query_one("#text").value = text
    await pilot.press("enter")
