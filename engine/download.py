"""Provides `download_model`: fetch a Spark-TTS checkpoint from the Hugging Face Hub with `huggingface_hub`.

Shows huggingface_hub's own progress bars; every failure becomes one ModelNotFound line that says what to do
instead (offline machines: copy a checkpoint and pass --model, or synthesize a test model).
"""
from __future__ import annotations

import os
from pathlib import Path

from engine.errors import ModelNotFound, OutputError
from engine.model import DEFAULT_REPO, ENV_VAR

IGNORE_PATTERNS = ["src/*", ".gitattributes"]
"""Repo files the engine never reads (model-card images, git metadata)."""

ALTERNATIVE = (f"copy a Spark-TTS checkpoint onto this machine and pass --model DIR (or set {ENV_VAR}=DIR), "
               "or run `voicectl model synth --size tiny DIR` for a random test model")


def download_model(repo_id: str = DEFAULT_REPO, dest: str | os.PathLike[str] | None = None) -> Path:
    """Download `repo_id` into the Hugging Face cache (found later without --model), or into `dest`.

    Returns the local checkpoint directory. Already-downloaded files are reused. Raises ModelNotFound (network,
    offline mode, unknown or gated repo) or OutputError (cannot write `dest` / the cache), each one line.
    """
    from huggingface_hub import errors, snapshot_download

    local_dir = None if dest is None else Path(dest).expanduser()
    try:
        path = snapshot_download(repo_id, local_dir=local_dir, ignore_patterns=IGNORE_PATTERNS)
    except Exception as err:  # noqa: BLE001 - classified below; anything unknown is re-raised as is
        mapped = _classify(err, repo_id, errors)
        if mapped is err:
            raise
        raise mapped from err
    return Path(path)


def _classify(err: Exception, repo_id: str, errors) -> Exception:
    """The one-line VoiceError for a huggingface_hub failure (or `err` itself when it is not one we know)."""
    def kind(name: str) -> tuple[type, ...]:
        cls = getattr(errors, name, None)
        return (cls,) if isinstance(cls, type) else ()

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if isinstance(err, kind("OfflineModeIsEnabled")) or (offline and isinstance(err, kind("LocalEntryNotFoundError"))):
        return ModelNotFound(f"cannot download {repo_id}: offline mode is on (HF_HUB_OFFLINE) and it is not in the "
                             f"Hugging Face cache; unset HF_HUB_OFFLINE, or {ALTERNATIVE}")
    if isinstance(err, kind("GatedRepoError")):
        return ModelNotFound(f"cannot download {repo_id}: the repo is gated; accept its licence on the Hub and log in "
                             f"(`hf auth login`), or {ALTERNATIVE}")
    if isinstance(err, kind("RepositoryNotFoundError") + kind("RevisionNotFoundError")):
        return ModelNotFound(f"cannot download {repo_id}: no such repo on the Hugging Face Hub (or no access); "
                             f"check --repo, or {ALTERNATIVE}")
    if isinstance(err, kind("HfHubHTTPError")):
        return ModelNotFound(f"cannot download {repo_id}: the Hugging Face Hub answered: {_first_line(err)}; "
                             f"try again later, or {ALTERNATIVE}")
    if isinstance(err, kind("LocalEntryNotFoundError") + kind("HTTPError") + (ConnectionError, TimeoutError)):
        return ModelNotFound(f"cannot download {repo_id}: the Hugging Face Hub is unreachable (no network?) and the "
                             f"model is not in the local cache; {ALTERNATIVE}")
    if isinstance(err, OSError):
        return OutputError(f"cannot save {repo_id}: {err.strerror or _first_line(err)}"
                           + (f" ({err.filename})" if err.filename else ""))
    return err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
