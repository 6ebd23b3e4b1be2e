"""Writes the README's screenshots: `python tests/tui/make_screenshots.py` (fake engine, simulated speaker).

docs/tui.svg: mid-utterance, one text queued; docs/tui-history.svg: a few finished utterances, one stopped.
PNG copies are made too when `rsvg-convert` (librsvg2-bin) is installed.
"""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from memory_sink import MemorySink  # noqa: E402

from engine.factory import EngineConfig  # noqa: E402
from voiceapp.tui.app import VoiceApp  # noqa: E402
from voiceapp.tui.bridge import TuiOptions  # noqa: E402
from voiceapp.tui.history import Status  # noqa: E402
from voiceapp.tui.widgets.text_entry import TextEntry  # noqa: E402
from voiceapp.tui.widgets.voice_picker import VoicePicker  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"
STORY = ("The quick brown fox jumps over the lazy dog. It was not amused. Then it ran off into the woods, "
         "and nobody saw it again until the spring.")


async def until(pilot, predicate, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await pilot.pause(0.02)
    raise TimeoutError("screenshot state not reached")


async def speak(pilot, text: str, voice: str | None = None) -> None:
    if voice:
        pilot.app.query_one(VoicePicker).value = voice
        await pilot.pause()
    pilot.app.query_one(TextEntry).value = text
    await pilot.press("enter")


async def main() -> None:
    sink = MemorySink(speed=1.0)
    app = VoiceApp(TuiOptions(engine=EngineConfig(backend="fake")), sink=sink)
    entries = lambda: app.bridge.history.entries  # noqa: E731
    async with app.run_test(size=(100, 30)) as pilot:
        app.query_one(TextEntry).cursor_blink = False
        await until(pilot, lambda: app.bridge.synth is not None)
        await speak(pilot, "Hello there, this is voiceapp.")
        await until(pilot, lambda: entries()[0].status is Status.DONE)
        await speak(pilot, STORY, voice="leo")
        await speak(pilot, "And this one waits its turn.", voice="emma")
        await until(pilot, lambda: sink.fill_frames > sink.capacity_frames // 3 and entries()[1].metrics.onset_s)
        await pilot.pause(0.3)
        save(app, "tui.svg")
        await until(pilot, lambda: entries()[2].status is Status.PLAYING and entries()[2].metrics.onset_s)
        await pilot.pause(0.6)
        await pilot.press("escape")
        await speak(pilot, "Replay and history are one key away.", voice="mia")
        await until(pilot, lambda: entries()[3].status is Status.DONE)
        await pilot.press("tab", "tab")
        await pilot.pause(0.3)
        save(app, "tui-history.svg")
    sink.close()


def save(app: VoiceApp, name: str) -> None:
    app.save_screenshot(name, path=str(DOCS))
    print(f"wrote docs/{name}")
    if shutil.which("rsvg-convert"):
        png = name.replace(".svg", ".png")
        subprocess.run(["rsvg-convert", "-o", str(DOCS / png), str(DOCS / name)], check=True)
        print(f"wrote docs/{png}")


if __name__ == "__main__":
    asyncio.run(main())
