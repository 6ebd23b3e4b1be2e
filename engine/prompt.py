"""Provides prompt building: text + voice -> token ids for the three Spark-TTS prompt formats. Pure."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prompt:
    """A fully tokenized LLM prompt."""

    ids: tuple[int, ...]
    """Prompt token ids (no BOS; Spark prompts are raw concatenations)."""
    allowed_ids: tuple[int, ...] | None = None
    """Sorted token ids sampling may choose from (None = whole vocabulary). Globals-prefixed prompts restrict to
    semantic ids + stop ids so the LLM cannot wander into structural tokens."""
