"""voiceapp/'s folders import downward only (docs/architecture.md's table of front ends): the CLI on top; the front
ends over an engine (TUI, HTTP, Wyoming, speechd) beside one another; the engine server; the audio outputs; the shared
modules at the bottom. The engine imports nothing of voiceapp. Every import counts, at module level or inside a
function (the import graph of tests/test_import_cycles.py); tests/test_import_hygiene.py keeps the engine's own layers
free of device and UI libraries."""
from __future__ import annotations

from tests.test_import_cycles import imports, modules

RANKS = {
    "voiceapp.cli": 4,
    "voiceapp.tui": 3, "voiceapp.http": 3, "voiceapp.wyoming": 3, "voiceapp.speechd": 3, "voiceapp.cluster": 3,
    "voiceapp.server": 2,
    "voiceapp.audio": 1,
    "voiceapp.common": 0, "voiceapp.limits": 0, "voiceapp.lockfile": 0,
}
"""Each layer of voiceapp/ (a folder, or a shared module) and its height: a layer imports its own modules and those of
lower layers only, never a layer of its own height."""

LAB_BOUND = {"voiceapp.cmd_bench", "voiceapp.load_bench", "voiceapp.tmux"}
"""`voicectl bench` and the tools it and the lab run: outside the layers (they may import any layer), and
no layer may import them."""


def layer(module: str) -> str | None:
    """The layer `module` belongs to, or None (the `voiceapp` package itself and LAB_BOUND)."""
    return next((name for name in RANKS if module == name or module.startswith(name + ".")), None)


def breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import of voiceapp/ that goes up or sideways, or from the engine into voiceapp, as 'importer -> module'."""
    found = []
    for importer, imported in sorted(graph.items()):
        for module in sorted(imported):
            if not module.startswith("voiceapp."):
                continue
            mine, theirs = layer(importer), layer(module)
            if importer.startswith("engine"):
                found.append(f"{importer} -> {module}")
            elif mine is None or mine == theirs:
                continue
            elif theirs is None or RANKS[theirs] >= RANKS[mine]:
                found.append(f"{importer} -> {module}")
    return found


def test_voiceapp_imports_only_downward_and_the_engine_not_at_all() -> None:
    known = modules()
    graph = {name: imports(path, set(known), name) for name, path in known.items()}
    assert breaches(graph) == []


def test_every_voiceapp_module_has_a_layer() -> None:
    """A new module is placed in a layer (or named lab-bound), so the rule above covers it."""
    unplaced = sorted(name for name in modules()
                      if name.startswith("voiceapp.") and layer(name) is None and name not in LAB_BOUND)
    assert unplaced == []


def test_the_rule_finds_an_import_up_sideways_into_the_lab_or_from_the_engine() -> None:
    graph = {
        "voiceapp.server.client": {"voiceapp.cli.say", "voiceapp.limits", "voiceapp.server.rendezvous"},
        "voiceapp.http.api": {"voiceapp.speechd.module", "voiceapp.server.engine_server"},
        "voiceapp.audio.wavout": {"voiceapp.tmux"},
        "voiceapp.cmd_bench": {"voiceapp.cli"},
        "engine.pipeline": {"voiceapp.common"},
    }
    assert breaches(graph) == ["engine.pipeline -> voiceapp.common", "voiceapp.audio.wavout -> voiceapp.tmux",
                               "voiceapp.http.api -> voiceapp.speechd.module",
                               "voiceapp.server.client -> voiceapp.cli.say"]
