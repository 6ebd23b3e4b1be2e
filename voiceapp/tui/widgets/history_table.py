"""Provides HistoryTable: every utterance with its status and metrics; `r` replays the selected one."""
from __future__ import annotations

from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from voiceapp.tui import fmt
from voiceapp.tui.history import Utterance
from voiceapp.tui.messages import ReplayRequested

COLUMNS = (("#", "number", 3), ("text", "text", 17), ("voice", "voice", 5), ("status", "status", 7),
           ("TTFA", "ttfa", 6), ("onset", "onset", 6), ("RTF", "rtf", 4), ("audio", "audio", 6))
"""(label, key, width): fixed widths, so rows updated in place never get cut; what does not fit the table's
width is clipped on the right (least needed last: the metrics panel shows the current one in full)."""


class HistoryTable(DataTable):
    """One row per utterance, keyed by its number; rows are updated in place as metrics arrive."""

    BINDINGS = [Binding("r", "replay", "Replay")]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.border_title = "history"
        for label, key, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, utt: Utterance) -> None:
        """Add the utterance's row, or update it in place."""
        cells = _cells(utt)
        key = str(utt.number)
        if key not in self.rows:
            self.add_row(*cells.values(), key=key)
            self.move_cursor(row=self.row_count - 1)
            return
        for column, value in cells.items():
            if self.get_cell(key, column) != value:  # each update repaints: only what changed
                self.update_cell(key, column, value)

    def remove_entries(self, numbers: list[int]) -> None:
        for number in numbers:
            if str(number) in self.rows:
                self.remove_row(str(number))

    @property
    def selected_number(self) -> int | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0))
        return int(row_key.value) if row_key.value is not None else None

    def action_replay(self) -> None:
        number = self.selected_number
        if number is not None:
            self.post_message(ReplayRequested(number))


def _cells(utt: Utterance) -> dict[str, str]:
    m = utt.metrics
    return {"number": str(utt.number), "text": utt.excerpt(17), "voice": utt.voice, "status": utt.status.value,
            "ttfa": fmt.ms(m.ttfa_s), "onset": fmt.ms(m.onset_s), "rtf": fmt.ratio(m.rtf),
            "audio": fmt.secs(m.audio_s if m.audio_s else None)}
