"""What a listener would hear from a stream's chunk arrival times: our player (engine.player_gate's policy), the
stricter fixed-delay player, and a sentence held by `speak`'s pacing (engine.pacing). Pure."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from engine.pacing import RequestPace
from engine.player_gate import may_play, rebuffers_after
from engine.windowing import WindowPlanner, WindowSchedule, planned_windows

@dataclass
class StreamRecord:
    """One request's chunks as they arrived."""

    start: float
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """(arrival time, samples) per chunk, pauses included (they are played too)."""
    request_id: str = ""

    def ttfa(self) -> float:
        return self.chunks[0][0] - self.start

    def audio_s(self, sample_rate: int) -> float:
        return sum(n for _, n in self.chunks) / sample_rate

    def steady_rtf(self, sample_rate: int) -> float:
        if len(self.chunks) < 2:
            return 0.0
        after_first = sum(n for _, n in self.chunks[1:]) / sample_rate
        return (self.chunks[-1][0] - self.chunks[0][0]) / after_first if after_first else 0.0

    def rtf(self, sample_rate: int) -> float:
        return (self.chunks[-1][0] - self.start) / self.audio_s(sample_rate)


@dataclass(frozen=True, slots=True)
class Playback:
    """What a listener got from one stream in a playback simulation."""

    underruns: int
    """Times the buffer ran dry before the stream's last chunk had arrived."""
    silence_s: float
    """Seconds of unplanned silence (from each underrun until playing resumed)."""
    onset: float
    """Wall time at which the first sample was played (perf_counter seconds)."""
    first_underrun: int = -1
    """Index of the chunk that came too late the first time (-1: none)."""


def simulate_player(chunks: Sequence[tuple[float, int]], sample_rate: int, preroll_s: float = 0.2,
                    rebuffer_s: float | None = None) -> Playback:
    """Our player (engine.backends.sounddevice_sink), by its own policy (engine.player_gate): it starts once it
    holds `preroll_s` of audio (or the stream's last chunk, its end, has arrived), plays at real time, and after an
    underrun waits for `rebuffer_s` (default: the pre-roll) of audio again before resuming."""
    if not chunks:
        return Playback(0, 0.0, math.nan)
    preroll = round(preroll_s * sample_rate)
    rebuffer = preroll if rebuffer_s is None else round(rebuffer_s * sample_rate)
    sounding, rebuffering, queued = False, False, 0  # queued: samples held while not sounding
    runs_out = onset = stalled = math.nan  # runs_out: wall time at which the queued audio is used up
    underruns, silence, first = 0, 0.0, -1
    for k, (arrival, samples) in enumerate(chunks):
        if sounding and arrival > runs_out + 1e-9:
            underruns, sounding, queued, stalled = underruns + 1, False, 0, runs_out
            rebuffering = rebuffers_after(True, True, rebuffer)
            first = k if first < 0 else first
        if sounding:
            runs_out += samples / sample_rate
            continue
        queued += samples
        if may_play(not math.isnan(onset), rebuffering, queued, preroll, rebuffer, k == len(chunks) - 1):
            sounding, rebuffering, runs_out = True, False, arrival + queued / sample_rate
            if math.isnan(onset):
                onset = arrival
            if not math.isnan(stalled):
                silence, stalled = silence + arrival - stalled, math.nan
    return Playback(underruns, silence, onset, first)


def simulate_playback(chunks: Sequence[tuple[float, int]], sample_rate: int, preroll_s: float = 0.2
                      ) -> tuple[int, float]:
    """(underruns, seconds of silence) for a player that starts a fixed `preroll_s` after the first chunk
    (whatever it holds by then) and plays at real time, stalling whenever the next chunk has not arrived by the
    time the audio before it is used up. Stricter than our player when the first chunk is short and late chunks
    come slowly."""
    if not chunks:
        return 0, 0.0
    clock = chunks[0][0] + preroll_s  # wall time at which the player reaches the start of the next chunk
    underruns, silence = 0, 0.0
    for arrival, samples in chunks:
        if arrival > clock + 1e-9:
            underruns += 1
            silence += arrival - clock
            clock = arrival
        clock += samples / sample_rate
    return underruns, silence


def paced_sentence(pace: RequestPace, chunks: Sequence[tuple[float, float, bool, float | None]],
                   made: Sequence[float] | None = None) -> tuple[float, float]:
    """(start, slack) of one sentence's chunks, (arrival time, seconds, sentence end, planned seconds) each, through a
    request's pacing as `speak` plays it: it starts at the chunk `pace` lets go, or on the clock at `release_at` when
    that comes before the next chunk; slack is how long before it is due the least timely chunk arrives (negative:
    a gap inside the sentence). `made`: when each chunk was made, for a sentence rendered ahead of its turn."""
    start = None
    for i, (at, seconds, end, planned) in enumerate(chunks):
        due = pace.release_at()
        if start is None and due is not None and due < at:
            start = due
            pace.release()
        if not pace.arrived(seconds, end, at, planned, None if made is None else made[i]) and start is None:
            start = at
    if start is None:  # the chunk that ends a sentence always lets it go
        raise ValueError("a sentence's chunks must end with the one that ends it")
    slack, played = math.inf, 0.0
    for at, seconds, _, _ in chunks:
        slack, played = min(slack, start + played - at), played + seconds
    return start, slack


def window_arrivals(schedule: WindowSchedule, codes_per_s: float, speed: float, codes: int, samples_per_code: int,
                    decode_s: float = 0.0) -> list[tuple[float, int]]:
    """(arrival, samples) of each window's audio for one sentence of `codes` codes whose LLM makes them at `speed`
    x real time, a window's audio out `decode_s` after its last code (right context included): the pipeline's own
    engine.windowing WindowPlanner, with no model. `simulate_player` of it says whether a schedule keeps up at
    that speed."""
    return [(available / (codes_per_s * speed) + decode_s, (window.emit_stop - window.emit_start) * samples_per_code)
            for available, window in planned_windows(WindowPlanner(schedule), codes)]
