"""Helpers shared by the TUI tests (a module of its own: `conftest` is an ambiguous name to import)."""
from __future__ import annotations

import time
from typing import Callable

from engine.factory import EngineConfig
from voiceapp.tui.app import VoiceApp
from voiceapp.tui.bridge import TuiOptions

SIZE = (100, 30)

def fake_options(**kw) -> TuiOptions:
    return TuiOptions(engine=EngineConfig(backend="fake"), **kw)

class RecordingApp(VoiceApp):
    """VoiceApp that also records every notification as (severity, message)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.notes: list[tuple[str, str]] = []

    def notify(self, message, *args, **kw) -> None:
        self.notes.append((kw.get("severity", "information"), str(message)))
        super().notify(message, *args, **kw)

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
