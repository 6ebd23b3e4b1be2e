"""Provides LeanPlayer: the speaker for a `say` through a warm server, on PortAudio's raw (bytes) streams and the
standard library alone, so that a client queues its first audio without importing numpy or asyncio.

It keeps the engine Player's rules (engine.backends.sounddevice_sink): a pre-roll before an utterance plays, a
re-buffer after an underrun, silence (not an underrun) at a marked end, 2x latency of silence after the last
sample before the stream stops. Samples are float32 mono at the server's rate, exactly the bytes the server sends;
a device that refuses that stream is refused (`RateRefused`), and the caller plays through the full Player, which
resamples. The stream opens as the player is made (while the server works) and starts once the pre-roll is queued,
priming the device's buffer from it, so that the first sample is the first the device plays.

Threads as in the engine's Player: the caller is the ring's only producer, the PortAudio callback its only consumer,
and the callback only copies (no allocation, no lock, no I/O). ByteRing's counters follow engine.ringbuffer's
RingBuffer: monotonic frame counts, each published by its one writer after its copy. As there, the stream's abort
and close run on a daemon thread with a bounded wait (engine.backends.portaudio_calls), so that a dead or frozen
audio server cannot hold Ctrl-C.
"""
from __future__ import annotations

import time
from typing import Any

from engine.backends.portaudio_calls import (FROZEN, WAIT_S, NoAnswer, answer, bounded, guard_exit,
                                             load_sounddevice)
from engine.player_gate import device_pull_s, may_play, rebuffers_after, watch_progress

FRAME_BYTES = 4
"""One float32 mono frame."""
MAX_CALLBACK_FRAMES = 1 << 16
"""Zeros kept ready for a callback's silence: more than any buffer PortAudio asks for at a latency of seconds."""


FILE_HINT = "use --out FILE.wav to write a file instead"


def device_error(what: str, err: BaseException | None = None):
    """The engine Player's AudioDeviceError wording (engine.backends.sounddevice_sink, which imports numpy)."""
    from engine.errors import AudioDeviceError

    detail = f": {str(err).strip().splitlines()[0]}" if err is not None and str(err).strip() else ""
    return AudioDeviceError(f"{what}{detail}; {FILE_HINT}")


def import_sounddevice() -> Any:
    """sounddevice (its import starts PortAudio; it imports numpy only for its array streams), waited for at most
    portaudio_calls.LOAD_WAIT_S from the start of its import (`voicectl say` starts it first thing)."""
    try:
        sd = load_sounddevice()
    except NoAnswer:
        raise device_error(FROZEN) from None
    except OSError as err:
        raise device_error("PortAudio is not available (install libportaudio2)", err) from err
    except ImportError as err:
        raise device_error("the sounddevice package is not installed", err) from err
    guard_exit(sd)  # its Pa_Terminate at exit bounded too, and quiet under a Ctrl-C
    return sd


class RateRefused(Exception):
    """The device does not take the server's sample rate as it is (the full Player resamples)."""


