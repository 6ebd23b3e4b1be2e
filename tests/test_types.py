"""mypy finds nothing in engine/ and voiceapp/ (pyproject.toml's [tool.mypy]: checked as Python 3.10 runs them, the
bodies of unannotated functions included). Its cache lives beside the interpreter (the virtual environment), so a
second run checks only what changed."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed (it is in the dev extra: scripts/setup.sh installs it)")
    cache = Path(sys.prefix) / ".mypy_cache"
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
