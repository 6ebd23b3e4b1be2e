"""Provides the speech-dispatcher side of voiceapp's installation: the files `voicectl speechd install` writes (per
user): the native output module's start script (`sd_voiceapp`, in speechd's user module folder, which runs
`voicectl speechd module`) and its configuration, the edit of the user's speechd.conf that loads it (and, with
--default, makes it the default), and the migration from the earlier sd_generic configuration; plus what a message's
rate and pitch do to its voice (voiceapp.speechd.module speaks the messages).
"""
from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from engine.tokens import LEVELS
from engine.voices import VOICE_SLOTS, preset_slots

if TYPE_CHECKING:
    from engine.voices import Voice

MODULE = "voiceapp"
"""The output module's name (`spd-say -o voiceapp`). speechd starts `sd_voiceapp` from the user's module folder on its
own when speechd.conf lists no AddModule lines (its default); otherwise our AddModule line names it."""
MODULE_CONF = f"{MODULE}.conf"
MODULE_PROGRAM = f"sd_{MODULE}"
OLD_MODULE_CONF = "voiceapp-generic.conf"
"""The sd_generic configuration earlier versions installed: install replaces it with the native module."""
BEGIN = "# >>> voiceapp: added by `voicectl speechd install`; `voicectl speechd uninstall` removes it >>>"
END = "# <<< voiceapp <<<"
CREATED = "# voiceapp: this file was created as a copy of "
"""In our block when install created speechd.conf (from the system's): uninstall then removes the file if nothing
else in it changed."""
OFF = "#voiceapp-off# "
"""Prefix of the user's own DefaultModule lines that `install --default` turned off (uninstall turns them on)."""
SYSTEM_CONF_DIR = Path("/etc/speech-dispatcher")

LEVEL_STEP = 40
"""speechd's -100..100 per level of ours: |rate| or |pitch| below 20 keeps the voice's level, 20..59 moves one
level, 60 and more two."""


# ---- where things are ---------------------------------------------------------------------------------------------

def user_conf_dir(env: Mapping[str, str] | None = None) -> Path:
    """speechd's user configuration: $XDG_CONFIG_HOME/speech-dispatcher (default ~/.config/speech-dispatcher)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "speech-dispatcher"


def runtime_dir(env: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if env is None else env
    return Path(env["XDG_RUNTIME_DIR"]) / "speech-dispatcher" if env.get("XDG_RUNTIME_DIR") else None


def user_module_dir(env: Mapping[str, str] | None = None) -> Path:
    """speechd's user module folder: $XDG_DATA_HOME/../libexec/speech-dispatcher-modules (~/.local/libexec/...)."""
    env = os.environ if env is None else env
    data = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(os.path.normpath(Path(data) / ".." / "libexec" / "speech-dispatcher-modules"))


def module_log_path(env: Mapping[str, str] | None = None) -> Path:
    """The module's own log: $XDG_CACHE_HOME/voiceapp/speechd-module.log (default ~/.cache)."""
    env = os.environ if env is None else env
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(cache) / "voiceapp" / "speechd-module.log"


@dataclass(frozen=True)
class Paths:
    """The files install writes: speechd.conf (edited), the module's configuration and its start script."""

    conf_dir: Path
    system_dir: Path = SYSTEM_CONF_DIR
    module_dir: Path | None = None
    """speechd's user module folder (None: beside the configuration, for tests that never run speechd)."""

    @property
    def speechd_conf(self) -> Path:
        return self.conf_dir / "speechd.conf"

    @property
    def module_conf(self) -> Path:
        return self.conf_dir / "modules" / MODULE_CONF

    @property
    def old_module_conf(self) -> Path:
        return self.conf_dir / "modules" / OLD_MODULE_CONF

    @property
    def module_program(self) -> Path:
        return (self.module_dir or self.conf_dir / "libexec") / MODULE_PROGRAM

    @property
    def system_conf(self) -> Path:
        return self.system_dir / "speechd.conf"

    def effective_conf(self) -> str:
        """The speechd.conf speechd reads: the user's, else the system's ("" if neither exists)."""
        for path in (self.speechd_conf, self.system_conf):
            if path.is_file():
                return path.read_text(encoding="utf-8")
        return ""


# ---- the module --------------------------------------------------------------------------------------------------

