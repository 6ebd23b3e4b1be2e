"""Pacer: stream while speech comes faster than it plays; once slower, whole sentences (pauses between sentences,
none inside); the time spent blocked on a full player is not the engine's; a CPU engine's first sentence waits
for its speed, which a late first chunk cannot make look fast."""
import math

import pytest

from engine.bench.playback import paced_sentence
from engine.pacing import MIN_EVIDENCE_S, MIN_INTERVALS, REALTIME_MARGIN, Pacer


def feed(pacer, sentences, speed, t=0.0, chunk_s=0.24, blocked_s=0.0, pace=None):
    """Sentences of `chunk_s` chunks made at `speed` x real time, in a new request (or `pace`'s); returns (held per
    chunk, end time)."""
    pace = pace or pacer.request()
    holds = []
    for count in sentences:
        for i in range(count):
            t += chunk_s / speed + blocked_s
            holds.append(pace.arrived(chunk_s, i == count - 1, t))
            if not holds[-1]:
                pace.blocked(blocked_s)
    return holds, t


def test_a_fast_engine_streams_every_chunk():
    pacer = Pacer()
    holds, _ = feed(pacer, [5, 3], speed=4.0)
    assert not any(holds) and not pacer.slow and pacer.speed > REALTIME_MARGIN
    assert pacer.notice() is None


def test_a_slow_engine_plays_whole_sentences_after_the_first_and_says_so_once():
    pacer = Pacer()
    holds, _ = feed(pacer, [5, 4, 3], speed=0.6)
    first, second, third = holds[:5], holds[5:9], holds[9:]
    assert not any(first)  # it was already playing when the speed showed: it goes on as it comes
    assert second == [True, True, True, False] and third == [True, True, False]
    assert pacer.slow and 0.5 < pacer.speed < 0.7
    message = pacer.notice()
    assert message.startswith("speech comes at 0.60x real time") and pacer.notice() is None


def test_a_probed_first_sentence_waits_for_its_speed():
    slow, fast = Pacer(probe_first=True), Pacer(probe_first=True)
    assert feed(slow, [5], speed=0.6)[0] == [True, True, True, True, False]  # whole: no gap inside
    holds, _ = feed(fast, [5], speed=3.0)
    assert holds[:2] == [True, True] and not any(holds[2:])  # only until two intervals gave its speed
    assert MIN_INTERVALS == 2 and 0.24 >= MIN_EVIDENCE_S


def test_time_blocked_on_a_full_player_is_not_the_engines():
    pacer = Pacer()
    # chunks come at playback speed only because each write waited on the player
    holds, _ = feed(pacer, [6, 6], speed=3.0, blocked_s=0.16)
    assert not any(holds) and not pacer.slow


def test_pacing_ends_when_the_machine_gets_fast_again():
    pacer = Pacer()
    feed(pacer, [3, 3], speed=0.5)
    assert pacer.slow
    holds, t = feed(pacer, [3], speed=3.0)
    assert holds == [True, True, False] and not pacer.slow  # released as soon as two intervals show its speed
    assert not any(feed(pacer, [3], speed=3.0, t=t)[0])


def gapless(pacer, count, speed, planned_s, chunk_s=0.24, chunks=None):
    """One sentence of `count` chunks made at `speed` (or of `chunks`' durations), after the pacer has measured that
    speed: whether playing from its release on (at a chunk, or on the clock at `release_at` between chunks) keeps
    ahead of what plays (each chunk there before the audio before it has played out), and the release time."""
    return played_through(pacer, arrivals_at(chunks or [chunk_s] * count, speed), planned_s)


def arrivals_at(chunks, speed):
    """(seconds, time) of chunks made one after another at `speed`."""
    t, out = 0.0, []
    for seconds in chunks:
        t += seconds / speed
        out.append((seconds, t))
    return out


