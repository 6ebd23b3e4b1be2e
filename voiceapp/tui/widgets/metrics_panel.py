"""Provides MetricsPanel: the live numbers of the current utterance and the player's buffer health."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from voiceapp.tui import fmt
from voiceapp.tui.history import Utterance

BAR_CELLS = 8


class MetricsPanel(Static):
    """TTFA, audible onset, RTF, tokens/s and audio length of one utterance; ring fill bar and underruns."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.utterance: Utterance | None = None
        self.fill_frames, self.capacity_frames, self.frame_rate, self.underruns = 0, 0, 1, 0

    def on_mount(self) -> None:
        self.border_title = "metrics"
        self._redraw()

    def show_utterance(self, utt: Utterance) -> None:
        self.utterance = utt
        self._redraw()

    def show_playback(self, fill_frames: int, capacity_frames: int, frame_rate: int, underruns: int) -> None:
        self.fill_frames, self.capacity_frames = fill_frames, capacity_frames
        self.frame_rate, self.underruns = max(frame_rate, 1), underruns
        self._redraw()

    def _redraw(self) -> None:
        # its box is fixed (app.tcss: width 28, height 1fr) and its rows are too: a repaint, not a layout of the
        # whole screen
        self.update(self._table(), layout=False)

    def _table(self) -> Table:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(no_wrap=True)
        for label, value in self.rows():
            grid.add_row(label, value)
        return grid

    def rows(self) -> list[tuple[str, str | Text]]:
        """What the panel shows, as (label, value) pairs."""
        utt = self.utterance
        m = utt.metrics if utt is not None else None
        return [
            ("utterance", f"#{utt.number} {utt.status.value}" if utt else fmt.DASH),
            ("TTFA", fmt.ms(m.ttfa_s if m else None)),
            ("onset", fmt.ms(m.onset_s if m else None)),
            ("RTF", fmt.ratio(m.rtf if m else None)),
            ("tokens/s", fmt.rate(m.tokens_per_s if m else None)),
            ("audio", fmt.secs(m.audio_s if m else None)),
            ("buffer", self._buffer()),
            ("underruns", str(self.underruns)),
        ]

    def _buffer(self) -> Text:
        if not self.capacity_frames:
            return Text(fmt.DASH)
        fraction = self.fill_frames / self.capacity_frames
        full = fmt.filled_cells(fraction, BAR_CELLS)
        return Text.assemble(("█" * full, "green"), ("·" * (BAR_CELLS - full), "dim"),
                             f" {self.fill_frames / self.frame_rate:.1f} s")