class ByteRing:
    """Fixed-capacity FIFO of float32 frames held as bytes; single producer, single consumer, no locks."""

    def __init__(self, capacity_frames: int) -> None:
        self.capacity_frames = int(capacity_frames)
        self._buf = bytearray(self.capacity_frames * FRAME_BYTES)
        self._view = memoryview(self._buf)
        self.write_count = 0
        """Frames ever written (producer-owned)."""
        self.read_count = 0
        """Frames ever played (consumer-owned)."""
        self.end_at = -1
        """Write count at the producer's last end mark: running dry there is silence, not an underrun."""
        self.playing = False
        """Consumer-owned: audio has flowed since the start or the last end mark was reached."""
        self.underruns = 0
        """Consumer reads that came up short while playing."""

    @property
    def available(self) -> int:
        return self.write_count - self.read_count

    @property
    def free(self) -> int:
        return self.capacity_frames - (self.write_count - self.read_count)

    @property
    def end_pending(self) -> bool:
        return self.end_at > self.read_count

    def write(self, data: memoryview) -> int:
        """Copy as many whole frames of `data` as fit; returns the frames accepted."""
        w = self.write_count
        n = min(len(data) // FRAME_BYTES, self.capacity_frames - (w - self.read_count))
        if n <= 0:
            return 0
        start = (w % self.capacity_frames) * FRAME_BYTES
        size = n * FRAME_BYTES
        first = min(size, len(self._buf) - start)
        self._view[start:start + first] = data[:first]
        if size > first:
            self._view[:size - first] = data[first:size]
        self.write_count = w + n  # published after the copy
        return n

    def mark_end(self) -> None:
        self.end_at = self.write_count

    def read_into(self, out: memoryview, frames: int) -> int:
        """Consumer: copy up to `frames` frames into `out`; returns the frames copied (the caller zero-fills)."""
        r, w = self.read_count, self.write_count
        n = min(frames, w - r)
        if n > 0:
            start = (r % self.capacity_frames) * FRAME_BYTES
            size = n * FRAME_BYTES
            first = min(size, len(self._buf) - start)
            out[:first] = self._view[start:start + first]
            if size > first:
                out[first:size] = self._view[:size - first]
            self.read_count = r + n
            self.playing = True
        if n < frames and self.playing:
            if r + n == self.end_at:
                self.playing = False
            else:
                self.underruns += 1
        return n


class LeanPlayer:
    """Plays float32 mono bytes at `sample_rate` through a PortAudio raw output stream, opened at once and started
    once the pre-roll is queued (see `_start_if_due`)."""

    def __init__(self, sample_rate: int, *, device: int | str | None = None, latency: float = 0.1,
                 preroll_s: float = 0.2, buffer_s: float = 30.0, poll_s: float = 0.01,
                 stall_timeout_s: float = 5.0) -> None:
        sd = import_sounddevice()
        self._sd, self.sample_rate = sd, int(sample_rate)
        preroll_s = max(preroll_s, device_pull_s(latency))
        self._ring = ByteRing(int(round(max(buffer_s, 2 * preroll_s) * self.sample_rate)))
        self._preroll = int(round(preroll_s * self.sample_rate))
        self._rebuffering = False
        self._zeros = bytes(MAX_CALLBACK_FRAMES * FRAME_BYTES)
        self._poll_s, self._stall_timeout_s = poll_s, stall_timeout_s
        self._callbacks = 0
        self.output_underflows = 0
        """Callbacks PortAudio flagged as an output underflow: the device ran dry, whatever our ring held."""
        self._closed = False
        self._running = False
        """The stream was started (once: a `say` plays one request, and pauses are silence from the ring)."""
        self._onset_from = 0
        """Write count where the current utterance began; the callback notes when it first plays past it."""
        self.first_write_perf: float | None = None
        """time.perf_counter() when the first audio was queued (handed to the ring the callback plays from)."""
        self.onset_perf: float | None = None
        """time.perf_counter() at which the utterance's first sample reached the speakers (as PortAudio predicts)."""
        try:  # it talks to the audio server: bounded (portaudio_calls.answer)
            self._stream = answer(lambda: self._open(sd, device, latency), sd, name="portaudio-open")
        except NoAnswer:
            raise device_error(FROZEN) from None

    def _open(self, sd: Any, device: int | str | None, latency: float) -> Any:
        """The open, stopped raw stream (on portaudio_calls.answer's thread). It primes the device's buffer from the
        callback as it starts, so the first sample queued is the first the device plays: a stream started at once
        would have its whole buffer (about the latency) of silence queued ahead of it. Any
        refusal is RateRefused: the full Player checks the device itself, resamples where the rate is the cause
        and words the error where it is not (one open instead of a check and an open: each asks the audio server)."""
        try:
            stream = sd.RawOutputStream(samplerate=self.sample_rate, channels=1, dtype="float32", device=device,
                                        latency=latency, callback=self._callback,
                                        prime_output_buffers_using_stream_callback=True)
        except (sd.PortAudioError, ValueError) as err:
            raise RateRefused(str(err)) from None
        self.latency_s = float(stream.latency)
        """Output latency PortAudio granted, seconds."""
        self._preroll = max(self._preroll, int(self.pull_s * self.sample_rate) + 1)
        return stream

    @property
    def pull_s(self) -> float:
        """Audio the device takes as it starts, at most (engine.player_gate.device_pull_s): the pre-roll is never
        less."""
        return device_pull_s(self.latency_s)

    def set_preroll(self, preroll_s: float) -> float:
        """Audio queued before playback starts (engine.pacing.Pacer.preroll_s sizes it), never below `pull_s`;
        before the first write. Returns the seconds set."""
        self._preroll = max(int(round(preroll_s * self.sample_rate)), int(self.pull_s * self.sample_rate) + 1)
        return self._preroll / self.sample_rate

    def _start_if_due(self) -> None:
        """Start the stream once the callback would play what is queued (the pre-roll, an end mark, a full ring), on
        portaudio_calls.answer's thread (it talks to the audio server), bounded as a restart is (WAIT_S)."""
        ring = self._ring
        if self._running or ring.available == 0 or not may_play(False, False, ring.available, self._preroll, 0,
                                                                 ring.end_pending or ring.free <= 0):
            return
        sd, stream = self._sd, self._stream
        try:
            answer(stream.start, sd, name="portaudio-start", wait_s=WAIT_S)
        except NoAnswer:
            self._closed = True  # left on its thread: not touched again, not even to close it (close would wait)
            raise device_error(FROZEN) from None
        except sd.PortAudioError as err:
            raise device_error("cannot start the audio output device", err) from err
        self._running = True

    def _callback(self, outdata: Any, frames: int, time_info: Any, status: Any) -> None:
        """PortAudio's thread: copy from the ring, zero-fill the rest, note the onset. Nothing else."""
        ring = self._ring
        out = memoryview(outdata)  # a view of PortAudio's buffer (cffi), not a copy
        r0 = ring.read_count
        playing = ring.playing
        n = 0
        if may_play(playing, self._rebuffering and playing, ring.available, self._preroll, self._preroll,
                    ring.end_pending or ring.free <= 0):
            n = ring.read_into(out, frames)
            self._rebuffering = rebuffers_after(n < frames, ring.playing, self._preroll)
        elif playing:
            ring.underruns += 1
        if n < frames:
            out[n * FRAME_BYTES:frames * FRAME_BYTES] = self._zeros[:(frames - n) * FRAME_BYTES]
        if self.onset_perf is None and r0 + n > self._onset_from:
            offset = max(self._onset_from - r0, 0)
            self.onset_perf = (time.perf_counter() + (time_info.outputBufferDacTime - time_info.currentTime)
                               + offset / self.sample_rate)
        if status.output_underflow:  # the device itself ran dry (PortAudio's flag): what ALSA reports
            self.output_underflows += 1
        self._callbacks += 1

    @property
    def underruns(self) -> int:
        return self._ring.underruns

    def _wait(self, last: tuple[int, float, float]) -> tuple[int, float, float]:
        """Sleep one poll; AudioDeviceError when the stream stopped or made no progress for too long (time this
        process was stopped not counted: engine.player_gate.watch_progress)."""
        time.sleep(self._poll_s)
        if self._running and not self._stream.active:
            raise device_error("the audio output device stopped (disconnected?)")
        last = watch_progress(last, self._callbacks, time.perf_counter())
        if last[2] - last[1] > self._stall_timeout_s:
            raise device_error(f"the audio output device stopped playing (no callback for "
                               f"{self._stall_timeout_s:g} s)")
        return last

    def write(self, data: bytes | memoryview) -> None:
        """Queue float32 LE frames; blocks while the ring is full."""
        view = memoryview(data)
        if self.first_write_perf is None and len(view):
            self.first_write_perf = time.perf_counter()
        done = self._ring.write(view) * FRAME_BYTES
        self._start_if_due()
        last = (self._callbacks, time.perf_counter(), time.perf_counter())
        while done < len(view) - FRAME_BYTES + 1:
            last = self._wait(last)
            done += self._ring.write(view[done:]) * FRAME_BYTES

    def allow_pause(self) -> None:
        """Running dry here is a pause: playback waits for the pre-roll again before it resumes."""
        self._ring.mark_end()
        self._start_if_due()

    def drain(self) -> None:
        """Wait until everything queued has played, then 2x latency of silence, so the tail is never cut."""
        ring = self._ring
        ring.mark_end()
        self._start_if_due()
        end = ring.write_count
        last = (self._callbacks, time.perf_counter(), time.perf_counter())
        while ring.read_count < end:
            last = self._wait(last)
        time.sleep(max(0.1, 2 * self.latency_s))

    def close(self) -> None:
        """Stop at once (unplayed audio is dropped) and close the stream; idempotent. Returns within
        portaudio_calls.WAIT_S even where PortAudio blocks (the call is then left on its daemon thread)."""
        if self._closed:
            return
        self._closed = True
        stream = self._stream

        def shut() -> None:
            stream.abort(ignore_errors=True)
            stream.close(ignore_errors=True)

        bounded(shut, self._sd, name="portaudio-close")


class FloatWav:
    """The lean road's `--out`: float32 mono samples written as they come into a WAV file (IEEE float, the format
    `say --out` writes), beside the target until complete (voiceapp.audio.wavout's partial file), then renamed over it.
    The same samples as the full road's file; only libsndfile's PEAK chunk is left out."""

    HEADER = 58
    """RIFF (12) + fmt with cbSize (26) + fact (12) + data's header (8) bytes."""

    def __init__(self, out, sample_rate: int) -> None:
        from voiceapp.audio.wavout import create_partial

        self.out, self.sample_rate = out, int(sample_rate)
        self.tmp = create_partial(out)
        self.file = open(self.tmp, "wb")
        self.frames = 0
        self.first_write_perf: float | None = None
        self.onset_perf = None
        self.underruns = 0
        self.output_underflows = 0
        self.file.write(self._header())

    def _header(self) -> bytes:
        import struct

        data = self.frames * FRAME_BYTES
        return (b"RIFF" + struct.pack("<I", self.HEADER - 8 + data) + b"WAVE"
                + b"fmt " + struct.pack("<IHHIIHHH", 18, 3, 1, self.sample_rate, self.sample_rate * FRAME_BYTES,
                                        FRAME_BYTES, 32, 0)
                + b"fact" + struct.pack("<II", 4, self.frames)
                + b"data" + struct.pack("<I", data))

    def write(self, data) -> None:
        if self.first_write_perf is None and len(data):
            self.first_write_perf = time.perf_counter()
        self.file.write(data)
        self.frames += len(data) // FRAME_BYTES

    def allow_pause(self) -> None:
        return None

    def drain(self) -> None:
        """Complete the file: the sizes into its header, then the rename over the target."""
        import os

        self.file.seek(0)
        self.file.write(self._header())
        self.file.close()
        os.replace(self.tmp, self.out)

    def close(self) -> None:
        """Drop an unfinished file (a complete one was renamed already)."""
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)
