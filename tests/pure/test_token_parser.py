"""TokenParser: id deltas -> semantic codes, stop handling, controllable-mode global block."""
from __future__ import annotations

import pytest

from engine.errors import GenerationError
from engine.tokens import TokenIds, TokenParser, parse_all

IDS = TokenIds()
S = IDS.structural


def sem(*codes: int) -> list[int]:
    return [IDS.semantic_base + c for c in codes]


def glob(*codes: int) -> list[int]:
    return [IDS.global_base + c for c in codes]


def test_semantic_codes_by_id_arithmetic() -> None:
    p = TokenParser(IDS)
    assert p.feed(sem(0, 1, 8191)) == [0, 1, 8191]
    assert p.feed([]) == []
    assert p.feed(sem(42)) == [42]
    assert p.semantic_count == 4 and not p.done and p.ignored == 0


@pytest.mark.parametrize("stop", sorted(IDS.stop_ids))
def test_stop_id_ends_and_everything_after_is_ignored(stop: int) -> None:
    p = TokenParser(IDS)
    assert p.feed([*sem(3), stop, *sem(4)]) == [3]
    assert p.done and p.stop_id == stop
    assert p.feed(sem(5, 6)) == []
    assert p.semantic_count == 1 and p.ignored == 0


def test_other_ids_are_ignored_and_counted() -> None:
    p = TokenParser(IDS)
    acoustic = [S["start_acoustic_token"], IDS.attribute("pitch_value", 500), IDS.attribute("speed_value", 5),
                S["end_acoustic_token"]]
    stray = [S["start_semantic_token"], IDS.global_base + 7, 12345, 165500, 999_999]
    assert p.feed(acoustic + stray + sem(9)) == [9]
    assert p.ignored == len(acoustic) + len(stray)
    assert not p.has_globals


def test_controllable_output_collects_32_globals() -> None:
    g = list(range(100, 132))
    out = ([S["start_acoustic_token"], IDS.attribute("pitch_value", 1), IDS.attribute("speed_value", 2),
            S["end_acoustic_token"], S["start_global_token"], *glob(*g), S["end_global_token"],
            S["start_semantic_token"], *sem(7, 8), IDS.im_end])
    codes, p = parse_all(out, IDS)
    assert codes == [7, 8]
    assert p.has_globals and p.global_codes == tuple(g)
    assert p.done and p.stop_id == IDS.im_end
    assert p.ignored == 5  # start/end acoustic, pitch, speed, start_semantic


def test_delta_boundaries_do_not_matter() -> None:
    out = [S["start_global_token"], *glob(*range(32)), S["end_global_token"], *sem(*range(50)), IDS.im_end, *sem(1)]
    whole, p_whole = parse_all(out, IDS)
    p = TokenParser(IDS)
    pieces = [c for i in range(0, len(out), 3) for c in p.feed(out[i:i + 3])]
    assert pieces == whole == list(range(50))
    assert p.global_codes == p_whole.global_codes == tuple(range(32))
    assert p.semantic_count == 50


@pytest.mark.parametrize("n", [0, 31, 33])
def test_wrong_global_count_is_an_error(n: int) -> None:
    _, p = parse_all([S["start_global_token"], *glob(*range(n)), S["end_global_token"], *sem(1)], IDS)
    assert p.has_globals
    with pytest.raises(GenerationError, match="expected 32"):
        _ = p.global_codes


def test_missing_or_unterminated_global_block_is_an_error() -> None:
    _, p = parse_all(sem(1, 2), IDS)
    with pytest.raises(GenerationError):
        _ = p.global_codes
    _, p = parse_all([S["start_global_token"], *glob(*range(32)), IDS.im_end], IDS)
    assert not p.has_globals
    with pytest.raises(GenerationError):
        _ = p.global_codes


def test_only_the_first_global_block_counts() -> None:
    block = [S["start_global_token"], *glob(*range(32)), S["end_global_token"]]
    _, p = parse_all(block + [S["start_global_token"], *glob(1, 2), S["end_global_token"]], IDS)
    assert p.global_codes == tuple(range(32))
    assert p.ignored == 4  # the second block's ids are strays
