"""Provides `voicectl speechd install|uninstall|status`: speech-dispatcher's native output module (per user), so
`spd-say` and screen readers speak through the warm engine; and `voicectl speechd module CONFIG`, the module process
speechd starts (voiceapp.speechd.module)."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from voiceapp.common import add_engine_args

SPEAK_SEED = 0
"""The seed the module speaks with unless install was given one: a screen reader says the same words the same way."""


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
    inst.add_argument("--latency", type=float, help="output stream latency in seconds (as say's)")
    add_engine_args(inst)
    actions.add_parser("uninstall", help="remove what install added")
    actions.add_parser("status", help="what is installed, and whether speech-dispatcher runs (exit 1: not installed)")
    module = actions.add_parser("module", help="the output module process speech-dispatcher starts (not for people)")
    module.add_argument("config", help="the module's configuration file (speechd passes it)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return {"install": install, "uninstall": uninstall, "status": status, "module": module}[args.action](args)


def _paths():
    from voiceapp.speechd.install import Paths, user_conf_dir, user_module_dir

    return Paths(user_conf_dir(), module_dir=user_module_dir())


def checked_model(args: argparse.Namespace) -> str | None:
    """The checkpoint the module will use, as an absolute path (speechd's working directory and environment are not
    ours), checked now: ModelNotFound or ModelFormatError (one line) for a missing or invalid one. None for the fake
    backend, which needs none."""
    if args.backend == "fake":
        return None
    from engine.families import detect
    from engine.model import resolve_model_dir

    path = resolve_model_dir(args.model).resolve()
    detect(path).read(path)
    return str(path)


def module_options(args: argparse.Namespace, model: str | None) -> list[str]:
    """The install's flags the module speaks with."""
    options = []
    if model:
        options += ["--model", model]
    if args.backend != "auto":
        options += ["--backend", args.backend]
    if args.compute != "auto":
        options += ["--compute", args.compute]
    if args.threads is not None:
        options += ["--threads", str(args.threads)]
    if args.quantize:
        options += ["--quantize", args.quantize]
    if args.no_graph_lane:
        options.append("--no-graph-lane")
    if args.no_warm_up:
        options.append("--no-warm-up")
    if args.max_tokens is not None:
        options += ["--max-tokens", str(args.max_tokens)]
    if args.device:
        options += ["--device", args.device]
    if args.latency is not None:
        options += ["--latency", str(args.latency)]
    options += ["--seed", str(SPEAK_SEED if args.seed is None else args.seed)]
    return options


def install(args: argparse.Namespace) -> int:
    from engine.errors import InputError
    from engine.families import family_of
    from voiceapp.speechd import install as speechd
    from voiceapp.common import checked_threads, require_voice
    from voiceapp.speechd.module import config_text

    checked_threads(args.threads)
    model = checked_model(args)
    require_voice(args.voice, model)
    bank = family_of(model).voices()
    paths = _paths()
    if any(c in str(paths.module_program) for c in '"\\\n'):
        raise InputError(f"speech-dispatcher's configuration cannot name {paths.module_program} (it holds a quote, a "
                         f"backslash or a line break)")
    chosen = None if args.voice in ("", "default") else args.voice
    default_type = speechd.default_voice_type(paths.effective_conf())
    slots = speechd.type_slots(chosen, default_type, bank.presets())
    text = config_text(module_options(args, model), slots, chosen or bank.default, speechd.module_log_path())
    result = speechd.install(paths, text, speechd.program_text(sys.executable), args.default)
    what = "wrote" if paths.module_conf in result.changed else "unchanged:"
    print(f"{what} {paths.module_conf} (output module {speechd.MODULE}; speechd's default voice type, {default_type}, "
          f"speaks {slots[default_type]}{f'; model {model}' if model else ''})")
    if paths.module_program in result.changed:
        print(f"wrote {paths.module_program} (what speech-dispatcher starts)")
    if paths.old_module_conf in result.changed:
        print(f"removed {paths.old_module_conf} (the earlier sd_generic module: {speechd.MODULE} replaces it)")
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
    from voiceapp.speechd import install as speechd

    done = speechd.uninstall(_paths())
    for line in done or ["nothing to remove: voiceapp is not installed for speech-dispatcher"]:
        print(line)
    if done and (pid := speechd.reload_running()) is not None:
        print(f"asked the running speech-dispatcher (pid {pid}) to reload its configuration")
    return 0


def status(args: argparse.Namespace) -> int:
    from voiceapp.speechd import install as speechd
    from voiceapp.speechd.module import read_config

    paths = _paths()
    binary = shutil.which("speech-dispatcher")
    print(f"speech-dispatcher: {binary or 'not installed'}")
    installed = paths.module_conf.exists() and paths.module_program.exists()
    print(f"module {speechd.MODULE}: {paths.module_conf if installed else 'not installed (voicectl speechd install)'}")
    log = speechd.module_log_path()
    if installed:
        try:
            config = read_config(paths.module_conf)
            print(f"it runs with: {' '.join(config.args)}")
            log = config.log or log
        except (OSError, ValueError, UnicodeDecodeError) as err:
            print(f"its configuration is broken ({err}): run `voicectl speechd install` again")
    if paths.old_module_conf.exists():
        print(f"{paths.old_module_conf}: the earlier sd_generic module (`voicectl speechd install` replaces it)")
    conf = paths.speechd_conf.read_text(encoding="utf-8") if paths.speechd_conf.exists() else ""
    _, has_block, _ = speechd.strip_block(conf)
    default = any(line.split()[1:2] == [speechd.MODULE] for line in speechd.active_lines(conf, "DefaultModule"))
    if has_block:
        print(f"{paths.speechd_conf}: voiceapp's lines present; default module: {'yes' if default else 'no'}")
    pid = speechd.running_pid()
    print(f"running: {f'pid {pid}' if pid else 'no'}")
    failures = module_failures(log)
    if failures:
        print(f"the module's log ({log}) ends with errors:")
        for line in failures:
            print(f"  {line}")
    return 0 if installed and has_block else 1


LOG_TAIL_LINES = 5
"""Lines of the module's log `status` shows when its last run logged an error."""


def module_failures(log: Path) -> list[str]:
    """The last lines of the module's last run when that run logged an error, else []."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        return []
    starts = [i for i, line in enumerate(lines) if "] started (" in line]
    last_run = lines[starts[-1]:] if starts else lines
    if not any("] error: " in line for line in last_run):
        return []
    return last_run[-LOG_TAIL_LINES:]


def module(args: argparse.Namespace) -> int:
    """speechd's module process: the protocol on stdin and stdout, as UTF-8 whatever the locale."""
    import io

    from voiceapp.speechd.module import run_module

    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="replace", newline="\n",
                              line_buffering=False)
    return run_module(args.config, stdin, stdout)
