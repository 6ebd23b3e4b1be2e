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
from voiceapp.server.engine_server import EngineServer, LiveRequests
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
        requests = LiveRequests(log=lambda line: None)
        server = EngineServer(build_synthesizer(EngineConfig(backend="fake"), events=requests.route), path, requests)
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
    # the fake server stands in only for a front end asking for the fake backend (issue 41)
    app = make_app(TuiOptions(engine=EngineConfig(backend="fake", model=None), server_socket=path))
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


@pytest.fixture
def auto_socket():
    """A socket path for a server the TUI starts; that server is killed afterwards."""
    from tests.cli_helpers import kill_servers

    d = Path(tempfile.mkdtemp(prefix="vt-"))
    path = d / "run" / "engine.sock"
    yield path
    kill_servers(path)
    shutil.rmtree(d, ignore_errors=True)


async def test_tui_starts_a_background_server_when_none_runs(make_app, sink, auto_socket):
    from tests.cli_helpers import serve_pids

    app = make_app(TuiOptions(engine=EngineConfig(backend="fake"), server_socket=auto_socket, start_server=True))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.bridge.synth is not None, "the server to start", timeout=60)
        remote = app.bridge.synth
        assert type(remote).__name__ == "RemoteSynthesizer" and remote.started_server
        assert serve_pids(auto_socket) == [remote.info["pid"]]
        assert any(f"started a background engine server (pid {remote.info['pid']})" in msg for _, msg in app.notes)
        await say(pilot, "Through a server I started.")
        await wait_until(pilot, lambda: app.bridge.history.entries and
                         app.bridge.history.entries[0].status is Status.DONE, "the utterance")
        await pilot.press("ctrl+q")
    assert serve_pids(auto_socket) == [remote.info["pid"]]  # it outlives the TUI (until idle or `voicectl stop`)


@pytest.mark.parametrize("argv,env,server,start", [
    ([], {}, True, True),
    (["--no-server"], {}, False, False),
    ([], {"VOICEAPP_NO_SERVER": "1"}, False, False),
    (["--backend", "fake"], {}, False, False),
])
def test_tui_flags_choose_whether_a_server_is_used_and_started(monkeypatch, argv, env, server, start):
    from voiceapp.cli import build_parser
    from voiceapp.cli.tui import tui_options

    monkeypatch.setenv("VOICEAPP_NO_SERVER", "0")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    options = tui_options(build_parser().parse_args(["tui", "--socket", "/tmp/x.sock", *argv]))
    assert (options.server_socket == Path("/tmp/x.sock") if server else options.server_socket is None)
    assert options.start_server is start


async def test_rtf_through_a_server_is_shown_when_playback_waits(served):
    """Through a server, the client's waits on a slow player outlast the server's wall time: the RTF, computed
    as that wall time less the waits, was 0 and shown as "–". Now it is on the client's clock throughout."""
    from memory_sink import MemorySink
    from tui_helpers import RecordingApp

    from voiceapp.tui.widgets.history_table import HistoryTable

    path, server = served
    sink = MemorySink(speed=1.5)                         # slow enough that the player's buffer fills
    app = RecordingApp(TuiOptions(engine=EngineConfig(backend="fake", model=None), server_socket=path), sink=sink)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await say(pilot, " ".join(f"This is sentence number {n} of a longer text." for n in range(5)))
            entries = app.bridge.history.entries
            await wait_until(pilot, lambda: entries and entries[0].status is Status.DONE, "the utterance")
            await pilot.pause(0.3)
            m = entries[0].metrics
            assert m.blocked_s > m.wall_s, "the test needs the waits to outlast the server's wall time"
            assert m.rtf is not None and 0 < m.rtf < 1
            assert app.query_one(HistoryTable).get_row("1")[6] == f"{m.rtf:.2f}"
    finally:
        sink.close()
