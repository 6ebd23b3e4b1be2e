"""The benchmark's playback simulations (engine.bench): our player (audio pre-roll, rebuffer) and the stricter
fixed-delay player, and how the headline picks the largest real-time level."""
import math

from engine import bench
from engine.bench.summary import _max_realtime, level_json

SR = 1000  # 1 sample = 1 ms keeps the arithmetic readable


def test_player_waits_for_its_preroll_of_audio_then_plays_without_gaps():
    # 80 ms at t=0, 320 ms at t=0.1 (pre-roll reached: starts at 0.1 holding 400 ms), 480 ms at t=0.45
    chunks = [(0.0, 80), (0.1, 320), (0.45, 480)]
    played = bench.simulate_player(chunks, SR, preroll_s=0.2)
    assert played == bench.Playback(0, 0.0, 0.1)
    # the fixed-delay player starts at 0.2 with only 400 ms queued and also makes it (runs out at 0.6)
    assert bench.simulate_playback(chunks, SR, 0.2) == (0, 0.0)


def test_fixed_delay_player_underruns_where_ours_does_not():
    # a short first chunk and a slow second one: the fixed-delay player starts at 0.2 with 80 ms and runs dry
    chunks = [(0.0, 80), (0.5, 320), (0.7, 480)]
    assert bench.simulate_playback(chunks, SR, 0.2) == (1, 0.5 - 0.28)
    played = bench.simulate_player(chunks, SR, preroll_s=0.2)
    assert (played.underruns, played.onset) == (0, 0.5)


def test_player_underrun_rebuffers_before_resuming():
    # starts at 0 with 200 ms, runs dry at 0.2; the next chunks (100 ms each at 0.5 and 0.7) must add up to the
    # 200 ms rebuffer first: it resumes at 0.7, so 0.5 s of silence, one underrun
    chunks = [(0.0, 200), (0.5, 100), (0.7, 100), (0.75, 1000)]
    played = bench.simulate_player(chunks, SR, preroll_s=0.2)
    assert played.underruns == 1 and math.isclose(played.silence_s, 0.5) and played.onset == 0.0
    assert played.first_underrun == 1
    # with no rebuffer it resumes with each chunk as it comes, and so runs dry twice (0.2-0.5, 0.6-0.7)
    resumed = bench.simulate_player(chunks, SR, preroll_s=0.2, rebuffer_s=0.0)
    assert resumed.underruns == 2 and math.isclose(resumed.silence_s, 0.4)


def test_a_stream_shorter_than_the_preroll_still_plays():
    played = bench.simulate_player([(0.0, 50), (0.02, 50)], SR, preroll_s=0.2)
    assert played == bench.Playback(0, 0.0, 0.02)
    assert math.isnan(bench.simulate_player([], SR).onset)


def test_max_realtime_is_the_largest_level_with_every_smaller_one_real_time():
    levels = {1: {"realtime": True, "f": True}, 8: {"realtime": True, "f": False},
              32: {"realtime": False, "f": True}, 64: {"realtime": True, "f": True}}
    assert _max_realtime(levels, "realtime") == 8
    assert _max_realtime(levels, "f") == 1
    assert _max_realtime({1: {}}, "realtime") == 0


def _level_fields() -> dict:
    """A level's required numbers, all zero: a clean level of one stream."""
    return dict(streams=1, ttfa_ms_p50=0.0, ttfa_ms_p95=0.0, steady_rtf_p50=0.0, steady_rtf_max=0.0, rtf_p50=0.0,
                rtf_max=0.0, underruns=0, streams_with_underruns=0, silence_s=0.0, audio_s=0.0, wall_s=0.0,
                llm_tok_s_per_stream_p50=0.0, ttft_ms_p50=0.0, first_window_tokens_ms_p50=0.0, decode_batch_mean=0.0)


def test_a_level_that_played_through_near_real_time_is_not_real_time_by_the_bench():
    """0 underruns at RTF 0.8 counts for max_streams_0_underruns, not for max_realtime_streams (RTF <= 0.5)."""
    close = bench.LevelResult(**{**_level_fields(), "streams": 216, "steady_rtf_max": 0.8})
    fast = bench.LevelResult(**{**_level_fields(), "streams": 32, "steady_rtf_max": 0.2})
    levels = {lv.streams: level_json(lv) for lv in (fast, close)}
    assert close.played_through and not close.realtime and fast.realtime
    assert _max_realtime(levels, "played_through") == 216 and _max_realtime(levels, "realtime") == 32
    late = bench.LevelResult(**{**_level_fields(), "streams": 216, "steady_rtf_max": 0.2, "underruns": 1})
    assert not late.played_through and not late.realtime


