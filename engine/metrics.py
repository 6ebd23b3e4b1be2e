"""Provides RequestMetrics: one request's numbers folded from its engine events. Pure (engine.events only).

Every front end folds events the same way here and keeps only how it shows the numbers: `voicectl say --stats` /
`--json`, the TUI's history and metrics panel, the server's status, the export's start-up phases.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import (ChunkDecoded, Event, FirstAudio, FirstToken, Notice, RequestFinished, RequestStarted,
                           SentenceFinished, StartupPhase)


@dataclass
class RequestMetrics:
    """What is known about one request: `apply` folds its events in; `heard_at` adds the player's onset."""

    sample_rate: int = 16000
    """Converts ChunkDecoded samples to seconds."""
    t0: float | None = None
    """perf_counter() at RequestStarted: the latencies below count from it."""
    ttft_s: float | None = None
    """Time to the first generated token."""
    ttfa_s: float | None = None
    """Time to the first audio samples being ready (engine side)."""
    first_audio_t: float | None = None
    """perf_counter() at FirstAudio."""
    onset_s: float | None = None
    """Audible onset: the player's DAC time of the first sample, from t0 (None for sinks that cannot tell)."""
    tokens: int = 0
    """Semantic tokens: decoded so far, the request's total once finished."""
    audio_s: float = 0.0
    """Seconds of audio: decoded so far, the request's total once finished."""
    elapsed_s: float = 0.0
    """Seconds from t0 to the latest decoded chunk; once finished, the request's wall time."""
    wall_s: float = 0.0
    """The request's wall time (0 until it finished)."""
    sentences: int = 0
    """Sentences finished."""
    finished: bool = False
    underruns: int = 0
    """Player underruns while this request played (set by the front end that played it)."""
    notices: list[str] = field(default_factory=list)
    """Notice messages, in order."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds of each step of building the engine (StartupPhase events), summed by name."""

    def apply(self, event: Event) -> None:
        """Fold one engine event in (an EventSink)."""
        if isinstance(event, RequestStarted):
            self.t0 = event.t
        elif isinstance(event, FirstToken):
            self.ttft_s = event.ttft_s
        elif isinstance(event, FirstAudio):
            self.ttfa_s, self.first_audio_t = event.ttfa_s, event.t
        elif isinstance(event, ChunkDecoded):
            self._decoded(event)
        elif isinstance(event, SentenceFinished):
            self.sentences += 1
        elif isinstance(event, RequestFinished):
            self.tokens, self.audio_s, self.finished = event.tokens, event.audio_s, True
            self.wall_s = self.elapsed_s = event.wall_s
        elif isinstance(event, Notice):
            self.notices.append(event.message)
        elif isinstance(event, StartupPhase):
            self.phases[event.name] = self.phases.get(event.name, 0.0) + event.seconds

    def _decoded(self, event: ChunkDecoded) -> None:
        self.tokens += event.codes
        self.audio_s += event.samples / self.sample_rate
        if self.t0 is not None:
            self.elapsed_s = event.t - self.t0

    def heard_at(self, onset_perf: float | None) -> bool:
        """Record the audible onset from the player's perf_counter() time of it, once; False when it is recorded
        already or cannot be yet (no onset, or no RequestStarted)."""
        if self.onset_s is not None or self.t0 is None or onset_perf is None:
            return False
        self.onset_s = max(onset_perf - self.t0, 0.0)
        return True

    def process_ttfa_s(self, process_start: float) -> float | None:
        """Seconds from `process_start` (perf_counter() at a process's launch) to the first audio."""
        return None if self.first_audio_t is None else self.first_audio_t - process_start

    @property
    def wall_rtf(self) -> float | None:
        """Wall time per second of audio once finished (below 1 is faster than real time; waits on a full player
        included); None before, or without audio."""
        return self.wall_s / self.audio_s if self.finished and self.audio_s else None
