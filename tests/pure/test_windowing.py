"""Window planner: windows tile the sentence exactly, respect context and lookahead, and end with a final one."""
import pytest

from engine.windowing import WindowPlanner, WindowSchedule


def plan_all(schedule, total, step=1):
    """Feed `total` codes `step` at a time, then signal done; return all windows with the availability seen."""
    planner, windows, available = WindowPlanner(schedule), [], 0
    while True:
        done = available >= total
        w = planner.next_window(available, done)
        if w is None:
            if done:
                return windows
            available = min(total, available + step)
            continue
        windows.append((w, available))


@pytest.mark.parametrize("total", [1, 5, 10, 17, 18, 19, 40, 200, 777])
@pytest.mark.parametrize("step", [1, 3, 50])
@pytest.mark.parametrize("s", [WindowSchedule(), WindowSchedule(first_right=3, crossfade=2)])
def test_windows_tile_the_sentence_and_respect_lookahead(total, step, s):
    windows = plan_all(s, total, step)
    assert windows and windows[-1][0].final and all(not w.final for w, _ in windows[:-1])
    pos, held = 0, 0
    for w, available in windows:
        assert w.emit_start == pos and w.head == held
        assert w.start == max(0, w.emit_start - s.left) and w.stop <= available
        if not w.final:
            assert w.stop - (w.emit_stop - w.tail) == s.right_context(windows.index((w, available)))
            assert w.emit_stop <= w.stop
        pos, held = w.emit_stop - w.tail, w.tail
    assert pos == total and held == 0


def test_first_window_can_have_less_lookahead():
    s = WindowSchedule(first_new=8, right=16, first_right=4)
    windows = plan_all(s, 500)
    assert windows[0][1] == 12 and windows[0][0].stop == 12
    assert all(w.stop - (w.emit_stop - w.tail) == 16 for w, _ in windows[1:-1])


def test_first_window_is_small_and_later_windows_grow():
    s = WindowSchedule(first_new=10, new=24, growth=2.0, max_new=96, right=8)
    windows = [w for w, _ in plan_all(s, 1000)]
    sizes = [w.emit_stop - w.tail - w.emit_start for w in windows]
    assert sizes[:4] == [10, 24, 48, 96] and max(sizes) == 96
    first, available = plan_all(s, 1000)[0]
    assert available == 18                                            # first audio after first_new + right codes


def test_a_sentence_decoded_ahead_starts_with_a_later_windows_length():
    from engine.batching import lengths_for

    s = WindowSchedule()
    windows = plan_all(s.ahead(), 1000)
    assert windows[0][1] == 2 * s.new + s.left + s.right > s.first_new + s.right  # after the current one's first
    lengths = lengths_for(s)
    assert all(w.stop - w.start in lengths for w, _ in windows[:-1])  # each one the decoder has a graph for
    assert WindowSchedule(first_new=64).ahead().first_new == 64  # never smaller than the schedule's own


def test_no_codes_means_no_window():
    assert WindowPlanner(WindowSchedule()).next_window(0, True) is None


@pytest.mark.parametrize("kwargs", [dict(right=0, crossfade=0), dict(crossfade=8, right=8), dict(first_new=0),
                                    dict(left=-1), dict(max_new=4, new=10)])
def test_invalid_schedules_are_rejected(kwargs):
    with pytest.raises(ValueError):
        WindowSchedule(**kwargs)


def test_busy_schedule_only_enlarges_the_first_windows():
    s = WindowSchedule()
    b = s.busy()
    assert (b.first_new, b.new) == (s.busy_first_new, s.busy_new) and b.first_new > s.first_new
    assert (b.left, b.right, b.crossfade) == (s.left, s.right, s.crossfade)
    assert WindowSchedule(first_new=24, new=48).busy().first_new == 24
    assert WindowSchedule(busy_first_new=8, busy_new=24).busy().new == 24
    assert b.growth == s.growth  # Spark's busy windows grow as its others
    assert WindowSchedule(busy_growth=1.25).busy().growth == 1.25 and WindowSchedule(busy_growth=1.25).growth == 2.0


def test_busy_growth_below_one_is_rejected():
    with pytest.raises(ValueError):
        WindowSchedule(busy_growth=0.9)


def test_the_lengths_no_standard_one_covers_are_short_sentences_first_windows():
    """A window is widened to a standard length when the sentence has the codes before it, or holds a whole left
    context of its own (then padded); only a short sentence's first windows have neither. Spark's: every length up
    to the ahead schedule's first window but the standard ones; none is a whole-context window's."""
    from engine.batching import lengths_for
    from engine.windowed_decode import uncovered_lengths

    s = WindowSchedule()
    standard = lengths_for(s)
    odd = uncovered_lengths(s, standard)
    assert odd == tuple(n for n in range(1, 56) if n not in standard)
    assert max(odd) + 1 == s.ahead().first_new + s.right == 56  # the ahead schedule's first window, standard
