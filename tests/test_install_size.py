"""The user install stays under 1 GB on a CPU (issue 40; docs/performance.md). A fresh scripts/install.sh is measured
by hand (`python -m lab.install_size VENV`): CI cannot download a second torch. What these tests keep from that
measurement: the app's runtime requirements bring no distribution it did not hold, and the ones they bring, as
installed in this (development) venv with what install.sh removes from torch left out, still fit in 1 GB."""
from __future__ import annotations

import glob
import importlib.metadata
import sysconfig
from pathlib import Path

import pytest

from lab.install_size import MIB, distribution_bytes, distributions, normalize, runtime_closure
from tests.test_install_script import dry_run

try:
    import tomllib
except ImportError:  # Python 3.10: the dev extra has tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

MEASURED = {
    "anyio", "av", "cffi", "click", "filelock", "flatbuffers", "fsspec", "h11", "hf-xet", "httpcore2", "httpx2",
    "huggingface-hub", "idna", "jinja2", "linkify-it-py", "markdown-it-py", "markupsafe", "mdit-py-plugins", "mdurl",
    "ml-dtypes", "mpmath", "networkx", "numpy", "onnx", "onnxruntime", "packaging", "platformdirs", "protobuf",
    "pycparser", "pygments", "pyyaml", "rich", "safetensors", "setuptools", "sounddevice", "soundfile", "soxr",
    "starlette", "sympy", "textual", "tokenizers", "tomli-w", "torch", "tqdm", "truststore", "typing-extensions",
    "uvicorn", "wyoming",
}
"""The distributions the runtime requirements brought to the measured install (Python 3.11, Linux x86_64), besides
pip and the app itself."""

ELSEWHERE = {"tomli", "exceptiongroup", "colorama"}
"""What the same requirements add on Python 3.10 or Windows only (by their markers): small, and not measured."""

BUDGET_MIB = 1e9 / MIB
"""1 GB."""

BESIDES_MIB = 36
"""What the venv holds besides the runtime distributions, measured on the fresh install: pip (7.0 MiB), the
interpreter's links and the scripts (6.4), and the bytecode a first `say` and `export` write (21.8)."""


def runtime_requirements() -> list[str]:
    """pyproject.toml's [project] dependencies: the app without extras."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def installed_requires() -> dict[str, list[str]]:
    """Each distribution installed here and its Requires-Dist lines, by normalized name."""
    return {normalize(d.metadata["Name"]): list(d.requires or []) for d in importlib.metadata.distributions()}


def test_the_runtime_requirements_bring_only_the_measured_distributions() -> None:
    closure = runtime_closure(runtime_requirements(), installed_requires())
    new = sorted(closure - MEASURED - ELSEWHERE)
    assert not new, (f"new in the user install: {new}. Measure a fresh scripts/install.sh (python -m "
                     f"lab.install_size VENV), keep it under 1 GB, and add them here and to docs/performance.md")
    assert {"transformers", "scipy", "pyloudnorm"}.isdisjoint(closure), "extras (transformers) or dev-only"


def test_the_closure_follows_requirements_their_markers_and_the_extras_asked_for() -> None:
    requires = {"my-a": ["b>=1", "c; python_version < '3'", "d; extra == 'x'"], "b": ["My.A", "e[x]"], "c": [],
                "d": [], "e": ["f; extra == 'x'", "g; extra == 'y'"], "f": [], "g": []}
    assert runtime_closure(["My_A>=2"], requires) == {"my-a", "b", "e", "f"}
    assert runtime_closure(["my-a[x]; python_version >= '3'"], requires) == {"my-a", "b", "d", "e", "f"}


def torch_left_out(site: Path, tmp_path: Path) -> frozenset[Path]:
    """The files of this venv's torch that scripts/install.sh removes on a machine without a GPU (its own --dry-run
    says which: the paths of its `rm` steps, under site-packages)."""
    removed = [word.split("/site-packages/", 1)[1] for command in dry_run(tmp_path, gpu=False) if command[0] == "rm"
               for word in command[2:]]
    assert removed and all(path.startswith("torch/") for path in removed), removed
    found: set[Path] = set()
    for pattern in removed:
        for hit in map(Path, glob.glob(str(site / pattern))):
            found.update([hit.resolve()] if hit.is_file() else [p.resolve() for p in hit.rglob("*") if p.is_file()])
    return frozenset(found)


def test_what_the_runtime_requirements_install_here_fits_in_1_gb(tmp_path: Path) -> None:
    torch = importlib.metadata.distribution("torch")
    if not torch.version.startswith("2.13.0") or "+cpu" not in torch.version:
        pytest.skip(f"the measured install has torch 2.13.0+cpu; this venv has {torch.version}")
    site = Path(sysconfig.get_paths()["purelib"])
    infos = distributions(site)
    closure = runtime_closure(runtime_requirements(), installed_requires()) & infos.keys()
    left_out = torch_left_out(site, tmp_path)
    importable = sorted(str(p) for p in left_out if p.suffix in (".py", ".so") or ".so." in p.name)
    assert not importable, f"install.sh would remove what Python loads: {importable[:5]}"
    seen: set[tuple[int, int]] = set()
    mib = {name: distribution_bytes(site, infos[name], seen, left_out if name == "torch" else frozenset()) / MIB
           for name in sorted(closure)}
    assert mib["torch"] > 100, "torch's files were found"
    total = sum(mib.values()) + BESIDES_MIB
    largest = ", ".join(f"{name} {size:.1f}" for name, size in sorted(mib.items(), key=lambda kv: -kv[1])[:8])
    assert total < BUDGET_MIB, f"the user install would take {total:.0f} MiB, over 1 GB: {largest} MiB, ..."
