"""pyproject.toml says `requires-python = ">=3.10"`: the code must not use what only Python 3.11 and later have.

Three checks: every module of ours parses with Python 3.10's grammar (by a real 3.10 interpreter where one is
installed, else by `ast`'s 3.10 feature version); no module reaches for a 3.11-only standard-library name unless it
falls back inside `try: ... except ImportError`; and the voice bank, which reads TOML, imports where `tomllib` is
missing (3.10 reads TOML with tomli)."""
from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for d in ("engine", "voiceapp", "scripts", "tests") for p in (ROOT / d).rglob("*.py"))

MODULES_311 = {"tomllib", "wsgiref.types"}
"""Standard-library modules that first appear in Python 3.11."""
NAMES_311 = {
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "TypeVarTuple",
               "Unpack", "Required", "NotRequired", "dataclass_transform", "get_overloads", "clear_overloads"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier", "BrokenBarrierError"},
    "datetime": {"UTC"},
    "enum": {"StrEnum", "ReprEnum", "verify", "EnumCheck", "FlagBoundary", "global_enum", "member", "nonmember",
             "property"},
    "hashlib": {"file_digest"},
    "contextlib": {"chdir"},
    "operator": {"call"},
    "math": {"exp2", "cbrt"},
    "inspect": {"getmembers_static", "markcoroutinefunction"},
    "logging": {"getLevelNamesMapping"},
    "re": {"NOFLAG"},
}
"""Names that modules of the standard library first have in Python 3.11, by module."""
BUILTINS_311 = {"ExceptionGroup", "BaseExceptionGroup"}
"""Built-in names new in 3.11."""


def guarded(tree: ast.AST) -> set[int]:
    """Line numbers of the statements inside `try:` blocks that catch ImportError (or a parent of it)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = {ast.unparse(h.type) if h.type is not None else "" for h in node.handlers}
        if caught & {"ImportError", "ModuleNotFoundError", "", "Exception"} or any(
                "ImportError" in c or "ModuleNotFoundError" in c for c in caught):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def uses_of_311(path: Path) -> list[str]:
    """What `path` uses that Python 3.10 lacks, as 'file:line: what'."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    safe, found = guarded(tree), []
    aliases: dict[str, str] = {}  # local name -> standard module, for `import asyncio as aio`
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name
                if a.name in MODULES_311 and line not in safe:
                    found.append(f"{where}:{line}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in MODULES_311 and line not in safe:
                found.append(f"{where}:{line}: from {node.module} import")
            for a in node.names:
                if a.name in NAMES_311.get(node.module, ()) and line not in safe:
                    found.append(f"{where}:{line}: from {node.module} import {a.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module and node.attr in NAMES_311.get(module, ()) and line not in safe:
                found.append(f"{where}:{line}: {module}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in BUILTINS_311 and line not in safe:
            found.append(f"{where}:{line}: {node.id}")
        elif type(node).__name__ == "TryStar":
            found.append(f"{where}:{line}: except*")
    return found


def test_no_module_uses_what_only_python_3_11_has() -> None:
    found = [use for path in SOURCES for use in uses_of_311(path)]
    assert not found, "3.11-only names, while pyproject.toml promises 3.10:\n" + "\n".join(found)


def python_310() -> str | None:
    """A Python 3.10 interpreter on this machine: python3.10 on PATH, or one pyenv installed; None if none runs."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    installed = sorted(glob.glob(str(pyenv / "versions" / "3.10*" / "bin" / "python3.10")))
    for exe in [shutil.which("python3.10"), *installed]:
        if exe and subprocess.run([exe, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"],
                                  capture_output=True).returncode == 0:
            return exe
    return None


def test_every_module_parses_with_python_3_10() -> None:
    """A real 3.10 parser where there is one (it knows its own grammar exactly); else ast's 3.10 feature version."""
    exe = python_310()
    if exe is None:
        bad = []
        for path in SOURCES:
            try:
                ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 10))
            except SyntaxError as err:
                bad.append(f"{path.relative_to(ROOT)}:{err.lineno}: {err.msg}")
        assert not bad, "\n".join(bad)
        return
    code = ("import sys\nbad = []\nfor p in sys.argv[1:]:\n    try:\n        compile(open(p, encoding='utf-8').read(), "
            "p, 'exec')\n    except SyntaxError as e:\n        bad.append(f'{p}:{e.lineno}: {e.msg}')\n"
            "print('\\n'.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([exe, "-c", code, *map(str, SOURCES)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_voices_read_toml_without_tomllib() -> None:
    """On 3.10 there is no tomllib: the voice bank falls back to tomli (a dependency there) and still reads the
    built-in presets. Simulated here by making `import tomllib` fail in a fresh interpreter."""
    pytest.importorskip("tomli")
    code = ("import sys; sys.modules['tomllib'] = None\n"
            "from engine.voices import VoiceBank, BUILTIN_DIR\n"
            "print(len(VoiceBank([BUILTIN_DIR]).all()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 1
