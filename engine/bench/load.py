"""The open-loop load benchmark's pure core (`voicectl bench --load`): when requests arrive, what each one's
listener hears, and a rate's numbers. No I/O and no clock: the drivers (voiceapp.load_bench) record timelines and
hand them here, and the tests hand in scripted ones.

Open loop: requests arrive at a Poisson process of the given rate (exponential gaps, seeded), whether or not the
engine has finished the earlier ones, as independent users would; a closed loop (a fixed number of streams, the
next sent when one ends) slows its own arrivals when the engine slows and so hides a queue.

Each stream is played by a simulated listener from its first audio: our player's policy (engine.bench.playback
`simulate_player`: it starts once it holds the pre-roll, plays at real time, and after running dry waits for the
pre-roll again). An underrun is the audio received running out before more arrives; its length is the silence until
playing resumes.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from engine.bench.playback import simulate_player
from engine.bench.summary import percentile

SENTENCES = (
    "The train leaves at seven tonight.",
    "Please close the window before you go.",
    "My sister bought a new blue bicycle yesterday.",
    "Can you hear the rain on the roof?",
    "We walked along the river until sunset.",
    "The coffee is still too hot to drink.",
    "He forgot his keys at the office again.",
    "Turn left after the old stone bridge.",
    "Our neighbours are painting their fence bright green.",
    "The meeting moved to Thursday afternoon.",
    "She reads two books every single month.",
    "Dinner will be ready in ten minutes.",
)
"""Typical requests: single sentences of four to ten words."""

MAX_RATE = 1000.0
"""The highest arrival rate `--load` takes (requests a second)."""
MAX_STREAMS = 100_000
"""The most requests one rate may plan (rate times seconds)."""
PREROLL_S = 0.2
"""The listener's pre-roll: audio it holds before it starts playing (as `voicectl bench`'s player)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One planned request."""

    t: float
    """Seconds after the rate's start at which the request is sent."""
    text: str
    """What it asks to be spoken."""


def parse_rates(text: str) -> tuple[float, ...]:
    """`--load`'s comma-separated rates (requests a second), each finite, above 0 and at most MAX_RATE. ValueError
    with a one-line reason otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"expected comma-separated rates in requests a second, got {text!r}")
    rates = []
    for part in parts:
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a number (rates are requests a second, e.g. 5,10,20)") from None
        if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
            raise ValueError(f"{part}: a rate must be above 0 and at most {MAX_RATE:g} requests a second")
        rates.append(rate)
    return tuple(rates)


def schedule(rate: float, seconds: float, seed: int, sentences: Sequence[str] = SENTENCES) -> list[Arrival]:
    """A Poisson process of `rate` requests a second over `seconds`, each with a sentence drawn from `sentences`;
    the same for the same arguments."""
    if not (rate > 0 and seconds > 0):
        raise ValueError("rate and seconds must be above 0")
    rng = random.Random(f"{seed}:{rate!r}")
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < seconds:
        out.append(Arrival(t, rng.choice(sentences)))
        t += rng.expovariate(rate)
    return out


@dataclass
class StreamLog:
    """One request's timeline as a driver saw it (times in seconds on any one clock)."""

    start: float
    """When the request was sent."""
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """(arrival time, samples) for each piece of audio received."""
    end: float = math.nan
    """When the response ended (its last byte, a refusal or an error)."""
    refused: bool = False
    """Turned away because the server was full (HTTP 429)."""
    retry_after_s: float | None = None
    """The refusal's Retry-After, in seconds, where it carried one."""
    refusal: str = ""
    """Why it was turned away, as the refusal said (the 429 body's message; empty where it said nothing)."""
    error: str = ""
    """What went wrong otherwise (a failed request; empty when it was served)."""


@dataclass(frozen=True, slots=True)
class Heard:
    """What the simulated listener heard of one served stream."""

    first_s: float
    """From the request to its first audio."""
    underruns: int
    """Times the audio received ran out before more arrived."""
    underrun_s: float
    """Seconds of silence those underruns caused (until playing resumed)."""


def listen(log: StreamLog, sample_rate: int, preroll_s: float = PREROLL_S) -> Heard | None:
    """The listener's account of a stream; None where it got no audio."""
    if not log.chunks:
        return None
    played = simulate_player(log.chunks, sample_rate, preroll_s)
    return Heard(log.chunks[0][0] - log.start, played.underruns, played.silence_s)


