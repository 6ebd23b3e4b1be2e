"""A fake engine that refuses on request, in every process of a `voicectl serve --ray` test that has this folder on
its PYTHONPATH (tests/server/test_ray_serve.py RayServed: the ingress, and through it the Ray replicas, which
inherit its environment). Python imports this module at start-up; where VOICEAPP_TEST_REFUSE names a file,
engine.pipeline's Synthesizer.admit of a process that file lists by pid (or of every process, where it says "all")
refuses; without the file, nothing changes. Only engine.pipeline's import is watched: Ray's own processes load
nothing more."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

CONTROL = os.environ.get("VOICEAPP_TEST_REFUSE")
REASON = "the test's fake engine refuses"


def refuses() -> bool:
    """Whether the control file says this process's engine refuses now."""
    try:
        with open(CONTROL or "") as f:
            said = f.read().split()
    except OSError:
        return False
    return "all" in said or str(os.getpid()) in said


def patch(module: Any) -> None:
    """Synthesizer.admit refuses while `refuses`, else asks the engine's deadlines as ever."""
    admit = module.Synthesizer.admit

    def refusing_admit(self: Any) -> Any:
        return module.Verdict(False, REASON) if refuses() else admit(self)

    module.Synthesizer.admit = refusing_admit


class WatchPipeline(importlib.abc.MetaPathFinder):
    """Patches engine.pipeline once it is loaded (found as Python's path finder finds it)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "engine.pipeline":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if CONTROL:
    sys.meta_path.insert(0, WatchPipeline())