def program_text(python: str) -> str:
    """The start script speechd runs (with the configuration's path as its argument)."""
    return (f"#!/bin/sh\n# speech-dispatcher output module voiceapp: written by `voicectl speechd install`\n"
            f"exec {shlex.quote(python)} -m voiceapp.cli speechd module \"$@\"\n")


def type_slots(voice: str | None, default_type: str, presets: Mapping[str, Voice]) -> dict[str, str]:
    """speechd's voice types -> our voices: engine.voices.preset_slots of the family's presets, with `voice` (install
    --voice) in the type speechd asks for when its client names none (DefaultVoiceType, MALE1 unless configured), so
    that it is what `spd-say` speaks."""
    slots = preset_slots(presets)
    if voice is not None:
        slots[default_type] = voice
    return slots


def default_voice_type(conf_text: str) -> str:
    """The DefaultVoiceType a speechd.conf sets (its last one), else speechd's own default, MALE1."""
    values = [line.split(None, 1)[1].strip().strip('"').upper() for line in active_lines(conf_text, "DefaultVoiceType")
              if len(line.split()) > 1]
    return values[-1] if values and values[-1] in VOICE_SLOTS else "MALE1"


# ---- speechd.conf ------------------------------------------------------------------------------------------------

def active_lines(text: str, keyword: str) -> list[str]:
    """The lines of a dotconf file that set `keyword` (case-insensitive, as dotconf reads it), comments aside."""
    return [line for line in text.splitlines() if line.strip().split(None, 1)[:1] and
            line.strip().split(None, 1)[0].lower() == keyword.lower()]


def strip_block(text: str) -> tuple[str, bool, str | None]:
    """`text` without our block and with the lines it turned off turned on again; whether a block was there; the
    file it was created from (or None)."""
    out, inside, found, created = [], False, False, None
    for line in text.splitlines(keepends=True):
        if line.rstrip("\r\n") == BEGIN:
            inside = found = True
        elif inside and line.rstrip("\r\n") == END:
            inside = False
        elif inside:
            if line.startswith(CREATED):
                created = line[len(CREATED):].strip()
        else:
            out.append(line[len(OFF):] if line.startswith(OFF) else line)
    return "".join(out), found, created


def with_block(text: str, make_default: bool, created_from: Path | None, program: Path) -> str:
    """`text` (a speechd.conf without our block) with it appended: an AddModule line naming `program` when the file
    already lists modules (speechd then loads only those), DefaultModule with `make_default` (the user's own turned
    off)."""
    lines = text.splitlines(keepends=True)
    if make_default:
        theirs = set(active_lines(text, "DefaultModule"))
        lines = [OFF + line if line.rstrip("\r\n") in theirs else line for line in lines]
    body = "".join(lines)
    if body and not body.endswith("\n"):
        body += "\n"
    block = [BEGIN]
    if created_from is not None:
        block.append(f"{CREATED}{created_from}")
    if active_lines(text, "AddModule"):
        block.append(f'AddModule "{MODULE}" "{program}" "{MODULE_CONF}"')
    if make_default:
        block.append(f"DefaultModule {MODULE}")
    block.append(END)
    return body + "\n".join(block) + "\n"


@dataclass
class InstallResult:
    changed: list[Path]
    """The files written (the others held what install writes already)."""
    created_conf: bool
    """speechd.conf did not exist: it was made as a copy of the system's, which speechd otherwise reads."""


def install(paths: Paths, module_text: str, program: str, make_default: bool) -> InstallResult:
    """Write the module's configuration and start script, remove the earlier sd_generic configuration, and add our
    block to speechd.conf (replacing an earlier one). Idempotent: a second run with the same arguments changes
    nothing."""
    paths.module_conf.parent.mkdir(parents=True, exist_ok=True)
    paths.module_program.parent.mkdir(parents=True, exist_ok=True)
    changed = [paths.module_conf] if write_if_changed(paths.module_conf, module_text) else []
    if write_if_changed(paths.module_program, program, mode=0o755):
        changed.append(paths.module_program)
    if paths.old_module_conf.exists():
        paths.old_module_conf.unlink()
        changed.append(paths.old_module_conf)
    if paths.speechd_conf.exists():
        text, _, created = strip_block(paths.speechd_conf.read_text(encoding="utf-8"))
        created_from = Path(created) if created else None
        created_conf = False
    else:
        text = paths.system_conf.read_text(encoding="utf-8") if paths.system_conf.is_file() else ""
        created_from, created_conf = paths.system_conf, True
    if write_if_changed(paths.speechd_conf, with_block(text, make_default, created_from, paths.module_program)):
        changed.append(paths.speechd_conf)
    return InstallResult(changed, created_conf)


