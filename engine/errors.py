"""Provides the one error hierarchy: every user-facing failure is a VoiceError with a one-line message.

The engine raises these; only the edges (CLI, TUI) render them.
"""
from __future__ import annotations


class VoiceError(Exception):
    """A failure the user can act on. `str(err)` is one line that says what went wrong and what to do."""

    exit_code: int = 1
    title: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message.strip().splitlines()[0] if message.strip() else self.title)


class ModelNotFound(VoiceError):
    """No checkpoint where we looked; the message says how to get one."""

    title = "model not found"


class ModelFormatError(VoiceError):
    """A checkpoint file is missing, malformed or has the wrong shape; the message names the file."""

    title = "bad model"


class InputError(VoiceError):
    """The text, file or option given by the user cannot be used."""

    exit_code = 2
    title = "bad input"


class VoiceNotFound(InputError):
    """No voice preset by that name."""

    title = "unknown voice"


class AudioDeviceError(VoiceError):
    """No usable audio output device, or it vanished mid-play."""

    title = "audio device"


class OutputError(VoiceError):
    """An output file could not be written (missing or read-only directory, disk full)."""

    title = "output"


class GenerationError(VoiceError):
    """Token generation or decoding failed (out of memory, backend crash)."""

    title = "generation"


class EngineBusy(VoiceError):
    """Every engine that could take the request is carrying as many streams as it keeps in real time (an HTTP
    client gets 429 with Retry-After)."""

    title = "busy"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class MissingExtra(VoiceError):
    """A feature needs a package that only one of pyproject.toml's optional extras installs, and this install lacks
    it; the message names the pip command that adds it."""

    title = "missing package"


class Cancelled(VoiceError):
    """The request was stopped by the user."""

    exit_code = 130
    title = "cancelled"


def one_line(err: BaseException) -> str:
    """`Type: first line of the message` (just `Type` when the message is empty), for one-line notices."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
