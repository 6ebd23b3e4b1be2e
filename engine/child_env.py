"""Provides engine_env: the environment of a child `python -m engine.<module>` process (export's encoder, the
crowd lane's compile ahead), which must import this same engine whatever the child's working directory."""
from __future__ import annotations

import os
from pathlib import Path


def engine_env() -> dict[str, str]:
    """This process's environment with the folder `engine` is imported from first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
