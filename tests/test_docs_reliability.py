"""docs/reliability.md names a test for every case; each must exist, so the table cannot go stale silently."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_case_in_the_reliability_table_names_an_existing_test() -> None:
    table = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", table)
    assert len(named) >= 10
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        tests = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert name in tests, f"{path}::{name} is named in docs/reliability.md but does not exist"
