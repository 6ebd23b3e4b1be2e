"""Provides the player's policy: when buffered audio may play, and when running short starts a re-buffer. Pure.

The PortAudio callback (engine.backends.sounddevice_sink) asks it on every buffer and the benchmark's
`simulate_player` on every chunk, so the bench counts underruns by the player's own rule. Plain functions of
ints and bools: they allocate nothing and take no lock, as the callback requires.

Counts are in frames (or samples): whatever unit the caller's buffer counts in.
"""
from __future__ import annotations


def device_pull_s(latency_s: float) -> float:
    """Audio a device takes ahead of real time as it starts, at most: its buffer, primed at once, and a callback's
    block (through PulseAudio the buffer is a little more than the latency). A player's pre-roll is never less, or
    the primed buffer would run dry at once."""
    return 1.5 * latency_s


def may_play(playing: bool, rebuffering: bool, queued: int, preroll: int, rebuffer: int, at_end: bool) -> bool:
    """Whether the player plays now. Straight on while it plays without an underrun; otherwise, before an
    utterance's first sample (`playing` False: the pre-roll) or after an underrun (`rebuffering`: the re-buffer),
    once it holds that much audio, or when waiting cannot bring more (`at_end`: the producer marked the end of
    what it writes, or the buffer is full)."""
    if playing and not rebuffering:
        return True
    return queued >= (rebuffer if rebuffering else preroll) or at_end


def rebuffers_after(short: bool, playing: bool, rebuffer: int) -> bool:
    """Whether a read starts a re-buffer: it came up short while still playing (an underrun; a read that reaches
    the producer's end mark stops playing instead, a pause) and the player re-buffers at all (`rebuffer` > 0:
    with 0 it resumes with whatever arrives)."""
    return short and playing and rebuffer > 0


RESUME_GAP_S = 1.0
"""A watchdog poll that comes this long after the one before it means this process was not running in between
(stopped by SIGSTOP or Ctrl-Z, the machine asleep): its sleeps are a few milliseconds."""


def watch_progress(last: tuple[int, float, float], callbacks: int, now: float) -> tuple[int, float, float]:
    """The stall watchdog after a poll at `now`: (callback count seen, since when it has not moved, when this
    poll ran), from the state `last` of the poll before. The device has stalled once `now` minus the second field
    passes the timeout. The wait starts again when the count moved, and after a gap of RESUME_GAP_S between polls:
    PortAudio's callback runs in this process, so while the process was stopped it was stopped too, and that time
    says nothing about the device (a `say` stopped with Ctrl-Z for longer than the timeout was killed by its own
    watchdog on `fg`)."""
    seen, since, polled = last
    if callbacks != seen or now - polled > RESUME_GAP_S:
        return callbacks, now, now
    return seen, since, now
