"""Provides prompt building: text + voice -> token ids for the Spark-TTS prompt formats the engine builds
(controllable, and with a voice's globals). Pure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from engine.tokens import GENDERS, GLOBAL_CODEBOOK, GLOBAL_COUNT, LEVELS, TokenIds


@dataclass(frozen=True, slots=True)
class Prompt:
    """A fully tokenized LLM prompt."""

    ids: tuple[int, ...]
    """Prompt token ids (no BOS; Spark prompts are raw concatenations)."""
    allowed_ids: tuple[int, ...] | None = None
    """Sorted token ids sampling may choose from (None = whole vocabulary). Globals-prefixed prompts restrict to
    semantic ids + stop ids so the LLM cannot wander into structural tokens."""


Encode = Callable[[str], list[int]]
"""Plain text -> token ids with no special tokens added (e.g. `lambda s: tok.encode(s, add_special_tokens=False)`)."""


def build_controllable_prompt(text: str, gender: str, pitch: str, speed: str, ids: TokenIds, encode: Encode) -> Prompt:
    """Format (a), voice creation: the model invents a voice from gender + pitch/speed labels.

    `<|task_controllable_tts|><|start_content|>{text}<|end_content|>`
    `<|start_style_label|><|gender_g|><|pitch_label_p|><|speed_label_s|><|end_style_label|>`
    The output starts with acoustic + 32 global tokens before the semantic stream, so no `allowed_ids`.
    """
    _check_choice("gender", gender, GENDERS)
    _check_choice("pitch", pitch, LEVELS)
    _check_choice("speed", speed, LEVELS)
    s = ids.structural
    style = (ids.attribute("gender", GENDERS[gender]), ids.attribute("pitch_label", LEVELS[pitch]),
             ids.attribute("speed_label", LEVELS[speed]))
    return Prompt(ids=(s["task_controllable_tts"], *_content(text, ids, encode),
                       s["start_style_label"], *style, s["end_style_label"]))



def build_globals_prompt(text: str, global_codes: Sequence[int], ids: TokenIds, encode: Encode) -> Prompt:
    """Format (c), speak with stored speaker globals (also cloning without transcript, b').

    `<|task_tts|><|start_content|>{text}<|end_content|><|start_global_token|>{32 globals}<|end_global_token|>`
    `<|start_semantic_token|>`. Appending `<|start_semantic_token|>` means every token the model should emit
    next is semantic, so sampling is restricted to the 8192 semantic ids + the stop ids: the LLM then can never
    wander into structural, global or attribute tokens (which would be silence at best, a derailed utterance at
    worst), and can still end the utterance.
    """
    _check_codes("global", global_codes, GLOBAL_CODEBOOK, GLOBAL_COUNT)
    prompt = (ids.structural["task_tts"], *_content(text, ids, encode), *_globals(global_codes, ids),
              ids.structural["start_semantic_token"])
    return Prompt(ids=prompt, allowed_ids=semantic_allowed_ids(ids))


def semantic_allowed_ids(ids: TokenIds) -> tuple[int, ...]:
    """Sorted semantic ids + stop ids: what a prompt ending in `<|start_semantic_token|>` may generate
    (TokenIds.audio_ids)."""
    return ids.audio_ids


def _content(text: str, ids: TokenIds, encode: Encode) -> tuple[int, ...]:
    _check_text(text, "text")
    return (ids.structural["start_content"], *encode(text), ids.structural["end_content"])


def _globals(global_codes: Sequence[int], ids: TokenIds) -> tuple[int, ...]:
    return (ids.structural["start_global_token"], *(ids.global_base + c for c in global_codes),
            ids.structural["end_global_token"])


def _check_text(text: str, what: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must be a non-empty string")


def _check_choice(what: str, value: str, choices: dict[str, int]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


def _check_codes(what: str, codes: Sequence[int], codebook: int, count: int | None = None) -> None:
    if count is not None and len(codes) != count:
        raise ValueError(f"expected exactly {count} {what} codes, got {len(codes)}")
    bad = [c for c in codes if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < codebook]
    if bad:
        raise ValueError(f"{what} codes must be ints in 0..{codebook - 1}; got {bad[0]!r}")
