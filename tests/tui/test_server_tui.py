"""The TUI uses a running `voicectl serve` when one fits, and falls back to its own engine when none runs."""
from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from tui_helpers import SIZE, ready, say, wait_until

from engine.factory import EngineConfig, build_synthesizer
from voiceapp.server import EngineServer
from voiceapp.tui.bridge import TuiOptions
from voiceapp.tui.history import Status


@pytest.fixture
def served():
    """A fake-backend EngineServer on its own loop in a thread; yields (socket path, the server's synth)."""
    d = Path(tempfile.mkdtemp(prefix="vt-"))
    path = d / "run" / "engine.sock"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        server = EngineServer(build_synthesizer(EngineConfig(backend="fake")), path, log=lambda line: None)
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield path, server
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    shutil.rmtree(d, ignore_errors=True)


async def test_tui_speaks_through_a_running_server(make_app, sink, served):
    path, server = served
    # backend "auto" and no model asked for: the fake server may stand in (the TUI never loads a model)
    app = make_app(TuiOptions(engine=EngineConfig(backend="auto", model=None), server_socket=path))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert type(app.bridge.synth).__name__ == "RemoteSynthesizer"
        await say(pilot, "Through the server.")
        await wait_until(pilot, lambda: app.bridge.history.entries and
                         app.bridge.history.entries[0].status is Status.DONE, "the utterance")
        await wait_until(pilot, lambda: server.counts["served"] == 1, "the server to count the request")
        assert len(sink.played_samples) == round(app.bridge.history.entries[0].metrics.audio_s * 16000) > 0
        await pilot.press("ctrl+q")
    assert app.return_code == 0


async def test_no_server_running_means_the_in_process_engine(make_app, sink, tmp_path):
    app = make_app(TuiOptions(engine=EngineConfig(backend="fake"), server_socket=tmp_path / "none.sock"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert type(app.bridge.synth).__name__ == "Synthesizer"
        await pilot.press("ctrl+q")
