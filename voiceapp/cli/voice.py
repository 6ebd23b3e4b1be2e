"""Provides `voicectl voice add NAME --from ref.wav` (clone a voice from a recording) and `voice remove NAME`."""
from __future__ import annotations

import argparse
import re
import sys

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
REFERENCE_READ_S = 6.0
"""Seconds of the reference that are read: what the speaker encoder uses (BiCodecDecoder's 6 s clip, a shorter
recording tiled up to it): a long recording is never read whole (docs/reliability.md)."""


def add_parser(sub) -> None:
    p = sub.add_parser("voice", help="add or remove your own voices")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="clone a voice from a reference recording (6 s are used)")
    add.add_argument("name", help="voice name: lowercase letters, digits, - and _")
    add.add_argument("--from", dest="ref", required=True, metavar="REF.wav", help="reference audio file")
    add.add_argument("--gender", choices=["female", "male"], default="female", help="recorded for display only")
    add.add_argument("--description", default="", help="shown by `voicectl voices`")
    add.add_argument("--force", action="store_true", help="replace an existing user voice of that name")
    add.add_argument("--shadow-preset", action="store_true",
                     help="let the new voice hide the built-in preset of that name (every front end then uses yours)")
    add.add_argument("--model", metavar="DIR", help="checkpoint directory")
    rm = actions.add_parser("remove", help="delete one of your voices")
    rm.add_argument("name")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return add_voice(args) if args.action == "add" else remove_voice(args)


def add_voice(args: argparse.Namespace) -> int:
    from engine.errors import InputError
    from engine.families import detect
    from engine.model import load_model_info, resolve_model_dir
    from engine.voices import Voice, VoiceBank

    if not NAME_RE.match(args.name):
        raise InputError(f"voice name {args.name!r}: use 1-32 lowercase letters, digits, - or _")
    bank = VoiceBank()
    if bank.builtin(args.name) is not None and not args.shadow_preset:
        raise InputError(f"{args.name!r} is a built-in preset; pick another name, or pass --shadow-preset to hide "
                         "the preset behind your voice")
    if (bank.dirs[-1] / f"{args.name}.toml").exists() and not args.force:
        raise InputError(f"{args.name!r} is already your voice; pick another name or pass --force")
    root = resolve_model_dir(args.model)
    family = detect(root)
    if not family.cached_voices:  # its voices are names the model was trained on, not speaker tokens
        raise InputError(f"cloning a voice from a recording needs a Spark-TTS model; this {family.name} model has "
                         f"its own voices: {', '.join(sorted(family.voices().all()))}")
    wav = read_reference(args.ref)
    info = load_model_info(root)
    from engine.backends.bicodec import BiCodecDecoder

    codes = BiCodecDecoder(info.bicodec_dir, with_encoder=True).extract_globals(wav)
    voice = Voice(name=args.name, description=args.description or f"cloned from {args.ref}", gender=args.gender,
                  global_tokens=tuple(codes), model_hash=info.checkpoint_hash)
    path = bank.save_user_voice(voice)
    print(f"added voice {args.name!r} ({len(wav) / 16000:.1f} s reference) -> {path}", file=sys.stderr)
    return 0


def read_reference(path: str, rate: int = 16000):
    """The first REFERENCE_READ_S seconds of a recording (all of a shorter one), mono float32 at `rate`: its
    loudest channel, resampled with soxr (VHQ) when needed. Only those frames are read from the file."""
    import numpy as np
    import soundfile as sf
    import soxr

    from engine.errors import InputError

    try:  # opened here, not by libsndfile, whose error for a missing file is "System error."
        file = open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not an audio file") from None
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        with file, sf.SoundFile(file) as sound:
            sr = sound.samplerate
            audio = sound.read(frames=int(REFERENCE_READ_S * sr), dtype="float32", always_2d=True)
    except sf.LibsndfileError as err:
        if "not recognised" in err.error_string or "not recognized" in err.error_string:
            raise InputError(f"{path} is not an audio file (or not in a format libsndfile reads, such as WAV, "
                             f"FLAC, Ogg or MP3)") from None
        raise InputError(f"cannot read {path} as audio: {err.error_string.strip().rstrip('.')}") from None
    except (RuntimeError, OSError) as err:
        raise InputError(f"cannot read {path} as audio: {str(err).splitlines()[0]}") from None
    if not np.isfinite(audio).all():
        raise InputError(f"{path} holds NaN or infinite samples; export it again as ordinary audio")
    audio = loudest_channel(audio)
    if sr != rate:
        audio = soxr.resample(audio, sr, rate, quality="VHQ").astype(np.float32, copy=False)
    if len(audio) < rate // 2:
        raise InputError(f"{path}: need at least 0.5 s of audio, got {len(audio) / rate:.2f} s")
    if not np.abs(audio).max() > 1e-4:
        raise InputError(f"{path}: the first {REFERENCE_READ_S:g} s are silent; need a recording of the voice")
    return audio


def loudest_channel(audio):
    """The channel of [frames, channels] with the most energy, as one contiguous array: a recording with the voice
    on one side only (the other silent) keeps the voice, and no downmix can cancel channels in opposite phase."""
    import numpy as np

    energy = np.einsum("fc,fc->c", audio, audio, dtype=np.float64)
    return np.ascontiguousarray(audio[:, int(np.argmax(energy))])


def remove_voice(args: argparse.Namespace) -> int:
    from engine.errors import VoiceNotFound
    from engine.voices import VoiceBank

    bank = VoiceBank()
    path = bank.dirs[-1] / f"{args.name}.toml"
    if not path.is_file():
        raise VoiceNotFound(f"no user voice {args.name!r} (built-in presets cannot be removed)")
    path.unlink()
    print(f"removed voice {args.name!r}", file=sys.stderr)
    return 0