def test_summarize_splits_the_first_window_per_stream():
    """Two streams: one got a 4-code first window, one a 16-code (busy) one; each is timed at its own token."""
    rec = [bench.StreamRecord(0.0, [(0.050, 80), (0.060, 240)], "a"),
           bench.StreamRecord(0.0, [(0.100, 320), (0.200, 320)], "b")]
    firsts = {"a": bench.TokenTimes(0.0, [(0.002 * k, k) for k in range(1, 41)]),
              "b": bench.TokenTimes(0.0, [(0.002 * k, k) for k in range(1, 41)])}
    decodes = {"a": [(0.041, 0.048, 4), (0.055, 0.059, 12)], "b": [(0.065, 0.095, 16)]}
    lv = bench.summarize(2, rec, list(firsts.values()), firsts, SR, 0.2, first_tokens=32, wall_s=1.0,
                         batch_mean=1.0, decodes=decodes, right=16)
    # stream a needs 4 + 16 = 20 tokens (at 40 ms), stream b 16 + 16 = 32 (at 64 ms)
    assert math.isclose(lv.first_window_tokens_ms_p50, (40 + 64) / 2)
    assert math.isclose(lv.first_submit_ms_p50, 1.0) and math.isclose(lv.first_decode_ms_p50, (7 + 30) / 2)
    assert lv.decode_ms_by_window[0] == [round((7 + 30) / 2, 1), round(7 + 0.95 * 23, 1)]
    assert lv.decode_ms_by_window[1] == [4.0, 4.0] and lv.first_underrun_chunks == {}


def test_summarize_counts_a_frame_of_several_tokens_as_its_tokens():
    """Orpheus: a code (SNAC frame) is seven LLM tokens, so a 1-frame first window with 2 of lookahead waits for
    the 21st token, not the third."""
    rec = [bench.StreamRecord(0.0, [(0.060, 2048)], "a")]
    firsts = {"a": bench.TokenTimes(0.0, [(0.002 * k, k) for k in range(1, 41)])}
    decodes = {"a": [(0.043, 0.046, 1)]}
    lv = bench.summarize(1, rec, list(firsts.values()), firsts, 24000, 0.2, first_tokens=21, wall_s=1.0,
                         batch_mean=1.0, decodes=decodes, right=2, tokens_per_code=7)
    assert math.isclose(lv.first_window_tokens_ms_p50, 42.0) and math.isclose(lv.first_submit_ms_p50, 1.0)


def test_a_schedule_keeps_up_only_while_its_windows_grow_by_no_more_than_the_streams_speed():
    """A window comes whole: windows growing by 2 run dry below 2x real time, Orpheus's busy windows (8, 8 frames,
    growth 1.25) keep up at the 1.3x a crowd's streams get."""
    from dataclasses import replace

    from engine.bench.playback import simulate_player, window_arrivals
    from engine.families.orpheus import FRAMES_PER_S, SAMPLES_PER_FRAME, SCHEDULE

    def underruns(schedule, speed: float) -> int:
        chunks = window_arrivals(schedule, FRAMES_PER_S, speed, round(8 * FRAMES_PER_S), SAMPLES_PER_FRAME, 0.1)
        return simulate_player(chunks, 24000).underruns

    busy = SCHEDULE.busy()
    doubling = replace(busy, first_new=4, growth=2.0)
    assert underruns(busy, 1.3) == 0 and underruns(busy, 2.5) == 0
    assert underruns(doubling, 1.5) > 0 and underruns(doubling, 2.1) == 0
    assert underruns(busy, 1.1) > 0  # below its own growth it runs dry too
    arrivals = window_arrivals(busy, FRAMES_PER_S, 2.0, 40, SAMPLES_PER_FRAME)
    assert sum(n for _, n in arrivals) == 40 * SAMPLES_PER_FRAME and [t for t, _ in arrivals] == sorted(
        t for t, _ in arrivals)
