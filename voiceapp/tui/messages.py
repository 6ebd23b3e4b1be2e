"""Provides the TUI's messages: what the bridge (and widgets) post upward; the app sets widget attributes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message
from textual.notifications import SeverityLevel

from engine.events import Event
from voiceapp.tui.history import Utterance


@dataclass
class ModelReady(Message):
    """The synthesizer and the audio sink are ready; queued text starts playing."""

    description: str
    synth: Any
    """The engine.pipeline.Synthesizer (for the bridge; the app only shows the description)."""
    sink: Any
    """The AudioSink chosen (player, WAV folder, memory, or a silent one)."""
    sink_notice: str | None = None
    """Set when no audio device could be opened: what the user can do instead."""


@dataclass
class ModelFailed(Message):
    """The model could not be loaded; nothing can be spoken."""

    error: str
    """One-line message (a VoiceError's text)."""


@dataclass
class EngineEvent(Message, bubble=False):
    """An engine event emitted off the UI thread, carried to the bridge."""

    event: Event


@dataclass
class UtteranceUpdated(Message):
    """An utterance was added, or its status or metrics changed."""

    utterance: Utterance


@dataclass
class UtterancesRemoved(Message):
    """History entries pruned to keep the history bounded."""

    numbers: list[int]


@dataclass
class PlayerState(Message):
    """One line saying what the player is doing ("idle", "speaking #3 · 2 queued", ...)."""

    text: str


@dataclass
class PlaybackStats(Message):
    """The sink's buffer health, polled about 10 times a second."""

    fill_frames: int
    capacity_frames: int
    frame_rate: int
    """Frames per second of the sink's buffer (to show the fill in seconds)."""
    underruns: int
    """Since the session started."""


@dataclass
class Problem(Message):
    """Something to show as a notification (an error, or a notice from the engine)."""

    message: str
    severity: SeverityLevel = "error"
    """"information", "warning" or "error"."""


@dataclass
class ReplayRequested(Message):
    """The user asked to play a history entry's audio again."""

    number: int
