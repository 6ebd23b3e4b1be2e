"""docs/architecture.md names files and folders of the code: each must exist, so the page cannot drift from the tree
unnoticed (a renamed module fails this test until the page follows)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_path_the_architecture_page_names_exists() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:engine|voiceapp|tests|docs|lab|scripts|assets)/[\w./-]*)`", page))
    assert len(named) > 20
    missing = sorted(path for path in named if not (ROOT / path.rstrip("/")).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
