"""ruff keeps engine/, voiceapp/ and tests/ free of unused and undefined names (pyproject.toml's [tool.ruff])."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed (it is in the dev extra: scripts/setup.sh installs it)")
    proc = subprocess.run([ruff, "check", "engine", "voiceapp", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
