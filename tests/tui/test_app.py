"""Pilot tests of the TUI on the fake engine and an in-memory sink with a simulated real-time consumer."""
from __future__ import annotations

import threading
import time

import numpy as np
import soundfile as sf
from tui_helpers import SIZE, RecordingApp, fake_options, ready, say, wait_until
from textual import events

from engine.errors import AudioDeviceError
from engine.factory import EngineConfig
from voiceapp.tui.bridge import TuiOptions
from voiceapp.tui.history import Status
from voiceapp.tui.widgets.help_screen import HelpScreen
from voiceapp.tui.widgets.history_table import HistoryTable
from voiceapp.tui.widgets.metrics_panel import MetricsPanel
from voiceapp.tui.widgets.status_bar import StatusBar
from voiceapp.tui.widgets.text_entry import MAX_TEXT_CHARS, TextEntry
from voiceapp.tui.widgets.voice_picker import VoicePicker

LONG = " ".join(f"This is sentence number {w} of a longer text." for w in ("one", "two", "three", "four", "five"))
"""Five sentences: 6.7 s of fake audio (with the pauses between sentences), 1.7 s at the test sink's 4x speed."""


def entries(app):
    return app.bridge.history.entries


def status_text(app) -> str:
    return app.query_one(StatusBar).text


async def test_enter_speaks_and_history_shows_metrics(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "Hello there.", typed=True)
        assert app.query_one(TextEntry).value == ""
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.DONE, "the utterance")
        await pilot.pause()                             # let the table catch up with the bridge's messages
        (utt,) = entries(app)
        m = utt.metrics
        assert m.ttfa_s > 0 and m.rtf > 0 and m.tokens_per_s > 0 and m.onset_s >= m.ttfa_s
        assert m.audio_s == 1.2 and m.tokens == 60
        table = app.query_one(HistoryTable)
        row = table.get_row("1")
        assert row[:4] == ["1", "Hello there.", "ava", "done"] and row[4].endswith(" ms")
        assert len(sink.played_samples) == round(1.2 * 16000)
        assert [r.voice for r in app.bridge.requests] == ["ava"]
        await pilot.press("ctrl+q")
    assert app.return_code == 0


async def test_metrics_panel_follows_playback(make_app, sink):
    app = make_app()
    panel_fill: list[int] = []
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(MetricsPanel)
        await ready(pilot)
        await say(pilot, LONG)
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.PLAYING, "playback")
        while entries(app)[0].status is Status.PLAYING:
            panel_fill.append(panel.fill_frames)
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        assert max(panel_fill) > 0, "the buffer bar never moved"
        assert panel.capacity_frames == sink.capacity_frames and panel.fill_frames == 0
        assert panel.utterance is entries(app)[0] and panel.underruns == sink.underruns
        shown = {label: str(value) for label, value in panel.rows()}
        assert shown["utterance"] == "#1 done" and shown["TTFA"].endswith(" ms") and shown["audio"] == "6.7 s"
        assert float(shown["RTF"]) > 0 and shown["buffer"].startswith("·" * 8)


async def test_stop_key_cancels_playback_and_drops_queue(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, LONG)
        await say(pilot, "Never played.")
        await wait_until(pilot, lambda: len(sink.played) > 5, "audio to play")
        assert entries(app)[1].status is Status.QUEUED
        await pilot.press("escape")
        await wait_until(pilot, lambda: entries(app)[0].status is Status.STOPPED, "the stop")
        assert entries(app)[1].status is Status.DROPPED
        assert sink.clears >= 1
        await pilot.pause(0.1)
        assert sink.fill_frames == 0
        played = len(sink.played_samples)
        assert played < 6 * 16000
        await pilot.pause(0.3)
        assert len(sink.played_samples) == played, "audio kept playing after stop"
        assert app.query_one(HistoryTable).get_row("1")[3] == "stopped"
        assert status_text(app) == "ready"
        # ctrl+s stops too, and the app keeps working afterwards
        await say(pilot, LONG)
        await wait_until(pilot, lambda: entries(app)[2].status is Status.PLAYING, "the next utterance")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: entries(app)[2].status is Status.STOPPED, "the second stop")


async def test_queued_text_plays_after_the_current_one(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, LONG)
        await say(pilot, "Second one.")
        first, second = entries(app)
        assert second.status is Status.QUEUED
        await wait_until(pilot, lambda: status_text(app) == "speaking #1 · 1 queued", "the queue line")
        assert app.query_one(HistoryTable).get_row("2")[3] == "queued"
        await wait_until(pilot, lambda: second.status is Status.DONE, "the queued utterance", timeout=30)
        assert first.status is Status.DONE
        assert [r.request_id for r in app.bridge.requests] == [first.request_id, second.request_id]
        assert second.metrics.t0 > first.metrics.t0 + first.metrics.audio_s / sink.speed