def played_through(pacer, chunks, planned_s):
    """`chunks` ((seconds, time)) of one sentence through a new request of `pacer`: whether playing from its release
    on keeps ahead of what plays, and the release time."""
    start, slack = paced_sentence(pacer.request(), [(at, seconds, i == len(chunks) - 1, planned_s)
                                                    for i, (seconds, at) in enumerate(chunks)])
    return slack >= -1e-9, start


def test_a_slow_engine_pre_rolls_what_its_speed_needs_and_plays_without_a_gap():
    pacer = Pacer()
    feed(pacer, [4], speed=0.8)  # measured
    count = 20
    ok, release = gapless(pacer, count, 0.8, planned_s=count * 0.24)
    assert ok
    whole = count * 0.24 / 0.8
    assert release < whole / 2  # it started long before the sentence was complete
    planned, slower = count * 0.24, pacer.speed / REALTIME_MARGIN  # a steady flow: the end comes latest
    assert pacer.start_after(planned, 0.24, 1) == pytest.approx((planned - 0.24) / slower - planned)


def test_less_pre_roll_would_open_a_gap():
    pacer = Pacer()
    feed(pacer, [4], speed=0.8)
    ok, _ = gapless(pacer, 20, 0.8, planned_s=20 * 0.24 / 3)  # a plan too short: too little held
    assert not ok


def test_an_unknown_length_is_held_whole_and_a_fast_engine_never_pre_rolls():
    slow = Pacer()
    feed(slow, [4], speed=0.8)
    assert slow.start_after(None, 0.24, 1) == math.inf
    fast = Pacer()
    feed(fast, [4], speed=3.0)
    assert fast.start_after(10.0, 0.24, 1) == -math.inf


def test_concurrent_requests_on_one_engine_keep_their_own_sentences():
    pacer = Pacer()
    feed(pacer, [4], speed=0.6)
    a, b = pacer.request(), pacer.request()
    assert a.arrived(0.24, False, 1.0, planned_s=0.9)  # held: its pre-roll is 0.9·(1 - 0.6/1.15) = 0.43 s
    assert not b.arrived(0.24, True, 1.1, planned_s=0.9)  # b's sentence ends; a's goes on
    assert not a.arrived(0.24, False, 1.4, planned_s=0.9)  # a holds 0.48 s of its sentence now: released


SCHEDULE_S = (0.08, 0.24, 0.48, 0.96, 1.92)
"""The audio of a sentence's first chunks under the default window schedule (engine.windowing)."""


def arrivals(speed, late_s=0.0, burst_s=0.01):
    """(seconds, time) of a sentence's chunks from an engine making `speed` x real time whose first chunk came
    `late_s` late (a slow first decode, while the LLM went on): the chunks whose codes were made meanwhile follow
    it `burst_s` apart."""
    made, out = 0.0, []
    for seconds in SCHEDULE_S:
        made += seconds / speed
        at = max(made, out[-1][1] + burst_s if out else made + late_s)
        out.append((seconds, at))
    return out


def test_a_late_first_chunk_does_not_make_a_slow_engine_look_fast():
    pacer = Pacer(probe_first=True)
    pace, holds = pacer.request(), []
    chunks = arrivals(0.8, late_s=0.28)
    (_, t1), (_, t2), (_, t3) = chunks[:3]
    assert 0.24 / (t2 - t1) > 10 * REALTIME_MARGIN  # the interval after the late chunk: a burst
    assert (0.24 + 0.48) / (t3 - t1) > REALTIME_MARGIN  # and so is the span that starts with it
    for i, (seconds, at) in enumerate(chunks):
        holds.append(pace.arrived(seconds, i == len(chunks) - 1, at, planned_s=5.0))
    assert pacer.slow and pacer.speed == pytest.approx(0.8)
    assert holds[:3] == [True] * 3  # held past the burst, until its pre-roll: 5.0·(1 - 0.8/1.15) = 1.52 s


