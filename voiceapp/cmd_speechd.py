"""Provides `voicectl speechd install|uninstall|status`: speech-dispatcher's output module (per user), so `spd-say` and
screen readers speak through the warm engine; and `voicectl speechd speak`, the command that module runs."""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from voiceapp.cmd_say import add_playback_args
from voiceapp.common import add_engine_args, add_server_args, add_voice_args

SPEAK_SEED = 0
"""The seed `speechd speak` uses unless install was given one: a screen reader says the same words the same way."""


def add_parser(sub) -> None:
    p = sub.add_parser("speechd", help="speech-dispatcher output module: voicectl speechd install [--default]")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    inst = actions.add_parser("install", help="configure speech-dispatcher (for this user) to speak with voiceapp")
    inst.add_argument("--default", action="store_true", help="make voiceapp speech-dispatcher's default module")
    inst.add_argument("--voice", default="default",
                      help="what speechd's default voice type (MALE1 unless DefaultVoiceType says otherwise) speaks, "
                           "and any language without voice types (see `voicectl voices`)")
    inst.add_argument("--seed", type=int, help=f"sampling seed of every message (default {SPEAK_SEED})")
    inst.add_argument("--max-tokens", type=int, metavar="N", help="cap on semantic tokens per sentence (as say's)")
    inst.add_argument("--device", help="output device name or index (see `voicectl devices`)")
    add_engine_args(inst)
    actions.add_parser("uninstall", help="remove what install added")
    actions.add_parser("status", help="what is installed, and whether speech-dispatcher runs (exit 1: not installed)")
    speak = actions.add_parser("speak", help="speak one message (what speech-dispatcher runs; SIGKILL stops it)")
    speak.add_argument("text", help="the message ($DATA)")
    speak.add_argument("--rate", default="0", help="speechd's rate, -100..100 ($RATE)")
    speak.add_argument("--pitch", default="0", help="speechd's pitch, -100..100 ($PITCH)")
    add_playback_args(speak)
    add_voice_args(speak, default_seed=SPEAK_SEED)
    add_server_args(speak, "speak")
    add_engine_args(speak)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return {"install": install, "uninstall": uninstall, "status": status, "speak": speak}[args.action](args)


def _paths():
    from voiceapp.speechd import Paths, user_conf_dir

    return Paths(user_conf_dir())


def speak_options(args: argparse.Namespace) -> list[str]:
    """The install's flags that `speechd speak` must get too (the model as an absolute path: speechd's working
    directory is not ours)."""
    options = []
    if args.model:
        options += ["--model", str(Path(args.model).expanduser().resolve())]
    if args.backend != "auto":
        options += ["--backend", args.backend]
    if args.compute != "auto":
        options += ["--compute", args.compute]
    if args.threads is not None:
        options += ["--threads", str(args.threads)]
    if args.no_graph_lane:
        options.append("--no-graph-lane")
    if args.no_warm_up:
        options.append("--no-warm-up")
    if args.seed is not None:
        options += ["--seed", str(args.seed)]
    if args.max_tokens is not None:
        options += ["--max-tokens", str(args.max_tokens)]
    if args.device:
        options += ["--device", args.device]
    return options


