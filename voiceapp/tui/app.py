"""Provides VoiceApp: composition, key bindings and message routing only; the Bridge does the work."""
from __future__ import annotations

from pathlib import Path

from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Input, Select

from engine.backends.base import MonitoredSink
from engine.families import family_of
from engine.voices import available_voice
from voiceapp.tui.bridge import Bridge, TuiOptions
from voiceapp.tui.history import Status
from voiceapp.tui.messages import (ModelFailed, ModelReady, PlaybackStats, PlayerState, Problem,
                                   ReplayRequested, UtterancesRemoved, UtteranceUpdated)
from voiceapp.tui.widgets.help_screen import HelpScreen
from voiceapp.tui.widgets.history_table import HistoryTable
from voiceapp.tui.widgets.metrics_panel import MetricsPanel
from voiceapp.tui.widgets.status_bar import StatusBar
from voiceapp.tui.widgets.text_entry import TextEntry
from voiceapp.tui.widgets.too_small import MIN_HEIGHT, MIN_WIDTH, TooSmall
from voiceapp.tui.widgets.voice_picker import VoicePicker


class VoiceApp(App[int]):
    """Type text, hear it, watch the metrics. `sink` replaces the speaker (tests pass an in-memory one)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    """Resolved here, so subclasses defined elsewhere (tests) find it too."""
    TITLE = "voiceapp"
    AUTO_FOCUS = "#text"
    """The text entry has the focus from the first frame the screen shows."""
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (MIN_WIDTH, "-wide-enough")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (MIN_HEIGHT, "-tall-enough")]
    BINDINGS = [
        Binding("escape,ctrl+s", "stop", "Stop"),
        Binding("ctrl+n", "skip", "Skip"),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, options: TuiOptions = TuiOptions(), sink: MonitoredSink | None = None) -> None:
        super().__init__()
        self.options = options
        bank = options.engine.voices or family_of(options.engine.model).voices()
        self.voices, self.default_voice = sorted(bank.all()), bank.default
        self.bridge = Bridge(options, sink, id="bridge")

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="♪")
        with Vertical(id="main"):
            with Horizontal(id="controls"):
                yield TextEntry(id="text")
                yield VoicePicker(self.voices, self._initial_voice(), id="voice")
            yield StatusBar(id="status")
            with Horizontal(id="body"):
                yield HistoryTable(id="history")
                yield MetricsPanel(id="metrics")
        yield TooSmall(id="too-small")
        yield Footer()
        yield self.bridge

    def on_mount(self) -> None:
        self.bridge.voice = self._initial_voice()
        self.query_one(TextEntry).focus()
        if self.options.voice not in ("default", "") and self.options.voice not in self.voices:
            self.notify(f"unknown voice {self.options.voice!r}; using {self._initial_voice()}", severity="warning")

    def _initial_voice(self) -> str:
        return available_voice(self.options.voice, self.voices, self.default_voice)

    # ---- actions ------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        self.bridge.stop()

    def action_skip(self) -> None:
        self.bridge.skip()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    # ---- user input -> bridge -----------------------------------------------------------------------

    @on(Input.Submitted, "#text")
    def _speak(self, event: Input.Submitted) -> None:
        if self.bridge.submit(event.value) is not None:
            event.input.clear()

    @on(Select.Changed, "#voice")
    def _voice(self, event: Select.Changed) -> None:
        if isinstance(event.value, str):
            self.bridge.voice = event.value
        # a pick is followed by text: it goes to the entry (it was dropped while the picker kept the focus)
        for entry in self.query(TextEntry):
            entry.focus()

    def on_key(self, event: events.Key) -> None:
        """Keys typed where no widget takes them (nothing focused yet at launch; the closed voice picker, which
        ignores letters) go to the text entry: typed text and its Enter are never silently dropped. Other focused
        widgets (the history's `r`, the open voice list) keep their keys, as does any other screen."""
        if self.focused is not None and not isinstance(self.focused, VoicePicker):
            return
        if isinstance(self.focused, VoicePicker) and event.key in VoicePicker.OWN_KEYS:
            return  # space opens the list
        entries = list(self.query(TextEntry))
        if not entries or entries[0].screen is not self.screen:
            return
        entry = entries[0]
        if event.character == "?" and not entry.value:
            return  # the help key, as in the empty entry
        if event.is_printable and event.character:
            event.stop()
            entry.focus()
            entry.insert_text_at_cursor(event.character)
        elif event.key == "enter" and self.focused is None:
            event.stop()
            entry.focus()
            self.call_later(entry.action_submit)

    def on_replay_requested(self, message: ReplayRequested) -> None:
        self.bridge.replay(message.number)

    # ---- bridge messages -> widgets -----------------------------------------------------------------

    def on_model_ready(self, message: ModelReady) -> None:
        if message.sink_notice:
            self.notify(message.sink_notice, severity="warning", timeout=12)

    def on_model_failed(self, message: ModelFailed) -> None:
        self.notify(message.error, title="model not loaded", severity="error", timeout=20)

    # The handlers below iterate over queries instead of query_one: a message that arrives while the app
    # shuts down (its widgets already removed) must be a no-op, not a crash.

    def on_player_state(self, message: PlayerState) -> None:
        for bar in self.query(StatusBar):
            bar.show(message.text, loading=message.text.startswith("loading"))

    def on_utterance_updated(self, message: UtteranceUpdated) -> None:
        utt = message.utterance
        for table in self.query(HistoryTable):
            table.show(utt)
        if utt.status not in (Status.QUEUED, Status.DROPPED):
            for panel in self.query(MetricsPanel):
                panel.show_utterance(utt)

    def on_utterances_removed(self, message: UtterancesRemoved) -> None:
        for table in self.query(HistoryTable):
            table.remove_entries(message.numbers)

    def on_playback_stats(self, message: PlaybackStats) -> None:
        for panel in self.query(MetricsPanel):
            panel.show_playback(message.fill_frames, message.capacity_frames, message.frame_rate, message.underruns)

    def on_problem(self, message: Problem) -> None:
        self.notify(message.message, severity=message.severity)
