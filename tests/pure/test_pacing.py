"""Pacer: stream while speech comes faster than it plays; once slower, whole sentences (pauses between sentences,
none inside); the time spent blocked on a full player is not the engine's; a CPU engine's first sentence waits
for its speed."""
import pytest

from engine.pacing import MIN_EVIDENCE_S, REALTIME_MARGIN, Pacer


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
    assert holds[0] and not any(holds[1:])  # only until the second chunk gave its speed
    assert 0.24 >= MIN_EVIDENCE_S


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
    assert holds == [True, False, False] and not pacer.slow  # released as soon as its speed shows
    assert not any(feed(pacer, [3], speed=3.0, t=t)[0])


def gapless(pacer, count, speed, planned_s, chunk_s=0.24):
    """One sentence of `count` chunks made at `speed`, after the pacer has measured that speed: whether playing
    from its release on keeps ahead of what plays (the audio made by each moment covers the audio played)."""
    pace, t, made, release = pacer.request(), 0.0, [], None
    for i in range(count):
        t += chunk_s / speed
        made.append((t, chunk_s))
        if not pace.arrived(chunk_s, i == count - 1, t, planned_s) and release is None:
            release = t
    start, have = release, 0.0
    for at, seconds in made:  # each chunk must be there before the audio before it has played out
        if at > start + have + 1e-9:
            return False, release
        have += seconds
    return True, release


def test_a_slow_engine_pre_rolls_what_its_speed_needs_and_plays_without_a_gap():
    pacer = Pacer()
    feed(pacer, [4], speed=0.8)  # measured
    count = 20
    ok, release = gapless(pacer, count, 0.8, planned_s=count * 0.24)
    assert ok
    whole = count * 0.24 / 0.8
    assert release < whole / 2  # it started long before the sentence was complete
    assert pacer.preroll_s(count * 0.24) == pytest.approx(count * 0.24 * (1 - pacer.speed / REALTIME_MARGIN))


def test_less_pre_roll_would_open_a_gap():
    pacer = Pacer()
    feed(pacer, [4], speed=0.8)
    ok, _ = gapless(pacer, 20, 0.8, planned_s=20 * 0.24 / 3)  # a plan too short: too little held
    assert not ok


def test_an_unknown_length_is_held_whole_and_a_fast_engine_never_pre_rolls():
    slow = Pacer()
    feed(slow, [4], speed=0.8)
    assert slow.preroll_s(None) == float("inf")
    fast = Pacer()
    feed(fast, [4], speed=3.0)
    assert fast.preroll_s(10.0) == 0.0


def test_concurrent_requests_on_one_engine_keep_their_own_sentences():
    pacer = Pacer()
    feed(pacer, [4], speed=0.6)
    a, b = pacer.request(), pacer.request()
    assert a.arrived(0.24, False, 1.0, planned_s=0.9)  # held: its pre-roll is 0.9·(1 - 0.6/1.15) = 0.43 s
    assert not b.arrived(0.24, True, 1.1, planned_s=0.9)  # b's sentence ends; a's goes on
    assert not a.arrived(0.24, False, 1.4, planned_s=0.9)  # a holds 0.48 s of its sentence now: released
