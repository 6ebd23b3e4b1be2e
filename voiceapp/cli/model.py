"""Provides `voicectl model synth|download|info`: get a checkpoint, or check and describe one."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="get a checkpoint (Spark-TTS, Orpheus), or check and describe one",
                                   description="Get a checkpoint (Spark-TTS, Orpheus), or check and describe one.")
    parser.set_defaults(run=run, model_action=None, model_parser=parser)
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION")

    synth = sub.add_parser("synth", help="write a random-weight checkpoint in the real layout (tests, benchmarks)",
                           description="Write a random-weight checkpoint in a model family's exact layout. "
                                       "It loads and runs like the real model but does not speak.")
    synth.add_argument("dir", metavar="DIR", help="directory to create")
    synth.add_argument("--family", choices=FAMILY_NAMES, default="spark", help="model family (default spark)")
    synth.add_argument("--size", choices=("tiny", "full"), default="tiny",
                       help="tiny: small layers, real ids (default); full: the release's shapes (Spark ~2.6 GB, "
                            "Orpheus ~6.6 GB)")
    synth.add_argument("--seed", type=int, default=0, help="weight seed; same seed, same bytes (default 0)")
    synth.add_argument("--force", action="store_true", help="replace DIR if it already holds a checkpoint")
    synth.set_defaults(model_action=_synth)

    download = sub.add_parser("download", help="download the model from the Hugging Face Hub",
                              description="Download the model with huggingface_hub (into its cache unless --dir).")
    download.add_argument("--family", choices=FAMILY_NAMES, default="spark",
                          help="model family (default spark; orpheus also fetches its SNAC decoder and needs --dir)")
    download.add_argument("--repo", metavar="ID", default=None, help="repo id (default: the family's release)")
    download.add_argument("--dir", metavar="DIR", default=None,
                          help="download into DIR instead of the Hugging Face cache (then use --model DIR)")
    download.set_defaults(model_action=_download)

    info = sub.add_parser("info", help="check a checkpoint and print its layout, token ids and hash",
                          description="Find the checkpoint (--model, $VOICEAPP_MODEL, Hugging Face cache), "
                                      "check it and describe it. Exit status 0 only if it is valid.")
    info.add_argument("--model", metavar="DIR", default=None, help="checkpoint directory")
    info.set_defaults(model_action=_info)


def run(args: argparse.Namespace) -> int:
    if args.model_action is None:
        args.model_parser.print_help(sys.stderr)
        return 2
    return args.model_action(args)


def _synth(args: argparse.Namespace) -> int:
    from engine.families import family

    fam = family(args.family)
    _status(f"writing a {args.size} synthetic {fam.name} checkpoint (seed {args.seed}) to {args.dir} ...")
    start = time.perf_counter()
    path = fam.write_synthetic(Path(args.dir), size=args.size, seed=args.seed, overwrite=args.force)
    elapsed = time.perf_counter() - start
    info = fam.read(path)
    print(f"{path}: {args.size} synthetic checkpoint, {_human(_tree_size(path))}, written in {elapsed:.1f} s, "
          f"hash {info.checkpoint_hash}")
    print(f"use it with --model {path} (or VOICEAPP_MODEL={path})")
    return 0


def _download(args: argparse.Namespace) -> int:
    from engine.download import download_model
    from engine.errors import InputError
    from engine.families import family
    from engine.model import DEFAULT_REPO

    fam = family(args.family)
    (repo, _), *parts = fam.downloads
    repo = args.repo or repo
    if parts and args.dir is None:
        raise InputError(f"a {fam.name} checkpoint is assembled from {1 + len(parts)} repos: give --dir DIR")
    _status(f"downloading {repo} ...")
    path = download_model(repo, dest=args.dir)
    for part_repo, folder in parts:
        _status(f"downloading {part_repo} into {folder}/ ...")
        download_model(part_repo, dest=str(Path(args.dir) / folder))
    info = fam.read(path)
    print(f"{path}: {repo}, hash {info.checkpoint_hash}")
    if args.dir is not None:
        print(f"use it with --model {path} (or VOICEAPP_MODEL={path})")
    elif repo != DEFAULT_REPO:
        print(f"only {DEFAULT_REPO} is found automatically: use --model {path} (or VOICEAPP_MODEL={path})")
    return 0


def _info(args: argparse.Namespace) -> int:
    from engine.families import detect
    from engine.model import resolve_model_dir

    root = resolve_model_dir(args.model)
    print(f"model        {root}")
    fam = detect(root)  # a one-line ModelFormatError (exit 1) where it is no family's, or several
    print(f"family       {fam.name}: {fam.description}")
    if fam.cached_voices:  # Spark: its files first
        for rel, size in _layout(root):
            print(f"  {rel:<40} {_human(size) if size is not None else 'missing'}")
    info = fam.read(root)  # raises a one-line ModelFormatError (exit 1) if invalid
    for line in info.summary():
        print(line)
    print(f"hash         {info.checkpoint_hash}")
    print("valid        yes")
    return 0


FAMILY_NAMES = ("spark", "orpheus")
"""engine.families.FAMILIES' names (kept here so that `voicectl --help` imports no engine module)."""


def _status(line: str) -> None:
    """A progress line for a human watching (stderr is a terminal); scripts see only results and errors."""
    if sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)


def _layout(root: Path) -> list[tuple[str, int | None]]:
    """(relative path, size or None if missing) for every file the engine reads."""
    names = ["config.yaml", "LLM/config.json"]
    index = root / "LLM" / "model.safetensors.index.json"
    if not (root / "LLM" / "model.safetensors").is_file() and index.is_file():
        names += ["LLM/model.safetensors.index.json"]
        names += sorted(f"LLM/{p.name}" for p in (root / "LLM").glob("model-*.safetensors"))
    else:
        names += ["LLM/model.safetensors"]
    names += ["LLM/tokenizer.json", "LLM/tokenizer_config.json", "BiCodec/config.yaml", "BiCodec/model.safetensors"]
    out: list[tuple[str, int | None]] = [(n, (root / n).stat().st_size if (root / n).is_file() else None)
                                         for n in names]
    wav2vec2 = root / "wav2vec2-large-xlsr-53"
    if wav2vec2.is_dir():
        out.append(("wav2vec2-large-xlsr-53/", _tree_size(wav2vec2)))
    return out


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
