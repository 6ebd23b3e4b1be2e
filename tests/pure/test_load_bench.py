"""The load benchmark's pure core (engine.bench.load): the arrival schedule, the listener on scripted timelines
whose underruns are known, peak concurrency and a rate's numbers (refusals counted by reason)."""
import math
import statistics

import pytest

from engine.bench.load import (MAX_RATE, SENTENCES, StreamLog, format_table, listen, parse_rates, peak_concurrency,
                               rate_json, schedule, summarize_rate)

RATE = 1000  # samples a second: a chunk of 100 samples is 0.1 s


def test_sentences_are_four_to_ten_words():
    assert all(4 <= len(s.split()) <= 10 for s in SENTENCES)


def test_the_schedule_is_poisson_seeded_and_within_its_window():
    a = schedule(20.0, 200.0, seed=3)
    assert a == schedule(20.0, 200.0, seed=3)
    assert a != schedule(20.0, 200.0, seed=4)
    assert all(0 <= x.t < 200.0 for x in a) and [x.t for x in a] == sorted(x.t for x in a)
    assert 3600 < len(a) < 4400  # 4000 expected; a Poisson count's sd is 63
    gaps = [b.t - x.t for x, b in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.05, rel=0.1)
    # exponential gaps: the sd equals the mean (evenly spaced arrivals would have none)
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.15)
    assert {x.text for x in a} == set(SENTENCES)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "1e9", "abc", "", " , ", "5,0"])
def test_bad_rates_are_refused_with_a_reason(text):
    with pytest.raises(ValueError) as caught:
        parse_rates(text)
    assert "\n" not in str(caught.value)


def test_good_rates_parse():
    assert parse_rates("5, 10,20.5") == (5.0, 10.0, 20.5)
    assert parse_rates(f"{MAX_RATE:g}") == (MAX_RATE,)


def test_a_stream_faster_than_real_time_never_runs_dry():
    log = StreamLog(0.0, [(0.3 + 0.05 * k, 100) for k in range(20)])  # 0.1 s of audio every 0.05 s
    heard = listen(log, RATE)
    assert heard.first_s == pytest.approx(0.3)
    assert heard.underruns == 0 and heard.underrun_s == 0


def test_a_late_chunk_is_one_underrun_of_known_length():
    # 0.2 s pre-roll: playing starts at 1.1 with 0.3 s held, runs dry at 1.4; the next chunk comes at 1.6 with
    # the 0.2 s the listener waits for again, so 0.2 s of silence; then the rest arrives in time
    log = StreamLog(0.5, [(1.0, 100), (1.1, 200), (1.6, 200), (1.7, 100)])
    heard = listen(log, RATE, preroll_s=0.2)
    assert heard.first_s == pytest.approx(0.5)
    assert heard.underruns == 1
    assert heard.underrun_s == pytest.approx(0.2)


def test_a_stream_at_half_real_time_runs_dry_again_and_again():
    log = StreamLog(0.0, [(0.2 * k, 100) for k in range(1, 31)])  # 0.1 s of audio every 0.2 s
    heard = listen(log, RATE, preroll_s=0.2)
    assert heard.underruns >= 5
    assert heard.underrun_s > 1.0


def test_no_audio_is_nothing_heard():
    assert listen(StreamLog(0.0), RATE) is None


def test_peak_concurrency_counts_overlaps_not_touches():
    assert peak_concurrency([]) == 0
    assert peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1
    assert peak_concurrency([(0, 5), (1, 2), (1.5, 3), (4, 6)]) == 3


def test_a_rate_summarized_from_scripted_streams():
    ok = [StreamLog(k, [(k + 0.1 * (k + 1), 100), (k + 0.15 * (k + 1), 2000)], end=k + 3) for k in range(4)]
    late = StreamLog(0.5, [(0.6, 300), (2.0, 300)], end=2.0)  # dry from 0.9 to 2.0 (resumes with 0.3 s held)
    refused = [StreamLog(0.7, end=0.71, refused=True, retry_after_s=s) for s in (2.0, 2.0, 5.0)]
    failed = StreamLog(0.8, end=0.9, error="HTTP 500: boom")
    r = summarize_rate(4.0, 10.0, [*ok, late, *refused, failed], RATE, preroll_s=0.2)
    assert (r.streams, r.served, r.refused, r.failed) == (9, 5, 3, 1)
    assert r.first_ms_p50 == pytest.approx(200) and r.first_ms_max == pytest.approx(400)
    assert r.underran_share == pytest.approx(1 / 5)
    assert r.underruns == 1 and r.underrun_s == pytest.approx(1.1)
    assert r.retry_after_s == [2.0, 5.0] and r.errors == ["HTTP 500: boom"]
    # stream 0 (0..3), late (0.5..2), failed (0.8..0.9); the refused (0.7..0.71) do not count; stream 1 from 1
    assert r.peak_concurrency == 3
    j = rate_json(r)
    assert j["underran_share"] == 0.2 and j["first_ms_p50"] == 200.0
    assert "| 4 | 9 | 5 | 3 (2, 5) | 1 |" in format_table([r])
    assert r.trace[0] == (0.0, 100.0, 0.0, "served") and r.trace[4] == (0.5, 100.0, 1100.0, "served")
    assert [t[3] for t in r.trace[5:]] == ["refused"] * 3 + ["failed"] and r.trace[-1][:3] == (0.8, None, 0.0)


def test_a_rate_with_nothing_served_has_no_figures_but_a_table_row():
    r = summarize_rate(1.0, 1.0, [StreamLog(0.0, end=0.1, refused=True)], RATE)
    assert r.served == 0 and math.isnan(r.first_ms_p50) and math.isnan(r.underran_share)
    assert rate_json(r)["first_ms_p50"] is None and rate_json(r)["underran_share"] is None
    assert "| 1 | 1 | 0 | 1 |" in format_table([r])


def test_refusals_are_counted_by_their_reason_numbers_aside():
    refused = [StreamLog(0.0, end=0.1, refused=True, refusal=why) for why in (
        "this server is at capacity (1 of 2 live streams are close to running dry); try again in 1 s",
        "this server is at capacity (3 of 5 live streams are close to running dry); try again in 4 s",
        "this server is at capacity (4 live streams would slow to 1.02x real time with one more); try again in 1 s",
        "")]
    r = summarize_rate(1.0, 1.0, refused, RATE)
    assert r.refusal_reasons == {"this server is at capacity (N of N live streams are close to running dry)": 2,
                                 "this server is at capacity (N live streams would slow to Nx real time with one "
                                 "more)": 1, "(no reason given)": 1}
    assert rate_json(r)["refusal_reasons"] == r.refusal_reasons