async def test_skip_key_plays_the_next_queued(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, LONG)
        await say(pilot, "After the skip.")
        await wait_until(pilot, lambda: entries(app)[0].status is Status.PLAYING, "playback")
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: entries(app)[1].status is Status.DONE, "the next one")
        assert entries(app)[0].status is Status.SKIPPED


async def test_switching_voice_changes_the_next_request(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "Hello.")
        await wait_until(pilot, lambda: entries(app)[0].status is Status.DONE, "first utterance")
        picker = app.query_one(VoicePicker)
        await pilot.click(VoicePicker)                  # mouse opens the list
        await pilot.pause()
        await pilot.press("down", "enter")              # keyboard picks the next voice
        await wait_until(pilot, lambda: picker.value != "ava", "the voice change")
        assert picker.value == "emma"
        await pilot.click(TextEntry)
        await say(pilot, "Hello.", typed=True)
        await wait_until(pilot, lambda: len(entries(app)) == 2 and entries(app)[1].status is Status.DONE, "second")
        await pilot.pause()
        assert [r.voice for r in app.bridge.requests] == ["ava", "emma"]
        assert app.query_one(HistoryTable).get_row("2")[2] == "emma"
        a, b = (e.audio for e in entries(app))
        assert len(a) == len(b) and not np.array_equal(a, b)


async def test_replay_plays_the_kept_audio_again(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "Hello there.")
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.DONE, "the utterance")
        audio = entries(app)[0].audio
        assert audio is not None and len(audio) == round(1.2 * 16000)
        before = len(sink.played_samples)
        await pilot.press("tab", "tab")                 # text -> voice -> history
        assert isinstance(app.focused, HistoryTable)
        await pilot.press("r")
        await wait_until(pilot, lambda: status_text(app) == "replaying #1", "the replay")
        await wait_until(pilot, lambda: status_text(app) == "ready", "the replay to end")
        replayed = sink.played_samples[before:]
        np.testing.assert_array_equal(replayed, audio)
        assert len(entries(app)) == 1


async def test_help_screen(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("?")                          # the text field is empty: help
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press(*"Why?")                      # inside a text it is a question mark
        assert app.query_one(TextEntry).value == "Why?" and not isinstance(app.screen, HelpScreen)
        await pilot.press("tab", "tab", "?")
        assert isinstance(app.screen, HelpScreen)
        assert app.screen.query_one("#help").border_title == "keys"
        await pilot.press("question_mark")
        assert not isinstance(app.screen, HelpScreen)


async def test_unknown_model_dir_is_a_notification_not_a_crash(tmp_path, sink):
    options = TuiOptions(engine=EngineConfig(model=str(tmp_path / "missing"), backend="torch"))
    app = RecordingApp(options, sink=sink)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.bridge.load_error is not None, "the load to fail")
        await pilot.pause()
        assert any(sev == "error" and "no such directory" in msg for sev, msg in app.notes), app.notes
        assert status_text(app) == "no model loaded"
        await say(pilot, "Hello.", typed=True)
        await pilot.pause()
        assert any("cannot speak" in msg for _, msg in app.notes)
        assert entries(app) == []
        await pilot.press("ctrl+q")
    assert app.return_code == 0


async def test_voice_error_while_speaking_keeps_history(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "Hello.")
        await wait_until(pilot, lambda: entries(app)[0].status is Status.DONE, "first utterance")
        app.bridge.voice = "nobody"                     # a voice deleted from disk since the app started
        await say(pilot, "Hello again.")
        await wait_until(pilot, lambda: entries(app)[1].status is Status.FAILED, "the failure")
        await pilot.pause()
        assert any(sev == "error" and "unknown voice 'nobody'" in msg for sev, msg in app.notes)
        assert entries(app)[0].status is Status.DONE and entries(app)[0].audio is not None
        table = app.query_one(HistoryTable)
        assert table.row_count == 2 and table.get_row("2")[3] == "failed"
        app.bridge.voice = "ava"
        await say(pilot, "Still works.")
        await wait_until(pilot, lambda: len(entries(app)) == 3 and entries(app)[2].status is Status.DONE, "third")


def held_build(monkeypatch) -> threading.Event:
    """The TUI's engine build waits (up to 10 s) until the returned event is set: the model is "loading" meanwhile."""
    import voiceapp.tui.bridge as bridge_module

    release = threading.Event()
    real_build = bridge_module.build_synthesizer

    def slow_build(*args, **kw):
        release.wait(10)
        return real_build(*args, **kw)

    monkeypatch.setattr(bridge_module, "build_synthesizer", slow_build)
    return release