def test_a_fast_engine_is_judged_fast_at_its_third_chunk_and_a_cuda_one_never_waits():
    probed = Pacer(probe_first=True)
    pace = probed.request()
    holds = [pace.arrived(seconds, False, at, planned_s=5.0) for seconds, at in arrivals(3.0)]
    assert holds == [True, True, False, False, False] and not probed.slow and probed.speed == pytest.approx(3.0)
    assert probed.start_after(5.0, 0.8, 3) == -math.inf
    cuda = Pacer()  # probe_first off: plays from its first chunk
    pace = cuda.request()
    assert not any(pace.arrived(seconds, False, at / 50, planned_s=5.0) for seconds, at in arrivals(3.0))
    assert not cuda.slow


def test_a_sentence_too_short_for_two_intervals_leaves_the_next_one_probed():
    pacer = Pacer(probe_first=True)
    pace = pacer.request()
    assert pace.arrived(0.08, False, 1.0) and not pace.arrived(0.24, True, 1.01)  # one interval: no speed
    assert pacer.speed is None and not pacer.slow
    assert pace.arrived(0.08, False, 1.5)  # the request's next sentence waits for its speed in turn
    assert pace.arrived(0.24, False, 1.8)
    assert not pace.arrived(0.48, False, 2.0) and not pacer.slow  # 0.48 s in 0.2 s, 0.72 s in 0.5 s: fast


def test_a_burst_after_a_late_chunk_does_not_end_pacing_early():
    pacer = Pacer()
    feed(pacer, [3, 3], speed=0.5)
    assert pacer.slow
    pace = pacer.request()
    holds = [pace.arrived(seconds, i == 4, at, planned_s=5.0) for i, (seconds, at) in
             enumerate(arrivals(0.8, late_s=0.28))]
    assert holds[:3] == [True] * 3 and pacer.slow


WINDOWS_S = (0.08, 0.24, 0.48, 0.96, 1.92)
"""The default schedule's windows (engine.factory.windows_s): each arrives whole."""


def windows_of(length_s):
    """The chunks a sentence of `length_s` comes in under WINDOWS_S (the last window repeats, the end is cut)."""
    chunks, made = [], 0.0
    while made < length_s - 1e-9:
        chunks.append(min(WINDOWS_S[min(len(chunks), len(WINDOWS_S) - 1)], length_s - made))
        made += chunks[-1]
    return chunks


def measured(speed, windows_s=WINDOWS_S):
    pacer = Pacer(windows_s=windows_s)
    pacer.judge(speed)
    return pacer


@pytest.mark.parametrize("speed", [0.6, 0.8, 0.9, 1.1, 1.3, 1.6, 2.0, 3.0])
def test_windows_that_come_whole_are_held_for_at_every_speed(speed):
    cap = 5.64
    for codes in range(60, 283, 7):
        ok, release = gapless(measured(speed), 0, speed, planned_s=cap, chunks=windows_of(codes * 0.02))
        assert ok, (speed, codes)


def test_a_steady_flow_pre_roll_underruns_on_the_last_large_window():
    misses = [codes for codes in range(176, 283, 7)
              if not gapless(measured(0.85, windows_s=()), 0, 0.85, planned_s=5.64,
                             chunks=windows_of(codes * 0.02))[0]]
    assert misses


def test_an_engine_many_times_real_time_plays_its_first_window_at_once():
    assert measured(40.0).start_after(5.64, 0.08, 1) < 0
    assert measured(1.6).start_after(None, 0.08, 1) == -math.inf  # length unknown, fast enough: nothing to plan with


def test_sentence_ends_are_pauses_where_a_next_sentence_may_be_held():
    assert Pacer(probe_first=True, windows_s=WINDOWS_S).holds_sentences  # a CPU engine
    gpu = Pacer(windows_s=WINDOWS_S)
    assert not gpu.holds_sentences
    gpu.judge(0.5)
    assert gpu.holds_sentences  # measured slow


