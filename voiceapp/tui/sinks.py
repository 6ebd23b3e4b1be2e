"""Provides the TUI's audio sinks besides the speaker Player: one WAV file per utterance, a silent fallback, a
recorder that tees what is played, and `open_sink`, which picks one. The first two are MonitoredSinks with nothing
to report (no device clock)."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from engine.atomic import replacing
from engine.backends.base import AudioSink, MonitoredSink
from engine.errors import AudioDeviceError, OutputError


class Unmonitored:
    """MonitoredSink's reports for a sink without a device clock: nothing buffered, no underruns, no onset."""

    sample_rate: int
    last_onset_perf: float | None = None
    fill_frames: int = 0
    capacity_frames: int = 0
    underruns: int = 0

    @property
    def device_rate(self) -> int:
        return self.sample_rate

    def mark_utterance_start(self) -> None:
        """Nothing to mark: no onset is ever known."""

    def allow_pause(self) -> None:
        """Nothing plays in real time here: a pause means nothing."""


class WavDirSink(Unmonitored):
    """AudioSink that writes each utterance (the writes between two `drain()`s) to `<dir>/utterance-NNNN.wav`."""

    def __init__(self, out_dir: Path, sample_rate: int) -> None:
        self.out_dir, self.sample_rate = Path(out_dir), int(sample_rate)
        self.written: list[Path] = []
        self._parts: list[np.ndarray] = []
        self._number = 0

    async def write(self, samples: np.ndarray) -> None:
        self._parts.append(np.asarray(samples, np.float32).reshape(-1))

    async def drain(self) -> None:
        if not self._parts:
            return
        audio, self._parts = np.concatenate(self._parts), []
        path = self._next_path()
        await asyncio.to_thread(_write_wav_atomic, path, audio, self.sample_rate)
        self.written.append(path)

    def clear(self) -> None:
        self._parts = []

    def close(self) -> None:
        self._parts = []

    def _next_path(self) -> Path:
        while True:
            self._number += 1
            path = self.out_dir / f"utterance-{self._number:04d}.wav"
            if not path.exists():
                return path


def _write_wav_atomic(path: Path, audio: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM WAV via a temp file renamed into place: a WAV that exists is complete. (Not mkstemp: its
    0600 mode would stick to the result; this file gets the user's usual permissions.)"""
    import soundfile as sf

    try:
        with replacing(path, ".partial") as tmp:
            sf.write(str(tmp), audio, sample_rate, subtype="PCM_16", format="WAV")
    except (OSError, sf.SoundFileError) as err:
        raise OutputError(f"cannot write {path}: {getattr(err, 'strerror', None) or err}") from None


class SilentSink(Unmonitored):
    """AudioSink that drops everything, at once: the app stays usable (metrics, history) without a device."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = int(sample_rate)

    async def write(self, samples: np.ndarray) -> None:
        await asyncio.sleep(0)

    async def drain(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def close(self) -> None:
        pass


class Recorder:
    """Wraps a sink for one utterance: forwards everything, keeps a copy of what was written (up to
    `max_samples`) and measures how long writes waited on the sink's backpressure."""

    def __init__(self, sink: AudioSink, max_samples: int) -> None:
        self.sink, self.sample_rate, self.max_samples = sink, sink.sample_rate, max_samples
        self.parts: list[np.ndarray] = []
        self.samples = 0
        self.overflow = False
        """More was written than `max_samples`: the copy is incomplete."""
        self.blocked_s = 0.0

    async def write(self, samples: np.ndarray) -> None:
        if self.samples + len(samples) <= self.max_samples:
            self.parts.append(samples)
        elif not self.overflow:
            self.overflow, self.parts = True, []  # it cannot be kept whole: free the copy now
        self.samples += len(samples)
        t = time.perf_counter()
        await self.sink.write(samples)
        self.blocked_s += time.perf_counter() - t

    async def drain(self) -> None:
        await self.sink.drain()

    def clear(self) -> None:
        self.sink.clear()

    def allow_pause(self) -> None:
        self.sink.allow_pause()

    def close(self) -> None:
        """The wrapped sink lives for the session: closing one utterance's recorder leaves it open."""

    def audio(self) -> np.ndarray | None:
        """Everything written, or None when it did not fit."""
        if self.overflow:
            return None
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)


def open_sink(sample_rate: int, out_dir: Path | None, device: int | str | None,
              latency: float) -> tuple[MonitoredSink, str | None]:
    """The WAV-folder sink when `out_dir` is set, else the speaker Player; without a usable device, a silent
    sink and a notice saying how to get files instead. Blocking (PortAudio start-up): call it from a thread."""
    if out_dir is not None:
        return WavDirSink(out_dir, sample_rate), None
    try:
        from engine.backends.sounddevice_sink import Player

        return Player(sample_rate=sample_rate, device=device, latency=latency), None
    except AudioDeviceError as err:
        reason = str(err).split("; use --out")[0]
        return SilentSink(sample_rate), (f"no audio output: {reason}. Nothing will be heard; start with "
                                         f"--out-dir DIR to write each utterance as a WAV file instead")
