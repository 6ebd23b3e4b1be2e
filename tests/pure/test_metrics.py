"""engine.metrics: one request's events folded into the numbers every front end shows."""
from __future__ import annotations

from engine.events import (ChunkDecoded, FirstAudio, FirstToken, Notice, RequestFinished, RequestStarted,
                           SentenceFinished, StartupPhase)
from engine.metrics import RequestMetrics


def test_a_request_folds_into_latencies_audio_and_counts() -> None:
    m = RequestMetrics(sample_rate=16000)
    m.apply(StartupPhase("decoder", 1.5))
    m.apply(StartupPhase("lane", 0.25))
    m.apply(StartupPhase("lane", 0.5))
    m.apply(RequestStarted("r", t=10.0))
    m.apply(FirstToken("r", 0.05, t=10.05))
    m.apply(FirstAudio("r", 0.12, t=10.12))
    m.apply(ChunkDecoded("r", 0, codes=50, samples=16000, decode_s=0.01, t=10.5))
    assert (m.t0, m.ttft_s, m.ttfa_s, m.tokens, m.audio_s, m.elapsed_s) == (10.0, 0.05, 0.12, 50, 1.0, 0.5)
    assert m.wall_rtf is None and not m.finished                       # RTF once the request is done
    m.apply(SentenceFinished("r", 0, tokens=50, hit_limit=False))
    m.apply(Notice("fell back to the CPU"))
    m.apply(RequestFinished("r", audio_s=4.0, wall_s=3.0, rtf=0.75, tokens=200, cancelled=False, t=13.0))
    assert m.finished and (m.tokens, m.audio_s, m.wall_s, m.elapsed_s, m.wall_rtf) == (200, 4.0, 3.0, 3.0, 0.75)
    assert m.sentences == 1 and m.notices == ["fell back to the CPU"] and m.phases == {"decoder": 1.5, "lane": 0.75}
    assert round(m.process_ttfa_s(process_start=8.0), 6) == 2.12


def test_onset_is_recorded_once_and_only_from_a_known_start() -> None:
    m = RequestMetrics()
    assert not m.heard_at(5.0) and m.onset_s is None                    # no RequestStarted yet
    m.apply(RequestStarted("r", t=10.0))
    assert not m.heard_at(None) and m.heard_at(10.25) and m.onset_s == 0.25
    assert not m.heard_at(11.0) and m.onset_s == 0.25


def test_nothing_known_before_any_event() -> None:
    m = RequestMetrics()
    assert m.ttfa_s is None and m.process_ttfa_s(0.0) is None and m.wall_rtf is None and m.audio_s == 0.0