@pytest.mark.parametrize("speed", [0.85, 1.1])
def test_a_held_sentence_starts_on_the_clock_between_chunks(speed):
    """Windows made at the measured speed: the sentence starts between two of its chunks, not at the next one, and
    plays through."""
    chunks = arrivals_at(windows_of(5.5), speed)
    ok, release = played_through(measured(speed), chunks, planned_s=5.5)
    assert ok and all(abs(release - at) > 0.01 for _, at in chunks)
    pace = measured(speed).request()
    assert pace.release_at() is None  # nothing held yet
    for seconds, at in chunks[:2]:  # held, but its own speed is not known yet: it starts only as a chunk comes
        assert pace.arrived(seconds, False, at, 5.5) and pace.release_at() is None
    assert pace.arrived(chunks[2][0], False, chunks[2][1], 5.5)
    assert pace.release_at() > chunks[2][1]  # measured now: it has a moment of its own
    pace.release()
    assert pace.release_at() is None and not pace.arrived(chunks[3][0], False, chunks[3][1], 5.5)


@pytest.mark.parametrize("speed", [0.6, 0.85, 1.1])
@pytest.mark.parametrize("made", [1, 3, 4])
def test_the_start_is_the_earliest_from_which_no_window_comes_late(speed, made):
    """From a sentence's `made`-th chunk on, windows that come exactly as predicted (the measured speed over the
    margin) are each there in time when it starts at `start_after`, and one of them is late if it starts a tenth
    of a second sooner."""
    pacer, windows = measured(speed), windows_of(5.5)
    made_s, slower = sum(windows[:made]), speed / REALTIME_MARGIN
    start = pacer.start_after(5.5, made_s, made)
    ends = [sum(windows[:k + 1]) for k in range(made, len(windows))]
    slack = [start + (end - w) - (end - made_s) / slower for end, w in zip(ends, windows[made:])]
    assert min(slack) == pytest.approx(0.0, abs=1e-9)


def test_a_probed_sentence_has_no_start_time_before_its_speed():
    pace = Pacer(probe_first=True, windows_s=WINDOWS_S).request()
    for seconds, at in arrivals(0.8)[:2]:
        assert pace.arrived(seconds, False, at, planned_s=5.0) and pace.release_at() is None


FINER_S = (0.08, 0.24, 0.36, 0.54, 0.8, 1.2, 1.28)
"""The finer schedule's windows (WindowSchedule.finer: an engine whose decoder has cores of its own)."""
MEASURED_SENTENCE = [(0.08, 0.0), (0.24, 0.126), (0.36, 0.289), (0.54, 0.563), (0.8, 0.937), (1.2, 1.467),
                     (1.28, 2.027), (1.28, 2.55), (1.28, 3.198), (1.28, 3.763), (1.28, 4.358), (0.98, 4.707)]
"""(seconds, time since its first chunk) of a read's second sentence on a 16-core CPU engine that made the sentence
before at 2.2x real time (lab.chunk_trace on a lent machine's Xeon, int8): its small first windows came slower."""


def test_a_sentence_is_not_started_on_the_clock_by_the_speed_of_the_one_before():
    pacer = Pacer(windows_s=FINER_S)  # as in a request whose first sentence was measured already
    pacer.judge(2.23)
    chunks = [(seconds, 5.0 + at) for seconds, at in MEASURED_SENTENCE]
    ok, release = played_through(pacer, chunks, planned_s=10.6)
    assert ok and release in [at for _, at in chunks]  # it started as a chunk came, without a gap


AHEAD_S = (0.8, 0.48, 0.96, 1.92)
"""The windows of a sentence rendered ahead of its turn (WindowSchedule.ahead, engine.factory.windows_s)."""


def ahead_sentence(length_s, speed, turn):
    """(chunks as paced_sentence takes them, when each was made) of a sentence of `length_s` rendered ahead at `speed`
    x real time from 0 in AHEAD_S windows, whose turn comes at `turn`: what was made by then comes out at once."""
    sizes, made = [], 0.0
    while made < length_s - 1e-9:
        sizes.append(min(AHEAD_S[min(len(sizes), len(AHEAD_S) - 1)], length_s - made))
        made += sizes[-1]
    made_at = [sum(sizes[:k + 1]) / speed for k in range(len(sizes))]
    chunks = [(max(turn, at) + 0.001 * k, seconds, k == len(sizes) - 1, length_s)
              for k, (seconds, at) in enumerate(zip(sizes, made_at))]
    return chunks, made_at


