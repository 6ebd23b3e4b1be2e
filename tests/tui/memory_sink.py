"""Provides MemorySink: an in-memory AudioSink with a simulated real-time consumer, for TUI tests and screenshots.

A consumer thread reads the ring buffer in blocks at `speed` x real time, like a PortAudio callback would, so the
fill level, underruns and audible onset behave like the speaker Player's.
"""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from engine.ringbuffer import RingBuffer


class MemorySink:
    """MonitoredSink (engine.backends.base), playing into `played`."""

    def __init__(self, sample_rate: int = 16000, buffer_s: float = 3.0, speed: float = 1.0, block_s: float = 0.01,
                 preroll_s: float = 0.05) -> None:
        self.sample_rate = self.device_rate = sample_rate
        self.speed, self.block = speed, int(block_s * sample_rate)
        self._period_s = block_s / speed
        self._preroll = int(preroll_s * sample_rate)
        self._ring = RingBuffer(int(buffer_s * sample_rate))
        self.played: list[np.ndarray] = []
        """Every block the consumer took from the ring (non-empty), in order."""
        self.written = 0
        self.clears = 0
        self.drains = 0
        self.marks = 0
        self._utt = (0, 0)
        self._onset = (-1, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._consume, name="memory-sink", daemon=True)
        self._thread.start()

    # -- AudioSink --------------------------------------------------------------------------------------

    async def write(self, samples: np.ndarray) -> None:
        x = np.asarray(samples, np.float32).reshape(-1)
        done = self._ring.write(x)
        gen = self.clears
        while done < len(x):
            await asyncio.sleep(self._period_s)
            if gen != self.clears:
                return
            done += self._ring.write(x[done:])
        self.written += len(x)

    async def drain(self) -> None:
        self.drains += 1
        self._ring.mark_end()
        while self._ring.available > 0:
            await asyncio.sleep(self._period_s)

    def clear(self) -> None:
        self.clears += 1
        self._ring.clear()

    def allow_pause(self) -> None:
        self._ring.mark_end()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    # -- MonitoredSink: what the bridge reads from a Player ---------------------------------------------

    def mark_utterance_start(self) -> None:
        self.marks += 1
        self._utt = (self.marks, self._ring.write_count)

    @property
    def last_onset_perf(self) -> float | None:
        seq, t = self._onset
        return t if seq == self._utt[0] else None

    @property
    def fill_frames(self) -> int:
        return self._ring.available

    @property
    def capacity_frames(self) -> int:
        return self._ring.capacity_frames

    @property
    def underruns(self) -> int:
        return self._ring.underruns

    @property
    def played_samples(self) -> np.ndarray:
        return np.concatenate(self.played) if self.played else np.zeros(0, np.float32)

    # -- the simulated device ---------------------------------------------------------------------------

    def _consume(self) -> None:
        out = np.zeros(self.block, np.float32)
        ring = self._ring
        next_t = time.perf_counter()
        while not self._stop.is_set():
            ring.apply_clear()
            seq, begin = self._utt
            r0 = ring.read_count
            if ring.playing or ring.end_pending or ring.available >= self._preroll:
                n = ring.read_into(out)
                if n:
                    self.played.append(out[:n].copy())
                    if seq != self._onset[0] and r0 + n > begin:
                        self._onset = (seq, time.perf_counter())
            next_t += self._period_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))
