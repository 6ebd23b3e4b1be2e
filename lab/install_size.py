"""Measures a virtual environment per installed distribution, for the user install's size (docs/performance.md):

    python -m lab.install_size VENV [--json]

Each distribution is the files its RECORD lists that are still there (scripts/install.sh removes torch's C++ test
programs), without bytecode; the bytecode caches (`__pycache__`, written by pip's compiling or by runs) are one line
of their own; the total is the whole folder as `du` counts it (disk blocks, each hard link once). Run it with any
Python 3.10+: it reads the folder, it imports nothing from it. tests/test_install_size.py holds the app's runtime
requirements to the distributions measured here, with `runtime_closure`.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Mapping

MIB = 2 ** 20


def disk_bytes(path: Path, seen: set[tuple[int, int]]) -> int:
    """What one file takes on disk, as du counts it (its blocks; a hard link already in `seen` counts nothing)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return 0
    key = (st.st_dev, st.st_ino)
    if key in seen:
        return 0
    seen.add(key)
    return st.st_blocks * 512


def tree_bytes(root: Path, seen: set[tuple[int, int]]) -> int:
    """A folder's disk use, itself and everything under it (links not followed)."""
    total = disk_bytes(root, seen)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            total += disk_bytes(Path(folder) / name, seen)
    return total


def site_packages(venv: Path) -> Path:
    """The venv's site-packages folder."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"install_size: no lib/python3*/site-packages in {venv}")
    return found[0]


def normalize(name: str) -> str:
    """A distribution's name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(site: Path) -> dict[str, Path]:
    """Each installed distribution's dist-info folder, by normalized name."""
    found = {}
    for info in site.glob("*.dist-info"):
        meta = info / "METADATA"
        if meta.is_file():
            name = next((line.split(":", 1)[1].strip() for line in meta.read_text(errors="replace").splitlines()
                         if line.startswith("Name:")), None)
            if name:
                found[normalize(name)] = info
    return found


def record_paths(site: Path, info: Path) -> list[Path]:
    """The files a distribution installed (its RECORD), resolved against site-packages."""
    record = info / "RECORD"
    if not record.is_file():
        return []
    with record.open(newline="") as f:
        return [(site / row[0]).resolve() for row in csv.reader(f) if row]


def distribution_bytes(site: Path, info: Path, seen: set[tuple[int, int]], left_out: frozenset[Path] = frozenset()
                       ) -> int:
    """Disk bytes of a distribution's files (its RECORD's, those there), without bytecode and without `left_out`."""
    return sum(disk_bytes(p, seen) for p in record_paths(site, info) if p.suffix != ".pyc" and p not in left_out)


def sizes(venv: Path) -> dict[str, int]:
    """Disk bytes per distribution (bytecode left out), plus "(bytecode)" for every __pycache__ in the venv and
    "(other)" for the rest of the folder (the interpreter's links, scripts, what no RECORD names)."""
    site = site_packages(venv)
    seen: set[tuple[int, int]] = set()
    out = {name: distribution_bytes(site, info, seen) for name, info in sorted(distributions(site).items())}
    caches = [Path(folder) for folder, dirs, _ in os.walk(venv) if Path(folder).name == "__pycache__"]
    out["(bytecode)"] = sum(tree_bytes(c, seen) for c in caches)
    out["(other)"] = tree_bytes(venv, seen)  # what is left: everything counted above is in `seen` already
    return out


def runtime_closure(requirements: Iterable[str], requires_of: Mapping[str, list[str]]) -> set[str]:
    """The distributions that `requirements` (PEP 508 lines) bring, transitively, on this platform: `requires_of`
    gives each installed distribution's own Requires-Dist lines, by normalized name. A line with an extra's marker
    counts where its distribution was asked for with that extra (`markdown-it-py[linkify]`)."""
    from packaging.requirements import Requirement

    todo: list[tuple[str, frozenset[str]]] = [(line, frozenset({""})) for line in requirements]
    done: set[tuple[str, str]] = set()
    while todo:
        line, extras = todo.pop()
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = normalize(req.name)
        wanted = {""} | set(req.extras)
        if {(name, e) for e in wanted} <= done:
            continue
        done.update((name, e) for e in wanted)
        todo.extend((dep, frozenset(wanted)) for dep in requires_of.get(name, []))
    return {name for name, _ in done}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.install_size", description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("--json", action="store_true", help="bytes per distribution as JSON")
    args = parser.parse_args(argv)
    if not args.venv.is_dir():
        print(f"install_size: {args.venv} is not a folder", file=sys.stderr)
        return 2
    measured = sizes(args.venv)
    if args.json:
        print(json.dumps(measured, indent=1))
        return 0
    for name, size in sorted(measured.items(), key=lambda kv: -kv[1]):
        print(f"{size / MIB:9.1f} MiB  {name}")
    total = sum(measured.values())
    print(f"{total / MIB:9.1f} MiB  total ({total / 1e9:.3f} GB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