def install(args: argparse.Namespace) -> int:
    from engine.voices import DEFAULT_VOICE, VoiceBank, resolve_name
    from voiceapp import speechd
    from voiceapp.common import checked_threads, require_voice

    require_voice(args.voice)
    checked_threads(args.threads)
    paths = _paths()
    voices = speechd.installable_voices(VoiceBank().all())
    command = speechd.speak_command(sys.executable, speak_options(args))
    chosen = None if args.voice in ("", "default") else resolve_name(args.voice)
    default_type = speechd.default_voice_type(paths.effective_conf())
    slots = speechd.type_slots(chosen, default_type)
    result = speechd.install(paths, speechd.module_conf_text(command, voices, slots, chosen or DEFAULT_VOICE),
                             args.default)
    what = "wrote" if paths.module_conf in result.changed else "unchanged:"
    print(f"{what} {paths.module_conf} (output module {speechd.MODULE}, {len(voices)} voices; speechd's default "
          f"voice type, {default_type}, speaks {slots[default_type]})")
    if result.created_conf:
        print(f"wrote {paths.speechd_conf}: a copy of {paths.system_conf} (speech-dispatcher reads a user's file "
              f"instead of it), with voiceapp's lines at the end")
    elif paths.speechd_conf in result.changed:
        print(f"updated {paths.speechd_conf}: voiceapp's lines at the end, the rest kept")
    else:
        print(f"unchanged: {paths.speechd_conf}")
    if not result.changed:
        print("nothing to change: installed like this already")
    elif (pid := speechd.reload_running()) is not None:
        print(f"asked the running speech-dispatcher (pid {pid}) to reload its configuration")
    elif shutil.which("speech-dispatcher") is None:
        print("speech-dispatcher is not installed here (e.g. apt-get install speech-dispatcher)")
    else:
        print("speech-dispatcher reads it when it next starts")
    use = 'spd-say "Hello"' if args.default else f'spd-say -o {speechd.MODULE} "Hello"'
    print(f"try: {use}; undo: voicectl speechd uninstall")
    return 0


def uninstall(args: argparse.Namespace) -> int:
    from voiceapp import speechd

    done = speechd.uninstall(_paths())
    for line in done or ["nothing to remove: voiceapp is not installed for speech-dispatcher"]:
        print(line)
    if done and (pid := speechd.reload_running()) is not None:
        print(f"asked the running speech-dispatcher (pid {pid}) to reload its configuration")
    return 0


def status(args: argparse.Namespace) -> int:
    from voiceapp import speechd

    paths = _paths()
    binary = shutil.which("speech-dispatcher")
    print(f"speech-dispatcher: {binary or 'not installed'}")
    installed = paths.module_conf.exists()
    print(f"module {speechd.MODULE}: {paths.module_conf if installed else 'not installed (voicectl speechd install)'}")
    if installed:
        print(f"it runs: {speechd.module_command(paths.module_conf.read_text(encoding='utf-8')) or '(no command)'}")
    conf = paths.speechd_conf.read_text(encoding="utf-8") if paths.speechd_conf.exists() else ""
    _, has_block, _ = speechd.strip_block(conf)
    default = any(line.split()[1:2] == [speechd.MODULE] for line in speechd.active_lines(conf, "DefaultModule"))
    if has_block:
        print(f"{paths.speechd_conf}: voiceapp's lines present; default module: {'yes' if default else 'no'}")
    pid = speechd.running_pid()
    print(f"running: {f'pid {pid}' if pid else 'no'}")
    return 0 if installed and has_block else 1


def speak(args: argparse.Namespace) -> int:
    """One message: its text decoded as sd_generic sent it, the voice picked from $VOICE, $RATE and $PITCH, spoken
    as `say` speaks (through the warm server, the audio played here). Nothing to say is not an error: a screen
    reader sends lone punctuation all the time."""
    from engine.text import is_speakable, normalize
    from engine.voices import DEFAULT_VOICE, VoiceBank, resolve_name
    from voiceapp import speechd
    from engine.config import SynthesisRequest
    from voiceapp.cmd_say import SayMetrics, say, send_ahead
    from voiceapp.common import sampling_options

    text = speechd.decode_data(os.fsencode(args.text))
    if not text.strip() or not is_speakable(normalize(text)):
        return 0
    voices = VoiceBank().all()
    name = resolve_name(args.voice)
    if name not in voices:
        name = DEFAULT_VOICE if DEFAULT_VOICE in voices else sorted(voices)[0]
    args.voice = speechd.pick_voice(name, speechd.speechd_number(args.rate), speechd.speechd_number(args.pitch),
                                    voices)
    args.out = None
    req = SynthesisRequest(text, voice=args.voice, options=sampling_options(args))
    asyncio.run(say(req, False, args, SayMetrics(), send_ahead(args, req, from_stdin=False)))
    return 0
