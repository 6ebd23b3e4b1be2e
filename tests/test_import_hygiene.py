"""The layering is a test: pure engine modules must not pull in device or UI libraries."""
import subprocess
import sys

import pytest

PURE = ["engine.text", "engine.prompt", "engine.tokens", "engine.windowing", "engine.windowed_decode",
        "engine.crossfade", "engine.ringbuffer", "engine.player_gate", "engine.events", "engine.errors",
        "engine.config", "engine.voices", "engine.model", "engine.seams", "engine.lane_scheduler", "engine.deadlines",
        "engine.metrics", "engine.rows",
        "engine.atomic", "engine.bench", "engine.pacing", "engine.families", "engine.families.base",
        "engine.families.spark", "engine.families.orpheus", "engine.families.orpheus.grammar",
        "engine.families.orpheus.checkpoint", "engine.cpu_pools", "engine.platform_info"]
HEAVY = ["torch", "vllm", "sounddevice", "textual", "transformers", "voiceapp"]


def loaded_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_device_or_ui_library(module):
    loaded = loaded_after_import(module)
    assert not {m for m in HEAVY if m in loaded}, f"{module} imports {sorted(m for m in HEAVY if m in loaded)}"


@pytest.mark.parametrize("module", ["engine.pipeline", "engine.factory", "engine.backends.base", "engine.fakes"])
def test_engine_core_never_imports_ui_or_device_libraries(module):
    loaded = loaded_after_import(module)
    bad = {"torch", "vllm", "sounddevice", "textual", "voiceapp"} & loaded
    assert not bad, f"{module} imports {sorted(bad)}"


def test_cli_help_imports_no_torch():
    loaded = loaded_after_import("voiceapp.cli")
    assert "torch" not in loaded and "textual" not in loaded

