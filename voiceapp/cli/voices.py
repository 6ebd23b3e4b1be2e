"""Provides `voicectl voices`: the voice presets, and which have cached globals for the current model."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("voices", help="list voices")
    p.add_argument("--model", metavar="DIR", help="show cache status for this checkpoint")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.errors import VoiceError
    from engine.families import detect, family
    from engine.model import resolve_model_dir
    from engine.voices import GlobalsCache

    cache, fam = None, family("spark")
    try:
        root = resolve_model_dir(args.model)
        fam = detect(root)
        cache = GlobalsCache(fam.read(root).checkpoint_hash)
    except VoiceError:
        pass  # no model: list the voices without cache status
    bank = fam.voices()
    for name, voice in sorted(bank.all().items()):
        if not fam.cached_voices:
            status, attrs = "-", voice.gender
        elif voice.global_tokens is not None:
            status, attrs = "cloned", f"{voice.gender}, from reference audio"
        else:
            status = "-" if cache is None else "cached" if cache.has(voice) else "not cached"
            attrs = f"{voice.gender}, pitch {voice.pitch}, speed {voice.speed}"
        mark = "*" if name == bank.default else " "
        description = " ".join(voice.description.split())  # one line a voice, whatever the file holds
        print(f"{mark} {name:<10} {attrs:<40} {status:<11} {description}")
    return 0
