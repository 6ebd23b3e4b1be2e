"""Provides Player, the speaker AudioSink: one PortAudio output stream per session fed from a RingBuffer.

sounddevice (and with it PortAudio) is imported lazily, inside functions, so importing this module works on
a machine without PortAudio; only constructing a Player or listing devices needs it.

Threads: the asyncio loop is the ring's only producer (`write`, `drain`, `clear`, `mark_utterance_start`);
the PortAudio callback is its only consumer and only copies (no allocation of buffers, no locks, no I/O,
no logging). State the callback needs from the producer is published as one tuple per utterance, read
once per callback. The stream's abort, restart and close run on a daemon thread with a bounded wait
(engine.backends.portaudio_calls): with the audio server dead or frozen they can block for good, and with them Ctrl-C.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from engine.backends.portaudio_calls import (FROZEN, WAIT_S, NoAnswer, answer, bounded, guard_exit,
                                            load_sounddevice)
from engine.errors import AudioDeviceError
from engine.player_gate import device_pull_s, may_play, rebuffers_after, watch_progress
from engine.ringbuffer import RingBuffer

FILE_HINT = "use --out FILE.wav to write a file instead"
"""How an AudioDeviceError ends: what a front end can do without speakers (one that cannot write files swaps it)."""


@dataclass(frozen=True, slots=True)
class OutputDevice:
    """One PortAudio device that can play audio."""

    index: int
    name: str
    hostapi: str
    """Host API name (ALSA, PulseAudio, CoreAudio, WASAPI, ...)."""
    default_samplerate: float
    max_output_channels: int
    is_default: bool
    """True for the default output device."""


def _device_error(what: str, err: BaseException | None = None) -> AudioDeviceError:
    detail = f": {str(err).strip().splitlines()[0]}" if err is not None and str(err).strip() else ""
    return AudioDeviceError(f"{what}{detail}; {FILE_HINT}")


def import_sounddevice() -> Any:
    """Import sounddevice, turning a missing PortAudio library into AudioDeviceError, and a PortAudio start that
    does not come back (the audio server frozen) into one too (engine.backends.portaudio_calls.load_sounddevice)."""
    try:
        sd = load_sounddevice()
    except NoAnswer:
        raise AudioDeviceError(f"{FROZEN}; {FILE_HINT}") from None
    except OSError as err:  # "PortAudio library not found"
        raise _device_error("PortAudio is not available (install libportaudio2)", err) from err
    except ImportError as err:
        raise _device_error("the sounddevice package is not installed", err) from err
    guard_exit(sd)  # its Pa_Terminate at exit bounded too, and quiet under a Ctrl-C
    return sd


def list_devices() -> list[OutputDevice]:
    """All devices with output channels, in PortAudio's order; raises AudioDeviceError without PortAudio."""
    sd = import_sounddevice()
    try:
        devices = sd.query_devices()
        hostapis = sd.query_hostapis()
        default_out = sd.default.device[1]
    except sd.PortAudioError as err:
        raise _device_error("cannot query audio devices", err) from err
    result = []
    for index, dev in enumerate(devices):
        if dev["max_output_channels"] < 1:
            continue
        result.append(OutputDevice(
            index=index, name=dev["name"], hostapi=hostapis[dev["hostapi"]]["name"],
            default_samplerate=float(dev["default_samplerate"]),
            max_output_channels=int(dev["max_output_channels"]), is_default=index == default_out))
    return result


def pick_device_rate(sd: Any, device: int | str | None, model_rate: int) -> int:
    """The model's rate if the device accepts it, else the device's default sample rate. The check opens the device
    (and so talks to the audio server): it runs through portaudio_calls.answer, AudioDeviceError where it does not
    come back."""
    try:
        answer(lambda: sd.check_output_settings(device=device, samplerate=model_rate, channels=1, dtype="float32"),
               sd, name="portaudio-check")
        return int(model_rate)
    except NoAnswer:
        raise AudioDeviceError(f"{FROZEN}; {FILE_HINT}") from None
    except (sd.PortAudioError, ValueError):
        pass
    try:
        info = sd.query_devices(device, "output")
    except (sd.PortAudioError, ValueError) as err:
        raise _device_error("no usable audio output device", err) from err
    return int(round(info["default_samplerate"]))


