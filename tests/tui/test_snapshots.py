"""SVG snapshots of the TUI (pytest-textual-snapshot). Deterministic: fake engine, a sink with fixed buffer
numbers, history rows with fixed metrics, no clocks, no cursor blink. Update with `pytest --snapshot-update`."""
from __future__ import annotations

import numpy as np
from tui_helpers import SIZE, fake_options, wait_until

from voiceapp.tui.app import VoiceApp
from voiceapp.tui.history import Metrics, Status
from voiceapp.tui.messages import UtteranceUpdated
from voiceapp.tui.widgets.text_entry import TextEntry


class FixedSink:
    """MonitoredSink that drops audio and always reports the same buffer health (for stable pictures)."""

    sample_rate = device_rate = 16000
    fill_frames, capacity_frames, underruns = 19200, 48000, 2
    last_onset_perf = None

    def mark_utterance_start(self) -> None:
        pass

    async def write(self, samples: np.ndarray) -> None:
        pass

    async def drain(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def allow_pause(self) -> None:
        pass

    def close(self) -> None:
        pass


ROWS = (
    ("Hello there.", "ava", Status.DONE, 0.112, 0.231, 0.18, 1.2),
    ("The quick brown fox jumps over the lazy dog.", "leo", Status.DONE, 0.098, 0.205, 0.21, 2.9),
    ("This one was stopped halfway through.", "emma", Status.STOPPED, 0.105, 0.219, 0.20, 1.6),
    ("Queued behind the others.", "emma", Status.QUEUED, None, None, None, 0.0),
)


def snapshot_app() -> VoiceApp:
    return VoiceApp(fake_options(), sink=FixedSink())


async def settle(pilot) -> None:
    """Model loaded, first buffer poll shown, no blinking cursor."""
    app = pilot.app
    await wait_until(pilot, lambda: app.bridge.synth is not None and app.bridge._last_stats is not None, "ready")
    app.query_one(TextEntry).cursor_blink = False
    await pilot.pause()


async def fill_history(pilot) -> None:
    await settle(pilot)
    app = pilot.app
    for text, voice, status, ttfa, onset, rtf, audio in ROWS:
        utt, _ = app.bridge.history.add(text, voice)
        utt.status = status
        utt.metrics = Metrics(ttfa_s=ttfa, onset_s=onset, audio_s=audio, compute_s=(rtf or 0) * audio,
                              tokens=round(audio * 50))
        app.post_message(UtteranceUpdated(utt))
    app.post_message(UtteranceUpdated(app.bridge.history.entries[1]))  # the metrics panel shows #2
    await pilot.pause()


def test_ready(snap_compare):
    assert snap_compare(snapshot_app(), press=[*"Hello"], run_before=settle, terminal_size=SIZE)


def test_history_and_metrics(snap_compare):
    assert snap_compare(snapshot_app(), run_before=fill_history, terminal_size=SIZE)


def test_help(snap_compare):
    assert snap_compare(snapshot_app(), press=["f1"], run_before=settle, terminal_size=SIZE)


def test_too_small(snap_compare):
    assert snap_compare(snapshot_app(), run_before=settle, terminal_size=(50, 12))
