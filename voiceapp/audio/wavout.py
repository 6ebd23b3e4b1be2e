"""Provides atomic WAV writing of an audio chunk stream: a temp file beside the target, renamed when complete
(engine.atomic)."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Callable

from engine.atomic import replacing
from engine.errors import OutputError

if TYPE_CHECKING:  # numpy comes with it: a `say` through a warm server checks its --out without it
    from engine.types import AudioChunk


def check_output(path: Path, any_suffix: bool = False) -> None:
    """Fail before any work if the output cannot be written (a .wav, unless `any_suffix`: the caller checked it)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not any_suffix and path.suffix.lower() != ".wav":
        raise OutputError(f"{path}: output must be a .wav file")
    if not parent.is_dir():
        raise OutputError(f"{path}: directory {parent} does not exist")
    if path.is_dir():
        raise OutputError(f"{path} is a directory")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{path}: directory {parent} is not writable")
    if path.exists() and read_only(path):
        raise OutputError(f"{path} exists and is read-only; remove it or choose another file")


def read_only(path: Path) -> bool:
    """No write permission for us, or none for anyone (root may write anything, yet a 0444 file says "keep")."""
    return not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222


def create_partial(out: Path) -> Path:
    """A new, empty temp file beside `out`, created with the umask's permissions (mkstemp's 0600 would stick to
    the finished WAV, unlike export's and the TUI's files); its name is hidden, unique and carries the writer's
    pid, so that partial files of writers killed before they could clean up are removed here."""
    parent = out.parent if str(out.parent) else Path(".")
    remove_orphaned_partials(parent, out.name)
    while True:
        tmp = parent / f".{out.name}.{os.getpid()}-{os.urandom(4).hex()}.partial"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
            return tmp
        except FileExistsError:
            continue


def remove_orphaned_partials(parent: Path, name: str) -> None:
    """Delete `parent`'s partial files for `name` whose writer process is gone (SIGKILLed mid-write)."""
    prefix = f".{name}."
    for entry in parent.glob(f".{glob_escape(name)}.*-*.partial"):
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                entry.unlink()


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: alive
    return True


async def write_wav(chunks: AsyncIterator[AudioChunk], out: Path, sample_rate: int,
                    on_chunk: Callable[[AudioChunk], None] | None = None, subtype: str = "PCM_16") -> int:
    """Write every chunk to `out` (WAV, 16-bit PCM by default; "FLOAT" keeps the exact float32 samples the
    speakers would get); returns samples written. An interrupted or failed write leaves no file at `out`
    (and no temp file): a WAV that exists is always complete."""
    import soundfile as sf

    samples = 0
    try:
        with replacing(out, tmp=create_partial(out)) as tmp:
            with sf.SoundFile(str(tmp), "w", samplerate=sample_rate, channels=1, subtype=subtype,
                              format="WAV") as f:
                async for chunk in chunks:
                    f.write(chunk.samples)
                    samples += len(chunk.samples)
                    if on_chunk is not None:
                        on_chunk(chunk)
            if subtype == "FLOAT":
                zero_peak_timestamp(tmp)
    except (OSError, sf.SoundFileError) as err:
        if disk_full(err, out):
            raise OutputError(f"disk full while writing {out}; nothing was written") from None
        raise OutputError(f"cannot write {out}: {getattr(err, 'strerror', None) or err}") from None
    return samples


FULL_BELOW_BYTES = 1 << 20
"""Free space under which a failed write is taken for a full disk (libsndfile reports ENOSPC as "System error.")."""


def disk_full(err: BaseException, out: Path) -> bool:
    """Whether a failed write of `out` ran out of space: ENOSPC, a message saying so, or (libsndfile's opaque
    "System error.") next to no space left where `out` goes."""
    if getattr(err, "errno", None) == errno.ENOSPC or "space" in str(err).lower():
        return True
    try:
        return shutil.disk_usage(out.parent if str(out.parent) else ".").free < FULL_BELOW_BYTES
    except OSError:
        return False


def zero_peak_timestamp(path: Path) -> None:
    """libsndfile stamps float WAVs' PEAK chunk with the wall-clock time; zero it so the same audio always
    gives the same bytes. PEAK layout: id, size, version (u32), timestamp (u32), then per-channel peaks."""
    with open(path, "r+b") as f:
        head = f.read(4096)
        at = head.find(b"PEAK")
        if at >= 12:
            f.seek(at + 12)
            f.write(b"\0\0\0\0")