@pytest.mark.parametrize("speed", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("turn", [2.0, 4.0])
def test_a_sentence_rendered_ahead_is_timed_by_when_it_was_made(speed, turn):
    """Rendered ahead of its turn, beside the sentence before: when its turn comes, what was made comes out at once.
    Timed by when it was made, the engine's speed stays what it is and the sentence plays through."""
    chunks, made = ahead_sentence(8.0, speed, turn)
    assert sum(1 for at, *_ in chunks if at < turn + 0.01) >= 1  # what was made by its turn comes out then
    pacer = Pacer(probe_first=True, windows_s=WINDOWS_S, ahead_windows_s=AHEAD_S)
    pacer.judge(speed)  # the request's first sentence measured it
    start, slack = paced_sentence(pacer.request(), chunks, made)
    assert slack >= -1e-9 and start >= turn and pacer.slow and pacer.speed == pytest.approx(speed)


@pytest.mark.parametrize("speed,turn", [(0.5, 4.0), (0.7, 4.0), (0.9, 2.0)])
def test_timed_by_when_it_came_out_a_burst_opens_a_gap(speed, turn):
    """The same sentences timed by when they came out: the burst at its turn looks fast and the sentence starts too
    soon."""
    chunks, _ = ahead_sentence(8.0, speed, turn)
    by_arrival = Pacer(probe_first=True, windows_s=WINDOWS_S, ahead_windows_s=AHEAD_S)
    by_arrival.judge(speed)
    assert paced_sentence(by_arrival.request(), chunks)[1] < 0


def test_a_sentence_rendered_ahead_is_held_for_its_own_larger_windows():
    """Its later windows are predicted in AHEAD_S: the default schedule's smaller ones would start it too soon."""
    ahead = Pacer(windows_s=WINDOWS_S, ahead_windows_s=AHEAD_S)
    ahead.judge(0.6)
    assert ahead.start_after(8.0, 1.28, 2, ahead=True) > ahead.start_after(8.0, 1.28, 2)
    assert ahead.start_after(8.0, 1.28, 2, ahead=True) == Pacer(windows_s=AHEAD_S, speed=0.6, slow=True).start_after(
        8.0, 1.28, 2)


def test_time_blocked_on_the_player_counts_for_a_sentence_rendered_ahead():
    """Its chunks were made whatever `speak` did: a wait on the player is not taken off their times."""
    pace = Pacer(windows_s=WINDOWS_S, ahead_windows_s=AHEAD_S).request()
    for k, at in enumerate((1.0, 2.0, 3.0)):
        pace.arrived(0.8, False, 10.0 + k, planned_s=8.0, made_at=at)
        pace.blocked(0.5)
    assert pace.pacer.speed == pytest.approx(0.8)


def chunks_at(pace, times_sizes, end_last=True):
    """One sentence's chunks of (arrival time, seconds of audio)."""
    for i, (t, seconds) in enumerate(times_sizes):
        pace.arrived(seconds, end_last and i == len(times_sizes) - 1, t)


def test_the_lead_is_the_least_audio_in_hand_as_each_later_chunk_comes():
    """Played from its first chunk (80 ms) as it came: the second comes 30 ms later (50 ms in hand), the third 100
    ms after the first (320 ms came before it: 220 ms in hand); the request's first sentence only counts."""
    pacer = Pacer()
    pace = pacer.request()
    chunks_at(pace, [(1.0, 0.08), (1.03, 0.24), (1.1, 0.48)])
    assert pacer.lead_s == pytest.approx(0.05)
    chunks_at(pace, [(1.2, 0.08), (1.5, 0.24)])  # the second sentence: 220 ms behind, not the lead
    assert pacer.lead_s == pytest.approx(0.05)
    chunks_at(pacer.request(), [(2.0, 0.08)])  # one chunk says nothing of the lead: the last one stays
    assert pacer.lead_s == pytest.approx(0.05)


@pytest.mark.parametrize("lead, expected", [(0.06, 0.0), (0.045, 0.2), (0.03, 0.2)])
def test_a_player_starts_at_the_first_chunk_only_where_the_lead_outlasts_the_device_pull(lead, expected):
    """A device that takes 40 ms as it starts, + LEAD_MARGIN_S (10 ms): a lead of 60 ms plays from the first chunk
    (the floor, 0), one of 45 ms waits for the default 0.2 s."""
    assert Pacer(speed=5.0, lead_s=lead).preroll_s(0.2, 0.0, pull_s=0.04) == expected


def test_an_unmeasured_slow_or_barely_fast_engine_keeps_the_default_pre_roll():
    assert Pacer().preroll_s(0.2, 0.0, 0.03) == 0.2  # nothing measured
    assert Pacer(speed=5.0).preroll_s(0.2, 0.0, 0.03) == 0.2  # no lead yet
    assert Pacer(speed=5.0, slow=True, lead_s=1.0).preroll_s(0.2, 0.0, 0.03) == 0.2
    assert Pacer(speed=1.3, lead_s=1.0).preroll_s(0.2, 0.0, 0.03) == 0.2  # under RECOVERED_MARGIN
    assert Pacer(speed=1.5, lead_s=1.0).preroll_s(0.2, 0.0, 0.03) == 0.0


HELLO = {"paced_start": True, "paced_windows_s": [0.08, 0.24, 0.48], "paced_ahead_windows_s": [0.8, 0.48]}
"""A CPU engine's pacing in a server's hello (engine.engine_api.describe_engine)."""


def test_what_a_server_measured_travels_in_its_hello_and_spares_a_fast_engine_the_probe():
    """The server's pacer measures its requests as it sends them; `say`, which lives for one request, starts from
    that: a fast engine is not probed again and keeps the lead it came with, a slow one is still probed."""
    server = Pacer()
    chunks_at(server.request(), [(1.0, 0.08), (1.03, 0.24), (1.05, 0.48), (1.07, 0.96)])
    told = {**HELLO, **server.measured()}
    assert told["paced_speed"] > 20 and told["paced_slow"] is False and told["paced_lead_s"] == pytest.approx(0.05)
    say = Pacer.from_hello(told, learnt=True)
    assert not say.probe_first and say.fast and say.lead_s == pytest.approx(0.05) and say.windows_s == (0.08, 0.24, 0.48)
    assert not say.request().arrived(0.08, False, 5.0)  # its first chunk goes to the player at once
    slow = Pacer.from_hello({**HELLO, "paced_speed": 1.2, "paced_slow": True, "paced_lead_s": None}, learnt=True)
    assert slow.probe_first and slow.slow and slow.request().arrived(0.08, False, 5.0)
    barely = Pacer.from_hello({**HELLO, "paced_speed": 1.3, "paced_slow": False}, learnt=True)
    assert barely.probe_first  # under RECOVERED_MARGIN: learnt again
    fresh = Pacer.from_hello({**HELLO, **Pacer().measured()}, learnt=True)
    assert fresh.probe_first and fresh.speed is None
    kept = Pacer.from_hello(told)  # a client that keeps its own pacer (the speechd module) learns for itself
    assert kept.probe_first and kept.speed is None
    assert not Pacer.from_hello(told, probe=False, learnt=True).probe_first  # a file is never held


def test_an_infinite_speed_is_not_told():
    """All of a sentence at once measures as infinitely fast: JSON has no inf, so nothing is told (clients probe)."""
    server = Pacer(speed=math.inf)
    assert server.measured()["paced_speed"] is None