class Player:
    """AudioSink that plays through PortAudio, gaplessly, with pre-roll, backpressure and onset timing."""

    def __init__(
        self,
        sample_rate: int = 16000,
        *,
        device: int | str | None = None,
        latency: float | str = 0.1,
        preroll_s: float = 0.2,
        rebuffer_s: float | None = None,
        buffer_s: float = 3.0,
        device_rate: int | None = None,
        resample_quality: str = "HQ",
        poll_s: float = 0.01,
        stall_timeout_s: float = 5.0,
        start_on_audio: bool = False,
    ) -> None:
        """Open and start the session's output stream (with `start_on_audio`, open it only).

        sample_rate: rate of the samples given to write() (the model's rate).
        device: PortAudio device index or name; None = the default output device.
        latency: PortAudio output latency in seconds; about 0.1 s is robust on small machines.
        preroll_s: audio buffered before an utterance starts playing. It must exceed the latency, because
            PortAudio may pull a whole host buffer at once; it is raised to 1.5x latency when it does not.
        rebuffer_s: after an underrun, wait for this much audio before resuming (None = preroll_s, 0 = resume
            with whatever arrives); one longer pause sounds better than many short ones.
        buffer_s: ring capacity (at least 2x pre-roll); write() awaits while it is full.
        device_rate: force the stream's rate (None = the model rate if the device takes it, else the
            device's default rate); when it differs from sample_rate, one stateful soxr stream resamples.
        stall_timeout_s: waiting this long with no callback progress means the device is gone.
        start_on_audio: start the stream only once an utterance's pre-roll is queued, and stop it after each
            drain and clear. It starts priming the device's buffer from that audio (PortAudio's
            prime_output_buffers_using_stream_callback), so the first sample is the first the device plays: a
            stream already running has its whole buffer (about the latency) of silence queued ahead of it. For a
            player kept open between utterances (speech-dispatcher's module).
        """
        if preroll_s < 0 or buffer_s <= 0 or (rebuffer_s or 0) < 0:
            raise ValueError("preroll_s and rebuffer_s must be >= 0 and buffer_s > 0")
        if isinstance(latency, (int, float)):
            preroll_s = max(preroll_s, device_pull_s(latency))  # see preroll_s above
        buffer_s = max(buffer_s, 2 * preroll_s)
        sd = import_sounddevice()
        self.sample_rate = int(sample_rate)
        self.device_rate = int(device_rate) if device_rate else pick_device_rate(sd, device, self.sample_rate)
        self._ring = RingBuffer(int(round(buffer_s * self.device_rate)))
        self._preroll_frames = int(round(preroll_s * self.device_rate))
        self._rebuffer_frames = int(round((preroll_s if rebuffer_s is None else rebuffer_s) * self.device_rate))
        self._rebuffering = False
        """Callback-owned: the ring ran dry mid-utterance; wait for _rebuffer_frames before resuming."""
        self._resampler = None
        if self.device_rate != self.sample_rate:
            import soxr

            self._resampler = soxr.ResampleStream(self.sample_rate, self.device_rate, 1, dtype="float32",
                                                  quality=resample_quality)
        self._resampler_dirty = False
        self._poll_s = poll_s
        self._stall_timeout_s = stall_timeout_s
        # Producer -> callback: (utterance seq, ring write count where it begins); replaced, never mutated.
        self._utt_seq = 0
        self._utt: tuple[int, int] = (0, 0)
        self._utt_open = False
        self._clear_gen = 0
        # Callback -> producer.
        self._onset_seq = -1
        self._onset_perf = 0.0
        self._callbacks = 0
        self.output_underflows = 0
        """Callbacks PortAudio flagged `output_underflow` (host-side glitches; counted, not errors)."""
        self._closed = False
        self._dead = False
        """The stream stopped or stalled (its device or audio server gone): never touched again but to close it."""
        self._wedged = False
        """A PortAudio call on the stream did not return within portaudio_calls.WAIT_S and was left on its thread:
        the stream is not touched again, not even to close it (a second call would only queue behind the first)."""
        self._sd = sd
        self._start_on_audio = start_on_audio
        self._running = False
        """The stream was started and not stopped since (always, without start_on_audio, once open)."""
        self._stream = self._open_stream(sd, device, latency)

    # -- stream ---------------------------------------------------------------------------------------

    def _open_stream(self, sd: Any, device: int | str | None, latency: float | str) -> Any:
        """Open and start the stream on one thread of portaudio_calls.answer (both talk to the audio server):
        AudioDeviceError where they fail or do not come back."""
        try:
            return answer(lambda: self._open_and_start(sd, device, latency), sd, name="portaudio-open")
        except NoAnswer:
            raise AudioDeviceError(f"{FROZEN}; {FILE_HINT}") from None

    def _open_and_start(self, sd: Any, device: int | str | None, latency: float | str) -> Any:
        try:
            primed = {"prime_output_buffers_using_stream_callback": True} if self._start_on_audio else {}
            stream = sd.OutputStream(samplerate=self.device_rate, channels=1, dtype="float32", device=device,
                                     latency=latency, callback=self._callback, **primed)
        except (sd.PortAudioError, ValueError) as err:
            raise _device_error("cannot open the audio output device", err) from err
        self.latency_s = float(stream.latency)
        """Output latency PortAudio granted, seconds."""
        if self._preroll_frames <= self.latency_s * self.device_rate:  # granted more than asked
            self._preroll_frames = int(self.latency_s * self.device_rate * 1.5) + 1  # (and the ring opens
            # the gate when full, so even a pre-roll beyond its capacity cannot stall playback)
        if self._start_on_audio:
            return stream
        try:
            stream.start()
        except sd.PortAudioError as err:
            stream.close(ignore_errors=True)
            raise _device_error("cannot start the audio output device", err) from err
        self._running = True
        return stream

    def _start_if_due(self) -> None:
        """With start_on_audio: start the stopped stream once the callback would play what is queued (its pre-roll,
        an end mark, a full ring), on portaudio_calls.answer's thread (it talks to the audio server), waiting as
        long as clear's restart does (WAIT_S): the stream is open already, and the producer's loop waits meanwhile."""
        ring = self._ring
        if self._running or not may_play(False, False, ring.available, self._preroll_frames, 0,
                                         ring.end_pending or ring.free <= 0) or ring.available == 0:
            return
        sd, stream = self._sd, self._stream
        try:
            answer(stream.start, sd, name="portaudio-start", wait_s=WAIT_S)
        except NoAnswer:
            self._dead = self._wedged = True
            raise AudioDeviceError(f"{FROZEN}; {FILE_HINT}") from None
        except sd.PortAudioError as err:
            self._dead = True
            raise _device_error("cannot start the audio output device", err) from err
        self._running = True

    def _stop_idle(self) -> None:
        """With start_on_audio: stop the stream between utterances (what it still holds is silence or dropped)."""
        if not self._start_on_audio or not self._running or self._dead:
            return
        self._running = False
        stream = self._stream
        if not bounded(lambda: stream.abort(ignore_errors=True), self._sd, name="portaudio-stop"):
            self._dead = self._wedged = True

    def _callback(self, outdata: np.ndarray, frames: int, time: Any, status: Any) -> None:
        """PortAudio thread: copy from the ring, zero-fill on shortfall, note the onset. Nothing else."""
        ring = self._ring
        ring.apply_clear()
        seq, begin = self._utt  # after apply_clear: a seen clear implies its utterance tuple is seen
        out = outdata[:, 0]
        r0 = ring.read_count
        playing = ring.playing
        if may_play(playing, self._rebuffering and playing, ring.available, self._preroll_frames,
                    self._rebuffer_frames, ring.end_pending or ring.free <= 0):
            n = ring.read_into(out)
            self._rebuffering = rebuffers_after(n < frames, ring.playing, self._rebuffer_frames)
        else:
            out.fill(0.0)
            n = 0
            if ring.playing:
                ring.count_underrun(frames)  # stalled mid-utterance: this silence is a gap
        if seq != self._onset_seq and r0 + n > begin:
            offset = begin - r0 if begin > r0 else 0
            self._onset_perf = (perf_counter() + (time.outputBufferDacTime - time.currentTime)
                                + offset / self.device_rate)
            self._onset_seq = seq
        if status.output_underflow:
            self.output_underflows += 1
        self._callbacks += 1

    def _check_alive(self) -> None:
        if self._closed:
            raise AudioDeviceError(f"the audio player is closed; {FILE_HINT}")
        if self._dead or (self._running and not self._stream.active):
            self._dead = True
            raise AudioDeviceError(f"the audio output device stopped (disconnected?); {FILE_HINT}")

    async def _wait_progress(self, last: tuple[int, float, float]) -> tuple[int, float, float]:
        """Sleep one poll; raise AudioDeviceError when the stream died or made no progress for too long (time this
        process was stopped not counted: engine.player_gate.watch_progress)."""
        await asyncio.sleep(self._poll_s)
        self._check_alive()
        last = watch_progress(last, self._callbacks, perf_counter())
        if last[2] - last[1] > self._stall_timeout_s:
            self._dead = True
            raise AudioDeviceError(
                f"the audio output device stopped playing (no callback for {self._stall_timeout_s:g} s); "
                f"{FILE_HINT}")
        return last

    def set_preroll(self, preroll_s: float) -> float:
        """Audio buffered before the next utterance starts playing, from now on (a player kept open between
        utterances sizes it for each one: engine.pacing.Pacer.preroll_s); never below 1.5x the granted latency
        (see `preroll_s` in __init__). The re-buffer after an underrun keeps its size. Returns the seconds set."""
        frames = max(int(round(preroll_s * self.device_rate)), int(self.pull_s * self.device_rate) + 1)
        self._preroll_frames = frames  # one int, read by the callback as a whole
        return frames / self.device_rate

    @property
    def pull_s(self) -> float:
        """Audio the device takes ahead of real time as it starts, at most (player_gate.device_pull_s). The pre-roll
        exceeds it, as __init__'s rule for `preroll_s` has it."""
        return device_pull_s(self.latency_s)

    # -- utterances and onset -------------------------------------------------------------------------

    def mark_utterance_start(self) -> int:
        """Begin a new utterance at the current write position; returns its sequence number. Its audible
        onset (first buffer carrying its audio reaching the DAC) appears in `last_onset_perf`."""
        self._utt_seq += 1
        self._utt = (self._utt_seq, self._ring.write_count)
        self._utt_open = True
        return self._utt_seq

    @property
    def last_onset_perf(self) -> float | None:
        """time.perf_counter() value at which the current utterance became audible; None until then."""
        onset = self._onset_perf
        return onset if self._onset_seq == self._utt_seq else None

    def onset_perf(self, seq: int) -> float | None:
        """Audible onset of utterance `seq` if it is the latest one whose onset was recorded."""
        onset = self._onset_perf
        return onset if self._onset_seq == seq else None

    # -- AudioSink ------------------------------------------------------------------------------------

    async def write(self, samples: np.ndarray) -> None:
        """Queue float32 mono samples at `sample_rate`; awaits while the ring is full (backpressure)."""
        self._check_alive()
        x = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        if x.size == 0:
            return
        if not self._utt_open:
            self.mark_utterance_start()
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x)
            self._resampler_dirty = True
        await self._push(x)

    async def _push(self, x: np.ndarray) -> None:
        gen = self._clear_gen
        ring = self._ring
        done = ring.write(x)
        self._start_if_due()
        last = (self._callbacks, perf_counter(), perf_counter())
        while done < len(x):
            last = await self._wait_progress(last)
            if gen != self._clear_gen:
                return  # cleared while waiting: the rest is dropped too
            done += ring.write(x[done:])

    def allow_pause(self) -> None:
        """Running dry at the current write position is a pause, not an underrun; playback then waits for the
        pre-roll (or the next such mark) before it resumes. The resampler keeps its few samples of delay until the
        next write, which carries on from them."""
        self._ring.mark_end()
        self._start_if_due()

    async def drain(self) -> None:
        """Flush the resampler, end the utterance, wait until it has been played, then let at least
        2x latency of silence follow, so the tail is never cut."""
        self._check_alive()
        if self._resampler is not None and self._resampler_dirty:
            tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            self._resampler.clear()
            self._resampler_dirty = False
            await self._push(tail)
        was_open = self._utt_open
        self._utt_open = False
        ring = self._ring
        ring.mark_end()
        end = ring.write_count
        if not was_open and ring.available == 0:
            return
        self._start_if_due()
        last = (self._callbacks, perf_counter(), perf_counter())
        while ring.read_count < end and ring.available > 0:
            last = await self._wait_progress(last)
        await asyncio.sleep(max(0.1, 2 * self.latency_s))
        self._stop_idle()

    def clear(self) -> None:
        """Drop everything queued (barge-in); output falls silent at once. Producer thread only. Waits for the
        stream's abort + restart, at most portaudio_calls.WAIT_S: a
        stream whose restart takes longer is dead (its audio server gone or frozen), and the next write says so."""
        self._clear_gen += 1
        self._utt_open = False
        self._utt_seq += 1
        self._utt = (self._utt_seq, self._ring.write_count)  # publish before the ring's clear request
        self._ring.clear()
        if self._resampler is not None and self._resampler_dirty:
            self._resampler.clear()
            self._resampler_dirty = False
        if self._closed or self._dead:
            # a dead stream is left alone: restarting one whose audio server died blocks inside PortAudio (and
            # with it Ctrl-C) for good
            self._ring.apply_clear()
            return
        # Audio already handed to the host (about `latency`, 0.1 s) would keep playing; abort drops it.
        # abort() returns once the callback thread has stopped, so the ring has no consumer until start().
        stream, ring, sd = self._stream, self._ring, self._sd

        running, self._running = self._running, not self._start_on_audio  # (start_on_audio: stopped until due)

        def restart() -> None:
            try:
                if running:
                    stream.abort()
                ring.apply_clear()
                if not self._dead and not self._start_on_audio:  # given up on meanwhile: not started again
                    stream.start()
            except sd.PortAudioError:
                ring.apply_clear()  # the stream is dead; the next write/drain raises AudioDeviceError

        restarted = False
        try:
            restarted = bounded(restart, sd, name="portaudio-clear")
        finally:  # (a signal's exception may cut the wait short: the call is left behind all the same)
            if not restarted:
                self._dead = self._wedged = True  # the ring keeps its clear request: no consumer takes it now

    def close(self) -> None:
        """Stop and close the stream; idempotent. Unplayed audio is dropped (call drain() first). Returns within
        portaudio_calls.WAIT_S even where PortAudio blocks (the call is then left on its daemon thread)."""
        if self._closed:
            return
        self._closed = True
        if self._wedged:
            return
        stream = self._stream

        def shut() -> None:
            stream.abort(ignore_errors=True)
            stream.close(ignore_errors=True)

        shut_down = False
        try:
            shut_down = bounded(shut, self._sd, name="portaudio-close")
        finally:
            self._wedged = not shut_down

    def __enter__(self) -> "Player":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- health counters for a UI ---------------------------------------------------------------------

    @property
    def queued_frames(self) -> int:
        """Device-rate frames ever handed to the ring (a position in the stream: where the next write goes)."""
        return self._ring.write_count

    @property
    def played_frames(self) -> int:
        """Device-rate frames ever taken from the ring by PortAudio (or dropped by clear); compare with
        `queued_frames` to tell whether a position has reached the device."""
        return self._ring.read_count

    @property
    def underruns(self) -> int:
        """Callbacks that came up short mid-utterance (the ring ran dry)."""
        return self._ring.underruns

    @property
    def underrun_frames(self) -> int:
        """Device-rate frames zero-filled by those callbacks."""
        return self._ring.underrun_frames

    @property
    def fill_frames(self) -> int:
        """Device-rate frames buffered in the ring now."""
        return self._ring.available

    @property
    def capacity_frames(self) -> int:
        """Ring size in device-rate frames (fill_frames / capacity_frames = buffer health)."""
        return self._ring.capacity_frames

