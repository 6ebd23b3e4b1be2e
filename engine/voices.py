"""Provides voice presets (assets/voices/*.toml, user voices) and the caches of their computed speaker globals (on
disk per checkpoint, or in memory)."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.atomic import replacing
from engine.errors import InputError, VoiceNotFound
from engine.tokens import GENDERS, GLOBAL_CODEBOOK, GLOBAL_COUNT, LEVELS


BUILTIN_DIR = Path(__file__).resolve().parent.parent / "assets" / "voices"
"""Presets shipped with the project."""
DEFAULT_VOICE = "ava"


VOICE_SLOTS = ("MALE1", "MALE2", "MALE3", "FEMALE1", "FEMALE2", "FEMALE3", "CHILD_MALE", "CHILD_FEMALE")
"""Kinds of voice a client may ask for instead of a name (speech-dispatcher's voice types, whose names these are;
OpenAI's voice names map to them): `preset_slots` fills each with one of a family's presets."""


def resolve_name(name: str, default: str = DEFAULT_VOICE) -> str:
    """A requested voice name, with "" and "default" meaning `default` (a bank's own: VoiceBank.default)."""
    return default if name in ("", "default") else name


def available_voice(name: str, names: Iterable[str], default: str = DEFAULT_VOICE) -> str:
    """`name` (resolve_name) where `names` holds it, else the first of them by name; the resolved name where there
    are none (so that a lookup says which voice is missing)."""
    wanted, ordered = resolve_name(name, default), sorted(names)
    return wanted if wanted in ordered else (ordered[0] if ordered else wanted)


def preset_slots(presets: Mapping[str, Voice]) -> dict[str, str]:
    """VOICE_SLOTS -> a family's presets (never the user's own voices, so a slot keeps its voice whatever the user
    adds). MALE1-3 and FEMALE1-3 are that gender's presets, the one of moderate pitch first, then the lower before
    the higher, ties in the family's order, taken in turn where it has fewer than three; the children's are the
    highest, quickest of each gender. A gender the family lacks speaks with the other's; no presets, no slots."""
    def by_gender(gender: str) -> list[Voice]:
        same = [v for v in presets.values() if v.gender == gender] or list(presets.values())
        return sorted(same, key=lambda v: (abs(LEVELS[v.pitch] - LEVELS["moderate"]), LEVELS[v.pitch]))

    slots: dict[str, str] = {}
    for gender, prefix in (("male", "MALE"), ("female", "FEMALE")):
        ranked = by_gender(gender)
        for i in range(3 if ranked else 0):
            slots[f"{prefix}{i + 1}"] = ranked[i % len(ranked)].name
        if ranked:
            slots[f"CHILD_{prefix}"] = max(ranked, key=lambda v: (LEVELS[v.pitch], LEVELS[v.speed])).name
    return slots


def user_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "voiceapp"


def user_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "voiceapp"


@dataclass(frozen=True, slots=True)
class Voice:
    """A voice: either attributes (+ seed) from which globals are computed once per checkpoint, or stored globals."""

    name: str
    description: str = ""
    gender: str = "female"
    """'female' or 'male' (controllable prompt attribute)."""
    pitch: str = "moderate"
    """very_low | low | moderate | high | very_high."""
    speed: str = "moderate"
    """very_low | low | moderate | high | very_high (speaking rate)."""
    seed: int = 0
    """Sampling seed used when computing the globals: the same seed gives the same voice."""
    global_tokens: tuple[int, ...] | None = None
    """Stored globals (cloned voices); None for attribute presets."""
    model_hash: str | None = None
    """Checkpoint the stored globals were extracted with (cloned voices)."""
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.gender not in GENDERS:
            raise InputError(f"voice {self.name!r}: gender must be one of {sorted(GENDERS)}, got {self.gender!r}")
        for key in ("pitch", "speed"):
            if getattr(self, key) not in LEVELS:
                raise InputError(f"voice {self.name!r}: {key} must be one of {list(LEVELS)}")
        if self.global_tokens is not None:
            check_globals(self.global_tokens, f"voice {self.name!r}")

    @property
    def fingerprint(self) -> str:
        """What determines computed globals: changes to it invalidate the cache."""
        return f"{self.gender}/{self.pitch}/{self.speed}/{self.seed}"


def stored_globals(voice: Voice, model_hash: str | None) -> tuple[int, ...]:
    """A cloned voice's stored speaker tokens, for an engine running the checkpoint `model_hash` (None: no
    checkpoint, the fake engine). Tokens extracted by another checkpoint mean another voice there, and the
    recording they came from is not kept to extract them again: an InputError says so. A file without a hash
    (written by hand) is trusted."""
    assert voice.global_tokens is not None
    if model_hash and voice.model_hash and voice.model_hash != model_hash:
        raise InputError(f"voice {voice.name!r} was cloned with checkpoint {voice.model_hash}, not this one "
                         f"({model_hash}); clone it again: voicectl voice add {voice.name} --from REF.wav --force")
    return voice.global_tokens


def check_globals(codes, where: str) -> tuple[int, ...]:
    codes = tuple(int(c) for c in codes)
    if len(codes) != GLOBAL_COUNT or not all(0 <= c < GLOBAL_CODEBOOK for c in codes):
        raise InputError(f"{where}: expected {GLOBAL_COUNT} global codes in 0..{GLOBAL_CODEBOOK - 1}")
    return codes


def load_voice_file(path: Path) -> Voice:
    try:  # here, not above: a `say` through a warm server looks up the user cache folder but reads no voice
        # mypy checks the code as Python 3.10 runs it, whose standard library has no tomllib
        import tomllib  # type: ignore[import-not-found]  # Python 3.11+
    except ImportError:  # Python 3.10: the same parser, published as tomli (a dependency there)
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise InputError(f"cannot read voice file {path.name}: {err}") from None
    except RecursionError:
        raise InputError(f"cannot read voice file {path.name}: nested too deeply") from None
    try:
        globals_ = data.pop("global_tokens", None)
        known = {"name", "description", "gender", "pitch", "speed", "seed", "model_hash"}
        fields = {k: v for k, v in data.items() if k in known}
        fields.setdefault("name", path.stem)
        for key, value in fields.items():
            if not isinstance(value, int if key == "seed" else str) or isinstance(value, bool):
                raise InputError(f"{key} must be {'an integer' if key == 'seed' else 'a string'}")
        return Voice(**fields, global_tokens=tuple(globals_) if globals_ is not None else None, path=path)
    except (InputError, TypeError, ValueError) as err:
        raise InputError(f"cannot read voice file {path.name}: {err}") from None


def voice_file_text(voice: Voice) -> str:
    """`voice` as the TOML of a voice file, written by a TOML writer: any text survives in any field (a quote, a
    backslash or a newline in a description once made a file no command could read)."""
    import tomli_w

    data: dict[str, object] = {"name": voice.name, "description": voice.description, "gender": voice.gender,
                               "global_tokens": list(voice.global_tokens or ())}
    if voice.model_hash:
        data["model_hash"] = voice.model_hash
    return tomli_w.dumps(data)


def _skip_notice(path: Path, err: InputError) -> None:
    """The one line that says a voice file was left out, and why."""
    print(f"voicectl: skipped {path}: {str(err).removeprefix(f'cannot read voice file {path.name}: ')}",
          file=sys.stderr)


class VoiceBank:
    """All voices: builtin presets, then user voices (which may shadow presets). A file that cannot be read is
    left out, said once in one line on stderr (until it changes), so one bad file does not take the others down;
    asking for its voice by name gives its error."""

    def __init__(self, dirs: list[Path] | None = None, default: str = DEFAULT_VOICE,
                 on_skip: Callable[[Path, InputError], None] = _skip_notice) -> None:
        self.dirs = dirs if dirs is not None else [BUILTIN_DIR, user_data_dir() / "voices"]
        self.default = default
        """The voice "" and "default" mean."""
        self.on_skip = on_skip
        """Told of each voice file left out, once per version of the file."""
        self._parsed: dict[Path, tuple[tuple[int, int], Voice | InputError]] = {}
        """Voice files read so far, by path, with the (mtime, size) they had, and the voice or why it could not
        be read: each request looks its voice up, and parsing every file each time would cost every request."""

    def all(self) -> dict[str, Voice]:
        """Every readable voice now on disk: files added, changed or removed since the last call count at once."""
        voices: dict[str, Voice] = {}
        for d in self.dirs:
            for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
                voice = self._load(path)
                if isinstance(voice, Voice):
                    voices[voice.name] = voice
        return voices

    def presets(self) -> dict[str, Voice]:
        """The voices shipped with the family (the first folder's), not the user's: what stays put whatever the user
        adds, e.g. for speech-dispatcher's voice types."""
        if len(self.dirs) < 2:
            return self.all()
        voices = (self._load(path) for path in sorted(self.dirs[0].glob("*.toml")))
        return {v.name: v for v in voices if isinstance(v, Voice)}

    def builtin(self, name: str) -> Voice | None:
        """The preset shipped as `name` (the first folder's), whether or not a user voice shadows it."""
        path = self.dirs[0] / f"{name}.toml"
        voice = self._load(path) if len(self.dirs) > 1 and path.is_file() else None
        return voice if isinstance(voice, Voice) else None

    def _load(self, path: Path, notify: bool = True) -> Voice | InputError:
        try:
            st = path.stat()
        except OSError as err:  # gone since the listing
            return InputError(f"cannot read voice file {path.name}: {err.strerror or err}")
        stamp = (st.st_mtime_ns, st.st_size)
        known = self._parsed.get(path)
        if known is None or known[0] != stamp:
            try:
                known = (stamp, load_voice_file(path))
            except InputError as err:
                known = (stamp, err)
                if notify:
                    self.on_skip(path, err)
            self._parsed[path] = known
        return known[1]

    def get(self, name: str) -> Voice:
        name = resolve_name(name, self.default)
        for d in reversed(self.dirs):  # the file of that name first: if it cannot be read, its error, in one line
            path = d / f"{name}.toml"
            if path.is_file():
                found = self._load(path, notify=False)
                if isinstance(found, InputError):
                    raise InputError(str(found))
                break
        voices = self.all()
        if name not in voices:
            raise VoiceNotFound(f"unknown voice {name!r}; available: {', '.join(sorted(voices)) or 'none'}")
        return voices[name]

    def save_user_voice(self, voice: Voice) -> Path:
        """Write a cloned voice (with stored globals) to the user voice directory."""
        d = self.dirs[-1]
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{voice.name}.toml"
        with replacing(path) as tmp:
            tmp.write_text(voice_file_text(voice), encoding="utf-8")
        return path



class PresetBank(VoiceBank):
    """A fixed set of voices (a family whose voices are names the model knows, not files); the first is the
    default."""

    def __init__(self, voices: dict[str, Voice]) -> None:
        super().__init__(dirs=[], default=next(iter(voices)))
        self._voices = dict(voices)

    def all(self) -> dict[str, Voice]:
        return dict(self._voices)


class GlobalsCache:
    """Computed speaker globals on disk, keyed by checkpoint hash and voice fingerprint."""

    def __init__(self, model_hash: str, root: Path | None = None) -> None:
        self.dir = (root or user_cache_dir() / "globals") / model_hash

    def _path(self, voice: Voice) -> Path:
        return self.dir / f"{voice.name}.json"

    def get(self, voice: Voice) -> tuple[int, ...] | None:
        try:
            data = json.loads(self._path(voice).read_text())
            if data.get("fingerprint") != voice.fingerprint:
                return None
            return check_globals(data["global_tokens"], "cache")
        except (OSError, ValueError, KeyError, TypeError, InputError, RecursionError):
            return None

    def put(self, voice: Voice, codes: tuple[int, ...]) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with replacing(self._path(voice)) as tmp:
                tmp.write_text(json.dumps({"fingerprint": voice.fingerprint, "global_tokens": list(codes)}))
        except OSError:
            pass  # a read-only cache only costs a recompute next time

    def has(self, voice: Voice) -> bool:
        return self.get(voice) is not None


class MemoryGlobalsCache:
    """Computed speaker globals kept in memory for the engine's life, by voice name and fingerprint (GlobalsCache's
    get/put), for an engine without a checkpoint to key an on-disk cache by (the fake engine). Without a cache every
    request would recompute its voice's globals under the synthesizer's globals lock, one request at a time."""

    def __init__(self) -> None:
        self._codes: dict[tuple[str, str], tuple[int, ...]] = {}

    def get(self, voice: Voice) -> tuple[int, ...] | None:
        return self._codes.get((voice.name, voice.fingerprint))

    def put(self, voice: Voice, codes: tuple[int, ...]) -> None:
        self._codes[(voice.name, voice.fingerprint)] = tuple(codes)
