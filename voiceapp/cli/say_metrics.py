"""Provides SayMetrics: what `voicectl say --stats` / `--json` report. Apart from `voiceapp.cli.say`, so that a
`say` through a warm server sends its request before it imports the metrics (engine.metrics, engine.events)."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from engine.events import Notice
from engine.metrics import RequestMetrics
from voiceapp.common import process_start_perf


@dataclass
class SayMetrics(RequestMetrics):
    """What `--stats` / `--json` report: the request's numbers (engine.metrics) and who spoke it. Its "phases"
    also hold "launch": this process's start to an in-process engine's construction (the interpreter and the
    imports before it); and "queued", on the lean road through a warm server (voiceapp.cli.lean_say): this process's
    start to its first audio handed to the player."""

    server_pid: int | None = None
    """The `voicectl serve` process that spoke, or None when the engine ran in this process."""
    server_started: bool = False
    """This command started that server (it keeps running in the background until idle)."""
    played_s: float | None = None
    """From the request's start until the player had played its last sample (None when writing a file)."""
    device_underruns: int = 0
    """Times the audio device itself reported running dry (PortAudio's output-underflow flag, what ALSA prints as
    "underrun occurred"): beside `underruns`, which counts our ring running dry mid-utterance, it shows gaps the
    process caused by not feeding the device in time (a busy CPU), not only those of speech coming too slowly."""

    def on_event(self, event) -> None:
        """The engine's event sink: fold the event in; a Notice is also shown at once."""
        self.apply(event)
        if isinstance(event, Notice):
            print(f"voicectl: {event.message}", file=sys.stderr)

    def line(self) -> str:
        d = self.as_dict()

        def ms(v):
            return "-" if v is None else f"{v:.0f} ms"

        rtf = "-" if d["rtf"] is None else f"{d['rtf']:.3f}"
        engine = "in-process" if self.server_pid is None else f"server pid {self.server_pid}"
        return (f"TTFA {ms(d['ttfa_ms'])} ({ms(d['process_ttfa_ms'])} from launch, {engine}) | onset "
                f"{ms(d['onset_ms'])} | RTF {rtf} | underruns {self.underruns} (device {self.device_underruns}) | "
                f"{self.audio_s:.2f} s audio, "
                f"{self.sentences} sentences")

    def as_dict(self) -> dict:
        """`--json`: TTFA from the request's start (after the engine is ready) and from this process's start
        (what the user waits for: model loading included in-process, connecting when a server speaks), onset,
        wall-time RTF, when the player played its last sample, and the rest as folded."""
        return {"ttfa_ms": _ms(self.ttfa_s), "process_ttfa_ms": _ms(self.process_ttfa_s(process_start_perf())),
                "server_pid": self.server_pid, "server_started": self.server_started, "onset_ms": _ms(self.onset_s),
                "played_ms": _ms(self.played_s), "rtf": self.wall_rtf, "audio_s": self.audio_s, "wall_s": self.wall_s,
                "underruns": self.underruns, "device_underruns": self.device_underruns,
                "sentences": self.sentences, "notices": self.notices, "phases": self.phases}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