def uninstall(paths: Paths) -> list[str]:
    """Undo install (an earlier version's sd_generic configuration too); returns what was done, one line each
    (nothing when nothing was installed)."""
    done = []
    for path in (paths.module_conf, paths.old_module_conf, paths.module_program):
        if path.exists():
            path.unlink()
            done.append(f"removed {path}")
            with contextlib.suppress(OSError):  # only when empty
                path.parent.rmdir()
    if paths.speechd_conf.exists():
        text, found, created = strip_block(paths.speechd_conf.read_text(encoding="utf-8"))
        if found:
            source = Path(created) if created else None
            if source is not None and text == (source.read_text(encoding="utf-8") if source.is_file() else ""):
                paths.speechd_conf.unlink()  # ours, unchanged: speechd reads the system's again
                done.append(f"removed {paths.speechd_conf} (the copy of {source} that install made)")
                with contextlib.suppress(OSError):
                    paths.conf_dir.rmdir()
            else:
                write_if_changed(paths.speechd_conf, text)
                done.append(f"removed voiceapp's lines from {paths.speechd_conf}")
    return done


def write_if_changed(path: Path, text: str, mode: int | None = None) -> bool:
    """Replace `path` atomically with `text` (and `mode`) unless it holds that already; whether it was written."""
    if path.exists() and path.read_text(encoding="utf-8") == text and (mode is None or
                                                                       path.stat().st_mode & 0o777 == mode):
        return False
    tmp = path.with_name(path.name + ".voiceapp-tmp")
    tmp.write_text(text, encoding="utf-8")
    if mode is not None:
        tmp.chmod(mode)
    tmp.replace(path)
    return True


# ---- the running speech-dispatcher ---------------------------------------------------------------------------

def running_pid(env: Mapping[str, str] | None = None) -> int | None:
    """The user's speech-dispatcher, from its pid file, while that pid is a live speech-dispatcher."""
    run = runtime_dir(env)
    if run is None:
        return None
    try:
        pid = int((run / "pid" / "speech-dispatcher.pid").read_text().split()[0])
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return None
    return pid if comm.startswith("speech-dispatc") else None


def reload_running(env: Mapping[str, str] | None = None) -> int | None:
    """Make the user's running speech-dispatcher re-read its configuration (SIGHUP); its pid, or None if none runs."""
    pid = running_pid(env)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError:
            return None
    return pid


# ---- what a message asks for ---------------------------------------------------------------------------------

def level_shift(value: float) -> int:
    """speechd's rate or pitch (-100..100) -> levels to move: 0 within +-20, 1 or 2 beyond (sign kept)."""
    value = max(-100.0, min(100.0, value))
    steps = min(2, int((abs(value) + LEVEL_STEP / 2) // LEVEL_STEP))
    return steps if value >= 0 else -steps


def pick_voice(name: str, rate: float, pitch: float, voices: Mapping[str, Voice]) -> str:
    """The preset that speaks `name` at speechd's `rate` and `pitch`: the model takes speed and pitch as levels a
    voice is made with, not as per-request controls, so a rate or pitch away from 0 picks the voice of the same
    gender whose levels are nearest the shifted ones (the voice itself on a tie). Cloned voices stay as they are."""
    voice = voices[name]
    dp, ds = level_shift(pitch), level_shift(rate)
    if voice.global_tokens is not None or (dp == 0 and ds == 0):
        return name
    want_pitch, want_speed = LEVELS[voice.pitch] + dp, LEVELS[voice.speed] + ds

    def distance(v: Voice) -> tuple[int, bool, str]:
        miss = abs(LEVELS[v.pitch] - want_pitch) + abs(LEVELS[v.speed] - want_speed)
        return miss, v.name != name, v.name

    same = [v for v in voices.values() if v.gender == voice.gender and v.global_tokens is None]
    return min(same, key=distance).name


def speechd_number(text: str) -> float:
    """speechd's rate or pitch as it sends them (`-30`, `12.50`); 0 for anything else."""
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0
