"""Provides `voicectl voices`: the voice presets, and which have cached globals for the current model."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("voices", help="list voices")
    p.add_argument("--model", metavar="DIR", help="show cache status for this checkpoint")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.errors import VoiceError
    from engine.voices import DEFAULT_VOICE, GlobalsCache, VoiceBank

    cache = None
    try:
        from engine.model import load_model_info, resolve_model_dir

        cache = GlobalsCache(load_model_info(resolve_model_dir(args.model)).checkpoint_hash)
    except VoiceError:
        pass  # no model: list voices without cache status
    for name, voice in sorted(VoiceBank().all().items()):
        if voice.global_tokens is not None:
            status = "cloned"
        elif cache is None:
            status = "-"
        else:
            status = "cached" if cache.has(voice) else "not cached"
        mark = "*" if name == DEFAULT_VOICE else " "
        attrs = f"{voice.gender}, pitch {voice.pitch}, speed {voice.speed}" if voice.global_tokens is None \
            else f"{voice.gender}, from reference audio"
        description = " ".join(voice.description.split())  # one line a voice, whatever the file holds
        print(f"{mark} {name:<10} {attrs:<40} {status:<11} {description}")
    return 0
