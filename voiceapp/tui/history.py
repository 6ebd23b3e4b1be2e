"""Provides the TUI's data model, free of Textual: utterances, their metrics (folded from engine events) and
the bounded history that keeps rendered audio for replay."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from uuid import uuid4

import numpy as np

from engine.events import Event, RequestFinished
from engine.metrics import RequestMetrics


class Status(str, Enum):
    """Where an utterance is in its life."""

    QUEUED = "queued"
    PLAYING = "playing"
    DONE = "done"
    STOPPED = "stopped"
    """Cancelled by the stop key."""
    SKIPPED = "skipped"
    """Cancelled by the skip key (the next queued one plays)."""
    DROPPED = "dropped"
    """Still queued when the stop key was pressed: never played."""
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self not in (Status.QUEUED, Status.PLAYING)


@dataclass
class Metrics(RequestMetrics):
    """One utterance's numbers: its request's, folded from engine events (engine.metrics), and how long its writes
    waited on the sink (set by the bridge), which the compute time leaves out."""

    compute_s: float = 0.0
    """Seconds spent synthesizing so far, excluding time spent waiting for the player's buffer."""
    blocked_s: float = 0.0
    """Seconds the synthesizer waited on the sink's backpressure (set by the bridge)."""
    remote: bool = False
    """The request ran in an engine server (set by the bridge). Its RequestFinished carries the server's wall
    time, in which this process's waits on the sink are not: the compute time then ends at this process's
    receipt of that event, on the clock the waits were measured on."""

    @property
    def rtf(self) -> float | None:
        """Synthesis seconds per second of audio (below 1 is faster than real time); playback waits excluded."""
        return self.compute_s / self.audio_s if self.audio_s > 0 and self.compute_s > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.compute_s if self.tokens and self.compute_s > 0 else None

    def apply(self, event: Event) -> None:
        """Fold one engine event of this utterance's request in; the compute time follows the elapsed time, less
        the waits on the sink up to then."""
        elapsed = self.elapsed_s
        super().apply(event)
        if self.remote and isinstance(event, RequestFinished) and self.t0 is not None:
            # a relayed event's time is when this process rebuilt it (engine.protocol drops the server's)
            self.elapsed_s = max(event.t - self.t0, 0.0)
        if self.elapsed_s != elapsed:
            self.compute_s = max(self.elapsed_s - self.blocked_s, 0.0)


@dataclass(eq=False)
class Utterance:
    """One submitted text and everything known about it."""

    number: int
    """1-based, in submission order; the history table's row key."""
    text: str
    voice: str
    """Voice chosen when the text was submitted."""
    status: Status = Status.QUEUED
    metrics: Metrics = field(default_factory=Metrics)
    error: str | None = None
    request_id: str = field(default_factory=lambda: uuid4().hex)
    audio: np.ndarray | None = None
    """The rendered audio (float32, mono, at metrics.sample_rate), kept for replay while the budget allows."""
    audio_note: str = ""
    """Why there is no audio to replay, when there is none."""

    def excerpt(self, width: int = 48) -> str:
        """The text on one line, cut to `width` characters (huge pastes stay cheap to show)."""
        head = " ".join(self.text[: width * 4].split())
        return head if len(head) <= width and len(self.text) <= width * 4 else head[: width - 1] + "…"


class History:
    """Utterances in submission order. Bounded: at most `max_entries` rows, and rendered audio kept for at most
    `max_audio_entries` utterances and `max_audio_s` seconds in all (oldest audio goes first)."""

    def __init__(self, max_entries: int = 200, max_audio_entries: int = 20, max_audio_s: float = 600.0) -> None:
        self.max_entries, self.max_audio_entries, self.max_audio_s = max_entries, max_audio_entries, max_audio_s
        self.entries: list[Utterance] = []
        self._next = 1

    def add(self, text: str, voice: str) -> tuple[Utterance, list[Utterance]]:
        """Append a queued utterance; returns it and the finished entries pruned to stay within bounds."""
        utt = Utterance(self._next, text, voice)
        self._next += 1
        self.entries.append(utt)
        pruned: list[Utterance] = []
        for old in list(self.entries):
            if len(self.entries) <= self.max_entries:
                break
            if old.status.finished:
                self.entries.remove(old)
                pruned.append(old)
        return utt, pruned

    def get(self, number: int) -> Utterance | None:
        return next((u for u in self.entries if u.number == number), None)

    def by_request(self, request_id: str) -> Utterance | None:
        return next((u for u in reversed(self.entries) if u.request_id == request_id), None)

    def queued(self) -> list[Utterance]:
        return [u for u in self.entries if u.status is Status.QUEUED]

    def keep_audio(self, utt: Utterance, audio: np.ndarray) -> list[Utterance]:
        """Keep `utt`'s rendered audio for replay; returns the entries whose audio was dropped to make room."""
        seconds = len(audio) / utt.metrics.sample_rate
        if seconds > self.max_audio_s:
            utt.audio_note = f"not kept: longer than {self.max_audio_s / 60:g} min"
            return []
        utt.audio, utt.audio_note = audio, ""
        dropped = []
        kept = [u for u in self.entries if u.audio is not None]
        while len(kept) > self.max_audio_entries or sum(_seconds(u) for u in kept) > self.max_audio_s:
            oldest = kept.pop(0)
            oldest.audio, oldest.audio_note = None, "no longer kept (history audio is bounded)"
            dropped.append(oldest)
        return dropped

    @property
    def kept_audio_s(self) -> float:
        return sum(_seconds(u) for u in self.entries if u.audio is not None)


METRICS_LOG_ENV = "VOICEAPP_TUI_METRICS"
"""A file path: the TUI appends each finished utterance's `metrics_record` there as a JSON line (how the start-up
benchmark sees, from outside, when a TUI launched with text typed at once had its first audio)."""


def metrics_record(utt: Utterance, process_start: float) -> dict:
    """A finished utterance's outcome and latencies; process_ttfa_ms counts from `process_start` (perf_counter()
    at this process's launch) to its first audio, as `voicectl say --json` does."""
    m = utt.metrics
    return {"number": utt.number, "status": utt.status.value, "error": utt.error, "ttfa_ms": _ms(m.ttfa_s),
            "process_ttfa_ms": _ms(m.process_ttfa_s(process_start)), "audio_s": m.audio_s}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _seconds(utt: Utterance) -> float:
    return 0.0 if utt.audio is None else len(utt.audio) / utt.metrics.sample_rate
