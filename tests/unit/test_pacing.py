"""Pacer: stream while speech comes faster than it plays; once slower, whole sentences (pauses between sentences,
none inside); the time spent blocked on a full player is not the engine's; a CPU engine's first sentence waits
for its speed."""
from engine.pacing import MIN_EVIDENCE_S, REALTIME_MARGIN, Pacer


def feed(pacer, sentences, speed, t=0.0, chunk_s=0.24, blocked_s=0.0):
    """Sentences of `chunk_s` chunks made at `speed` x real time; returns (held per chunk, end time)."""
    holds = []
    for count in sentences:
        for i in range(count):
            t += chunk_s / speed + blocked_s
            holds.append(pacer.arrived(chunk_s, i == count - 1, t))
            if not holds[-1]:
                pacer.blocked(blocked_s)
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
