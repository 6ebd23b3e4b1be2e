"""The player's policy (engine.player_gate): pre-roll, re-buffer after an underrun, and an end that cannot wait."""
from engine.player_gate import may_play, rebuffers_after


def test_a_new_utterance_waits_for_its_preroll_or_its_end():
    assert not may_play(False, False, queued=199, preroll=200, rebuffer=100, at_end=False)
    assert may_play(False, False, queued=200, preroll=200, rebuffer=100, at_end=False)
    assert may_play(False, False, queued=1, preroll=200, rebuffer=100, at_end=True)


def test_playing_goes_straight_on_and_an_underrun_waits_for_the_rebuffer():
    assert may_play(True, False, queued=0, preroll=200, rebuffer=100, at_end=False)
    assert not may_play(True, True, queued=99, preroll=200, rebuffer=100, at_end=False)
    assert may_play(True, True, queued=100, preroll=200, rebuffer=100, at_end=False)


def test_only_a_short_read_while_playing_starts_a_rebuffer():
    assert rebuffers_after(True, True, 100)
    assert not rebuffers_after(True, False, 100)  # reached the producer's end mark: a pause
    assert not rebuffers_after(False, True, 100) and not rebuffers_after(True, True, 0)


def test_the_stall_watchdog_does_not_count_time_the_process_was_stopped():
    from engine.player_gate import RESUME_GAP_S, watch_progress

    last = (7, 100.0, 100.0)
    for t in (100.01, 100.02, 100.03):  # polls a few ms apart, no callback: the wait runs on
        last = watch_progress(last, 7, t)
    assert last == (7, 100.0, 100.03)
    resumed = watch_progress(last, 7, 100.03 + RESUME_GAP_S + 6.0)  # stopped for 6 s: the wait starts again
    assert resumed[1] == resumed[2] == 100.03 + RESUME_GAP_S + 6.0
    assert watch_progress(resumed, 8, resumed[2] + 0.01)[1] == resumed[2] + 0.01  # a callback: again
    stalled = resumed
    for i in range(1, 600):  # a device that truly stopped: polled on, it is called stalled after the timeout
        stalled = watch_progress(stalled, 7, resumed[2] + i * 0.01)
    assert stalled[2] - stalled[1] > 5.0
