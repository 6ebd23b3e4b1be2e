"""Provides the model families the engine runs and which one a checkpoint directory holds. Pure.

A family is an `engine.families.base.ModelFamily`; each lives in a module (or folder) of its own here, pure at
import. Adding one is that module plus its name in FAMILIES.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from engine.errors import InputError, ModelFormatError
from engine.families.base import ModelFamily

FAMILIES = {"spark": "engine.families.spark:SPARK", "orpheus": "engine.families.orpheus:ORPHEUS"}
"""Family name -> where its ModelFamily object is (module:attribute), imported when first asked for."""


def family(name: str) -> ModelFamily:
    """The family called `name`; InputError naming those there are."""
    if name not in FAMILIES:
        raise InputError(f"unknown model family {name!r}; choose one of {', '.join(FAMILIES)}")
    module, attr = FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def all_families() -> list[ModelFamily]:
    return [family(name) for name in FAMILIES]


def detect(root: str | Path) -> ModelFamily:
    """The family whose layout `root` has. One line naming what was found where it is none, or several (a mix,
    e.g. a Spark LLM beside a SNAC decoder)."""
    root = Path(root)
    found = [f for f in all_families() if f.looks_like(root)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelFormatError(f"{root}: not a checkpoint of any known family ("
                               + "; ".join(f"{f.name}: {f.description}" for f in all_families()) + ")")
    raise ModelFormatError(f"{root}: holds parts of several model families ({', '.join(f.name for f in found)}); "
                           f"a checkpoint is one family's LLM with that family's codec")


def family_of(root: str | Path | None) -> ModelFamily:
    """The family of the checkpoint `root` (--model, $VOICEAPP_MODEL, the cache), or Spark where none is found yet
    (the error that follows names what to do): what front ends ask before any model is loaded, e.g. which voices
    exist."""
    from engine.errors import VoiceError
    from engine.model import resolve_model_dir

    try:
        return detect(resolve_model_dir(root))
    except VoiceError:
        return family("spark")