def peak_concurrency(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at once; one that ends when another starts does not overlap it."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@dataclass
class RateResult:
    """One rate's numbers."""

    rate: float
    """Requests a second offered."""
    seconds: float
    """How long requests were sent for."""
    streams: int
    """Requests sent."""
    served: int
    """Requests that got audio."""
    refused: int
    """Requests turned away as the server was full (HTTP 429)."""
    failed: int
    """Requests that failed otherwise, or ended without audio."""
    first_ms_p50: float
    """Request to first audio, over the served streams (ms)."""
    first_ms_p95: float
    first_ms_max: float
    underran_share: float
    """The share of served streams whose listener ran dry at least once (0 to 1)."""
    underruns: int
    """Underruns over all served streams."""
    underrun_s: float
    """Seconds of silence they caused, over all served streams."""
    peak_concurrency: int
    """The most requests in flight at once (sent and not yet ended), refused ones left out."""
    retry_after_s: list[float] = field(default_factory=list)
    """The distinct Retry-After values the refusals carried, in seconds, sorted."""
    refusal_reasons: dict[str, int] = field(default_factory=dict)
    """Refusals by the reason they gave (`refusal_kind`: its numbers written N), most frequent first."""
    errors: list[str] = field(default_factory=list)
    """The distinct errors of the failed requests (at most a few)."""
    pauses: list[tuple[float, str, float]] = field(default_factory=list)
    """The driver process's long pauses while the rate ran: (at, s from the rate's first request; "gc0".."gc2" for
    a run of the cyclic garbage collector of that generation, "loop" for its event loop late to wake a task, "held"
    for the interpreter held from a timing thread, "decode BxL" for a slow decoder call of B windows of L codes;
    ms). In process they are the engine's; over HTTP the client's (and no decoder calls)."""
    trace: list[tuple[float, float | None, float, str]] = field(default_factory=list)
    """Each request in the order sent: (sent at, s from the rate's first; first audio, ms, None without audio;
    silence from underruns, ms; "served", "refused" or "failed"), so that a tail can be traced to when it came."""


def refusal_kind(reason: str) -> str:
    """A refusal's reason with its numbers written N and its retry advice left out, so that refusals for the same
    cause count together ("3 of 5 live streams are close to running dry" and "1 of 2 ..." alike)."""
    kind = reason.split("; try again")[0].strip()
    return re.sub(r"\d+(\.\d+)?", "N", kind) or "(no reason given)"


def refusal_counts(logs: Sequence[StreamLog]) -> dict[str, int]:
    """The refused streams counted by `refusal_kind`, most frequent first."""
    counts = Counter(refusal_kind(g.refusal) for g in logs if g.refused)
    return dict(counts.most_common())


def summarize_rate(rate: float, seconds: float, logs: Sequence[StreamLog], sample_rate: int,
                   preroll_s: float = PREROLL_S) -> RateResult:
    """One rate's numbers from its streams' timelines."""
    heard = []
    failed, errors = 0, list[str]()
    trace = list[tuple[float, float | None, float, str]]()
    t0 = min((log.start for log in logs), default=0.0)
    for log in logs:
        h = None if log.refused or log.error else listen(log, sample_rate, preroll_s)
        if h is not None:
            heard.append(h)
        elif not log.refused:
            failed += 1
            why = log.error or "no audio"
            if why not in errors and len(errors) < 5:
                errors.append(why)
        outcome = "refused" if log.refused else "served" if h is not None else "failed"
        trace.append((round(log.start - t0, 4), None if h is None else round(h.first_s * 1e3, 1),
                      0.0 if h is None else round(h.underrun_s * 1e3, 1), outcome))
    firsts = [h.first_s * 1e3 for h in heard]
    spans = [(log.start, log.end if not math.isnan(log.end) else (log.chunks[-1][0] if log.chunks else log.start))
             for log in logs if not log.refused]
    return RateResult(
        rate=rate, seconds=seconds, streams=len(logs), served=len(heard), refused=sum(1 for g in logs if g.refused),
        failed=failed, first_ms_p50=percentile(firsts, 50), first_ms_p95=percentile(firsts, 95),
        first_ms_max=max(firsts, default=math.nan),
        underran_share=sum(1 for h in heard if h.underruns) / len(heard) if heard else math.nan,
        underruns=sum(h.underruns for h in heard), underrun_s=sum(h.underrun_s for h in heard),
        peak_concurrency=peak_concurrency(spans),
        retry_after_s=sorted({g.retry_after_s for g in logs if g.refused and g.retry_after_s is not None}),
        refusal_reasons=refusal_counts(logs), errors=errors, trace=trace)


def rate_json(result: RateResult) -> dict[str, Any]:
    """A rate as the report's JSON stores it: times to 0.1 ms, shares and seconds to 3 places, NaN as null."""
    def tidy(key: str, value: Any) -> Any:
        if not isinstance(value, float):
            return value
        if math.isnan(value):
            return None
        return round(value, 1 if key.endswith("_ms") or "_ms_" in key else 3)
    return {k: tidy(k, v) for k, v in result.__dict__.items()}


def format_table(results: Sequence[RateResult]) -> str:
    """The rates as a Markdown table."""
    lines = ["| rate (req/s) | sent | served | refused (Retry-After s) | failed | first audio p50 / p95 / max (ms) "
             "| underran (share) | underrun (s) | peak concurrency |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        retry = f" ({', '.join(f'{s:g}' for s in r.retry_after_s)})" if r.retry_after_s else ""
        share = "-" if math.isnan(r.underran_share) else f"{r.underran_share:.0%}"
        lines.append(f"| {r.rate:g} | {r.streams} | {r.served} | {r.refused}{retry} | {r.failed} | "
                     f"{r.first_ms_p50:.0f} / {r.first_ms_p95:.0f} / {r.first_ms_max:.0f} | {share} | "
                     f"{r.underrun_s:.2f} | {r.peak_concurrency} |")
    return "\n".join(lines)
