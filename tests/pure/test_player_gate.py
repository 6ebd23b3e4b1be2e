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