async def test_text_typed_while_loading_is_queued(make_app, monkeypatch):
    release = held_build(monkeypatch)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query_one("#spinner").display
        await say(pilot, "Early bird.")
        await pilot.pause()
        assert entries(app)[0].status is Status.QUEUED
        assert status_text(app) == "loading fake engine… · 1 queued"
        release.set()
        await wait_until(pilot, lambda: entries(app)[0].status is Status.DONE, "the queued text")
        assert not app.query_one("#spinner").display


async def test_huge_paste_does_not_freeze_the_ui(make_app, sink):
    text = ("A pasted line of text, and then another sentence follows it.\n" * 2000)[:100_000]
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        entry = app.query_one(TextEntry)
        t = time.perf_counter()
        entry.post_message(events.Paste(text))
        await wait_until(pilot, lambda: len(entry.value) > 0, "the paste")
        paste_s = time.perf_counter() - t
        assert entry.value == " ".join(text.split()) and len(entry.value) > 98_000
        await pilot.press("enter")
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.PLAYING, "playback")
        await wait_until(pilot, lambda: len(sink.played) > 0, "audio", timeout=5)
        gaps = []
        for _ in range(20):                             # the UI loop keeps ticking while it synthesizes
            t0 = time.perf_counter()
            await pilot.pause(0.02)
            gaps.append(time.perf_counter() - t0)
        assert max(gaps) < 0.5, f"UI loop stalled {max(gaps):.2f} s"
        assert paste_s < 2.0
        assert app.query_one(HistoryTable).get_row("1")[1].endswith("…")
        await pilot.press("escape")
        await wait_until(pilot, lambda: entries(app)[0].status is Status.STOPPED, "the stop")
        # a paste beyond the cap is cut, with a warning
        entry.value = ""
        entry.post_message(events.Paste("word " * (MAX_TEXT_CHARS // 4)))
        await wait_until(pilot, lambda: len(entry.value) > 0, "the big paste")
        assert len(entry.value) == MAX_TEXT_CHARS
        assert any(sev == "warning" and "cut to" in msg for sev, msg in app.notes)


async def test_too_small_terminal_shows_a_message(make_app):
    app = make_app()
    async with app.run_test(size=(50, 12)) as pilot:
        await pilot.pause()
        assert app.query_one("#too-small").display and not app.query_one("#main").display
        assert "at least 60x16" in str(app.query_one("#too-small").render())
        await pilot.resize_terminal(*SIZE)
        await pilot.pause(0.1)
        assert app.query_one("#main").display and not app.query_one("#too-small").display
        await pilot.resize_terminal(80, 15)
        await pilot.pause(0.1)
        assert app.query_one("#too-small").display


async def test_out_dir_writes_one_wav_per_utterance(tmp_path):
    app = RecordingApp(fake_options(out_dir=tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "Hello there.")
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.DONE, "the utterance")
        await say(pilot, "And again.")
        await wait_until(pilot, lambda: len(entries(app)) == 2 and entries(app)[1].status is Status.DONE, "second")
    wavs = sorted(p.name for p in tmp_path.iterdir())
    assert wavs == ["utterance-0001.wav", "utterance-0002.wav"]
    assert sf.info(str(tmp_path / wavs[0])).duration == 1.2
    assert not [sev for sev, _ in app.notes if sev != "information"]


async def test_no_audio_device_suggests_out_dir(monkeypatch):
    import engine.backends.sounddevice_sink as sd_sink

    def no_device(*args, **kw):
        raise AudioDeviceError("no usable audio output device: Error querying device -1; use --out FILE.wav")

    monkeypatch.setattr(sd_sink, "Player", no_device)
    app = RecordingApp(fake_options())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.pause()
        assert any(sev == "warning" and "--out-dir" in msg for sev, msg in app.notes), app.notes
        await say(pilot, "Hello.")                      # still usable: metrics and history, no sound
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.DONE, "the utterance")
        assert entries(app)[0].metrics.ttfa_s > 0


async def test_text_queued_before_a_failed_load_is_marked_failed(make_app, monkeypatch):
    import voiceapp.tui.bridge as bridge_module
    from engine.errors import ModelNotFound

    release = threading.Event()

    def failing_build(*args, **kw):
        release.wait(10)
        raise ModelNotFound("--model x: no such directory")

    monkeypatch.setattr(bridge_module, "build_synthesizer", failing_build)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await say(pilot, "Too early.")
        await pilot.pause()
        assert entries(app)[0].status is Status.QUEUED
        release.set()
        await wait_until(pilot, lambda: entries(app)[0].status is Status.FAILED, "the failure")
        await pilot.pause()
        assert [msg for sev, msg in app.notes if sev == "error"] == ["--model x: no such directory"]
        assert app.query_one(HistoryTable).get_row("1")[3] == "failed"


async def test_metrics_from_engine_events_are_shown_at_the_poll_rate(make_app, sink):
    """Engine events (every decoded chunk, at generation speed) update an utterance's metrics at once but are
    shown once per poll: repainting on each kept a slow machine half busy. State changes are shown at once."""
    from engine.events import ChunkDecoded
    from voiceapp.tui.messages import UtteranceUpdated

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "Hello there.")
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.DONE, "the utterance")
        utt = entries(app)[0]
        bridge, posted = app.bridge, []
        real_post = bridge.post_message
        bridge.post_message = lambda m: (posted.append(m) if isinstance(m, UtteranceUpdated) else None) or real_post(m)
        before = utt.metrics.audio_s
        for _ in range(50):
            bridge._apply(ChunkDecoded(utt.request_id, 0, codes=4, samples=1280, decode_s=0.001))
        assert utt.metrics.audio_s > before and posted == []  # updated, not yet shown
        bridge._poll()
        assert len(posted) == 1 and posted[0].utterance is utt
        bridge._poll()
        assert len(posted) == 1  # nothing new: nothing shown


