"""The composition root hides the loaded engine from the cyclic garbage collector (EngineConfig.freeze_heap), so
a full collection during a crowd walks only what requests created."""
from __future__ import annotations

import gc

from engine.factory import EngineConfig, build_synthesizer


def _build(tiny_model, tmp_path, **kw):
    return build_synthesizer(EngineConfig(model=str(tiny_model), backend="torch", threads=2,
                                          cache_dir=str(tmp_path / "cache"), **kw))


def test_the_loaded_engine_is_frozen_out_of_full_collections(tiny_model, tmp_path) -> None:
    gc.unfreeze()
    try:
        synth = _build(tiny_model, tmp_path)
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # torch, transformers and the model's modules
        assert all(o is not synth for o in gc.get_objects(generation=2))  # the permanent generation holds it
    finally:
        gc.unfreeze()
    _build(tiny_model, tmp_path, freeze_heap=False)
    assert gc.get_freeze_count() == 0
