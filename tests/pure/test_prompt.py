"""Prompt builders: exact id sequences for formats (a), (b), (c) against the release's id table."""
from __future__ import annotations

import pytest

from engine.prompt import (Prompt, build_controllable_prompt, build_globals_prompt,
                           semantic_allowed_ids)
from engine.tokens import TokenIds

IDS = TokenIds()


def encode(text: str) -> list[int]:
    """Stand-in tokenizer: one id per character (all below the added-token range)."""
    return [ord(c) for c in text]


# Release ids, spelled out (sparktts-format.md §2.2) so the builders are checked against the doc, not themselves.
TASK_TTS, TASK_CTRL = 165137, 165143
START_CONTENT, END_CONTENT = 165146, 165152
START_STYLE, END_STYLE = 165147, 165153
START_GLOBAL, END_GLOBAL = 165150, 165156
START_SEMANTIC = 165151
GLOBALS = list(range(0, 4096, 128))  # 32 codes


def test_controllable_prompt_exact_ids() -> None:
    p = build_controllable_prompt("Hi", "male", "high", "very_low", IDS, encode)
    gender_1, pitch_label_3, speed_label_0 = 165032 + 1, 164965 + 3, 164986 + 0
    assert p.ids == (TASK_CTRL, START_CONTENT, ord("H"), ord("i"), END_CONTENT,
                     START_STYLE, gender_1, pitch_label_3, speed_label_0, END_STYLE)
    assert p.allowed_ids is None


@pytest.mark.parametrize("gender,pitch,speed", [("other", "low", "low"), ("male", "loud", "low"),
                                                ("female", "low", "fast"), ("Male", "low", "low")])
def test_controllable_prompt_rejects_unknown_labels(gender: str, pitch: str, speed: str) -> None:
    with pytest.raises(ValueError):
        build_controllable_prompt("Hi", gender, pitch, speed, IDS, encode)


def test_globals_prompt_exact_ids_and_allowed() -> None:
    p = build_globals_prompt("Hello.", GLOBALS, IDS, encode)
    assert p.ids == (TASK_TTS, START_CONTENT, *map(ord, "Hello."), END_CONTENT,
                     START_GLOBAL, *(151665 + g for g in GLOBALS), END_GLOBAL, START_SEMANTIC)
    allowed = p.allowed_ids
    assert allowed is not None and list(allowed) == sorted(set(allowed))
    assert len(allowed) == 8192 + 3
    assert set(allowed) == set(range(155761, 163953)) | {151645, 151643, 165157}
    assert allowed == semantic_allowed_ids(IDS)


@pytest.mark.parametrize("codes", [GLOBALS[:31], GLOBALS + [0], [4096] + GLOBALS[1:], [-1] + GLOBALS[1:],
                                   [1.0] + GLOBALS[1:], [True] + GLOBALS[1:]])
def test_global_codes_validated(codes: list) -> None:
    with pytest.raises(ValueError):
        build_globals_prompt("Hello.", codes, IDS, encode)


def test_empty_text_rejected() -> None:
    with pytest.raises(ValueError):
        build_globals_prompt("  ", GLOBALS, IDS, encode)


def test_structural_ids_come_from_the_table_not_the_tokenizer() -> None:
    """A fine-tune with a shifted table gets its own ids; `encode` only ever sees plain text."""
    seen: list[str] = []
    shifted = TokenIds(global_base=1000, semantic_base=6000,
                       structural={k: v - 100_000 for k, v in IDS.structural.items()})
    p = build_globals_prompt("abc", GLOBALS, shifted, lambda s: seen.append(s) or [7])
    assert seen == ["abc"]
    assert p.ids[:4] == (TASK_TTS - 100_000, START_CONTENT - 100_000, 7, END_CONTENT - 100_000)
    assert p.ids[5] == 1000 + GLOBALS[0]
    assert isinstance(p, Prompt)