async def test_text_typed_after_picking_a_voice_is_spoken_in_that_voice(make_app, sink):
    """After a pick the focus goes back to the text: typed keys were dropped while the picker kept it."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        picker = app.query_one(VoicePicker)
        await pilot.click(VoicePicker)
        await pilot.pause()
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: picker.value == "emma", "the voice change")
        await say(pilot, "Hi.", typed=True)             # no click on the entry first
        await wait_until(pilot, lambda: entries(app) and entries(app)[0].status is Status.DONE, "the utterance")
        assert [(u.text, u.voice) for u in entries(app)] == [("Hi.", "emma")]


async def test_letters_typed_on_the_closed_voice_picker_go_to_the_text(make_app, sink):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.query_one(VoicePicker).focus()
        await pilot.pause()
        await pilot.press("O", "k")
        assert app.query_one(TextEntry).value == "Ok" and app.focused is app.query_one(TextEntry)
        picker = app.query_one(VoicePicker)
        picker.focus()
        await pilot.pause()
        await pilot.press("space")                      # the picker's own key: opens its list, types nothing
        await wait_until(pilot, lambda: picker.expanded, "the list to open")
        assert app.query_one(TextEntry).value == "Ok"


async def test_text_and_enter_typed_before_the_entry_has_focus_wait_for_the_model(make_app, monkeypatch):
    """At launch the keys can arrive before any widget has the focus (the state `set_focus(None)` recreates);
    they reach the text entry, and the Enter queues the text, shown as waiting, spoken once the model is ready."""
    release = held_build(monkeypatch)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.set_focus(None)
        await pilot.pause()
        await pilot.press("H", "i", ".", "enter")
        await wait_until(pilot, lambda: entries(app), "the text to be queued", timeout=5)
        assert entries(app)[0].text == "Hi." and entries(app)[0].status is Status.QUEUED
        assert status_text(app) == "loading fake engine… · 1 queued"
        assert app.query_one(HistoryTable).get_row("1")[3] == "queued"
        release.set()
        await wait_until(pilot, lambda: entries(app)[0].status is Status.DONE, "the queued text")


async def test_slow_onsets_fit_their_history_columns(make_app):
    """A 4,730 ms onset was cut to "4730 m" by the 6-cell column; latencies from a second up show as seconds."""
    from voiceapp.tui.history import Utterance
    from voiceapp.tui.widgets.history_table import COLUMNS

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(HistoryTable)
        widths = {key: width for _, key, width in COLUMNS}
        for number, (ttfa, onset) in enumerate([(0.873, 4.73), (12.34, 47.31), (0.05, 0.999)], start=1):
            utt = Utterance(number, "Hello.", "ava", Status.DONE)
            utt.metrics.ttfa_s, utt.metrics.onset_s = ttfa, onset
            table.show(utt)
        await pilot.pause()
        cells = [(table.get_cell(str(n), "ttfa"), table.get_cell(str(n), "onset")) for n in (1, 2, 3)]
        assert cells == [("873 ms", "4.73 s"), ("12.3 s", "47.3 s"), ("50 ms", "999 ms")]
        assert all(len(ttfa) <= widths["ttfa"] and len(onset) <= widths["onset"] for ttfa, onset in cells)
