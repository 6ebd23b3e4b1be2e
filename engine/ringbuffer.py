"""Provides RingBuffer: a preallocated float32 single-producer/single-consumer audio FIFO (pure numpy).

One thread (the producer, e.g. the asyncio loop) calls `write`, `clear` and `mark_end`; one other thread
(the consumer, e.g. the PortAudio callback) calls `read_into` and `apply_clear`. No locks are taken.

Why this is safe without locks (CPython, with the GIL):
- The state shared between the sides is four Python ints: `_write_count` (written only by the producer),
  `_read_count` (only by the consumer), `_clear_to` and `_end_at` (only by the producer). Each is a
  monotonically increasing frame count since construction, so "how much is buffered" is always
  `_write_count - _read_count` and never needs a shared "full/empty" flag.
- Rebinding an attribute to a new int object is a single bytecode store: the other side sees either the
  old or the new value, never a torn one.
- Each side publishes a counter only AFTER its numpy copy has finished (the copy is a C call that
  completes before the next bytecode runs). Every GIL hand-over is a full memory barrier, so when the
  other side sees the new counter it also sees the samples (or the freed space) behind it. Each side reads
  the other side's counter once per call into a local, so it works on one consistent snapshot.
- The producer only ever writes into `[_write_count, _read_count + capacity)`, space the consumer has
  finished with; the consumer only reads `[_read_count, _write_count)`, data the producer has finished.
  `clear()` therefore does not touch `_read_count`: it records a request (`_clear_to`) that the consumer
  applies on its next `read_into`/`apply_clear`, so the producer never overwrites memory the consumer
  may be copying at that instant. If no consumer is running, the owner calls `apply_clear()` itself.
"""
from __future__ import annotations

import numpy as np


class RingBuffer:
    """Fixed-capacity float32 mono FIFO with monotonic counters; SPSC-safe without locks (see module doc)."""

    def __init__(self, capacity_frames: int) -> None:
        if capacity_frames < 1:
            raise ValueError(f"capacity_frames must be >= 1, got {capacity_frames}")
        self.capacity_frames = int(capacity_frames)
        self._buf = np.zeros(self.capacity_frames, dtype=np.float32)  # [capacity]
        self._write_count = 0
        """Frames ever written (producer-owned)."""
        self._read_count = 0
        """Frames ever consumed, played or dropped by clear (consumer-owned)."""
        self._clear_to = 0
        """Producer's request: drop everything before this write count (applied by the consumer)."""
        self._end_at = -1
        """Write count at the producer's last end-of-stream mark; silence when reaching it is no underrun."""
        self._playing = False
        """Consumer-owned: data has flowed since the start, the last end-of-stream or the last clear."""
        self.underruns = 0
        """Consumer reads that came up short while playing (the intended silence is not counted)."""
        self.underrun_frames = 0
        """Frames zero-filled by those short reads."""

    # -- counters -------------------------------------------------------------------------------------

    @property
    def write_count(self) -> int:
        return self._write_count

    @property
    def read_count(self) -> int:
        return self._read_count

    @property
    def available(self) -> int:
        """Frames buffered and not yet consumed (a pending clear counts as applied)."""
        return self._write_count - max(self._read_count, self._clear_to)

    @property
    def free(self) -> int:
        """Frames the producer may write now (space freed by a pending clear becomes free once applied)."""
        return self.capacity_frames - (self._write_count - self._read_count)

    @property
    def playing(self) -> bool:
        """True once data has been read since the start / last end-of-stream / last clear."""
        return self._playing

    @property
    def end_pending(self) -> bool:
        """True when the producer marked end-of-stream and that end has not been reached yet."""
        return self._end_at > max(self._read_count, self._clear_to)

    # -- producer side --------------------------------------------------------------------------------

    def write(self, samples: np.ndarray) -> int:
        """Copy as many of `samples` (float32-convertible, 1-D) as fit; returns the frames accepted."""
        w = self._write_count
        n = min(len(samples), self.capacity_frames - (w - self._read_count))
        if n <= 0:
            return 0
        start = w % self.capacity_frames
        first = min(n, self.capacity_frames - start)
        np.copyto(self._buf[start:start + first], samples[:first], casting="same_kind")
        if n > first:
            np.copyto(self._buf[:n - first], samples[first:n], casting="same_kind")
        self._write_count = w + n  # publish after the copy (see module doc)
        return n

    def mark_end(self) -> None:
        """End of stream at the current write position: running dry there is silence, not an underrun."""
        self._end_at = self._write_count

    def clear(self) -> None:
        """Drop everything written so far. Safe from the producer while the consumer runs: the consumer
        applies it on its next read; `available` reflects it at once, `free` once applied."""
        self._clear_to = self._write_count

    # -- consumer side --------------------------------------------------------------------------------

    def apply_clear(self) -> None:
        """Consumer side (or the owner when no consumer runs): carry out a pending `clear()`."""
        c = self._clear_to
        if c > self._read_count:
            self._read_count = c
            self._playing = False

    def read_into(self, out: np.ndarray) -> int:
        """Copy up to len(out) frames into `out`, zero-fill the rest; returns frames copied. Allocates no
        buffers (only views), never blocks. Counts an underrun when short while playing, unless the
        reader has reached the producer's end-of-stream mark."""
        self.apply_clear()
        r = self._read_count
        w = self._write_count  # one snapshot of the producer's counter
        want = len(out)
        n = min(want, w - r)
        if n > 0:
            start = r % self.capacity_frames
            first = min(n, self.capacity_frames - start)
            np.copyto(out[:first], self._buf[start:start + first])
            if n > first:
                np.copyto(out[first:n], self._buf[:n - first])
            self._read_count = r + n  # publish after the copy
            self._playing = True
        if n < want:
            out[n:] = 0.0
            if self._playing:
                if r + n == self._end_at:
                    self._playing = False  # intended silence after end-of-stream
                else:
                    self.underruns += 1
                    self.underrun_frames += want - n
        return n

    def count_underrun(self, frames: int) -> None:
        """Consumer side: record a read the consumer chose to zero-fill mid-stream (e.g. while re-buffering)."""
        self.underruns += 1
        self.underrun_frames += frames

