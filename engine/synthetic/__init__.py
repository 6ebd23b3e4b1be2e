"""Provides synthetic checkpoints: random weights in the exact Spark-TTS-0.5B layout, for tests and benchmarks.

`write_checkpoint(out_dir, size, seed)` writes the top-level `config.yaml`, `LLM/` (`engine.synthetic.llm`) and
`BiCodec/` (`engine.synthetic.bicodec`). `tiny` keeps every id and the LLM vocabulary but shrinks the layers;
`full` has the release's shapes. Imports torch (lazily): not a pure module.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.errors import OutputError

SIZES = ("tiny", "full")
CHECKPOINT_MARKERS = ("config.yaml", "LLM", "BiCodec")
"""Entries that make an existing directory count as a checkpoint that `overwrite` may replace."""

TOP_CONFIG = """\
highpass_cutoff_freq: 40
sample_rate: 16000
segment_duration: 2.4
max_val_duration: 12
latent_hop_length: 320
ref_segment_duration: 6
volume_normalize: true
"""
"""The release's top-level `config.yaml` (format spec §1.1), byte for byte the same for every size and seed."""

README = """\
# Synthetic Spark-TTS checkpoint ({size}, seed {seed})

Random weights in the Spark-TTS-0.5B layout, written by `voicectl model synth`. It loads and runs like the
real model but does not speak: it is for tests and benchmarks only.
"""


def write_checkpoint(out_dir: Path, size: str = "tiny", seed: int = 0, overwrite: bool = False) -> Path:
    """Write a complete synthetic checkpoint to `out_dir` and return it.

    The files are built in a hidden temporary sibling and renamed into place at the end, so an interrupted run
    never leaves something that looks complete. A non-empty existing `out_dir` is refused (OutputError)
    unless `overwrite` and it looks like a checkpoint (has one of CHECKPOINT_MARKERS); then it is replaced.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    out_dir = Path(out_dir).expanduser().absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"{out_dir} exists and is not a directory")
    if _non_empty(out_dir):
        if not overwrite:
            raise OutputError(f"{out_dir} exists and is not empty; choose another directory or overwrite it (--force)")
        if not any((out_dir / name).exists() for name in CHECKPOINT_MARKERS):
            raise OutputError(f"refusing to overwrite {out_dir}: it is not empty and does not look like a checkpoint")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create {out_dir.parent}: {err.strerror or err}") from err

    from engine.synthetic.bicodec import write_bicodec
    from engine.synthetic.llm import write_llm

    tmp = out_dir.with_name(f".{out_dir.name}.synth-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        (tmp / "config.yaml").write_text(TOP_CONFIG, encoding="utf-8", newline="\n")
        (tmp / "README.md").write_text(README.format(size=size, seed=seed), encoding="utf-8", newline="\n")
        write_llm(tmp, size, seed)
        write_bicodec(tmp, size, seed)
        _move_into_place(tmp, out_dir)
    except OSError as err:
        raise OutputError(f"cannot write checkpoint to {out_dir}: {err.strerror or err}") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _non_empty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`, replacing an existing (empty, or overwritable) directory."""
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        os.replace(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)
