"""Provides the lean road of `voicectl say` through a warm server: the request already sent
(`voiceapp.server.rendezvous.send_say`), its answer read with blocking socket calls and played through LeanPlayer, on
the standard library, sounddevice and the engine's pure modules. Neither numpy nor asyncio is imported, so a
client's launch-to-first-audio is the interpreter, argparse, PortAudio and the server's own first audio.

It speaks as RemoteSynthesizer.speak would: the same events reach the metrics, sentences are paced the same way on
an engine slower than real time (engine.pacing), and the server's errors become the same VoiceErrors. Where it
cannot stand in (a device that does not take the server's rate: the full Player resamples), it raises
`LeanDeclined` before reading anything, and the caller takes the full road with the same request.
"""
from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

from engine import errors
from engine.events import FirstAudio, Notice, RequestStarted, SentenceStarted
from engine.pacing import FAST_PREROLL_S, PREROLL_S, Pacer
from engine.protocol import (AUDIO_PREFIX, FLAG_PAUSE, FLAG_SENTENCE_END, HEADER, KIND_AUDIO, ProtocolError,
                             parse_event, parse_header)
from voiceapp.audio.lean_player import FRAME_BYTES, FloatWav, LeanPlayer, RateRefused
from voiceapp.server.rendezvous import CONNECT_TIMEOUT_S, FIRST_REPLY_S, not_answering, still_answers

READ_BYTES = 1 << 16
"""One recv's worth: a few audio frames at a time."""


class LeanDeclined(Exception):
    """The lean road cannot play this request; nothing was read from the server yet."""


@dataclass(frozen=True, slots=True)
class LeanAudio:
    """An audio frame as bytes: float32 LE mono samples, what the player takes as they are."""

    sentence_index: int
    data: memoryview
    sentence_end: bool
    pause: bool
    age_s: float
    """Seconds since its audio was made (a sentence rendered ahead of its turn); 0 when made as it was sent."""


class FrameReader:
    """Frames of engine.protocol from a blocking socket, each whole, with a deadline for the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def next(self, deadline: float | None) -> dict[str, Any] | LeanAudio | None:
        """The next frame; None when `deadline` (perf_counter's clock) came first. ServerLost when the connection
        ends or carries something that is not a frame."""
        while (frame := self._parse()) is None:
            wait = None if deadline is None else deadline - time.perf_counter()
            if wait is not None and wait <= 0:
                return None
            if not select.select([self.sock], [], [], wait)[0]:
                return None
            try:
                data = self.sock.recv(READ_BYTES)
            except OSError:
                data = b""
            if not data:
                raise ServerLost()
            self.buf += data
        return frame

    def _parse(self) -> dict[str, Any] | LeanAudio | None:
        if len(self.buf) < HEADER.size:
            return None
        try:
            kind, length = parse_header(bytes(self.buf[:HEADER.size]))
        except ProtocolError:
            raise ServerLost() from None
        end = HEADER.size + length
        if len(self.buf) < end:
            return None
        payload = bytes(self.buf[HEADER.size:end])
        del self.buf[:end]
        return audio_frame(payload) if kind == KIND_AUDIO else json_frame(payload)


class ServerLost(Exception):
    """The connection ended mid-request, or the peer sent something that is not a frame."""


def audio_frame(payload: bytes) -> LeanAudio:
    if len(payload) < AUDIO_PREFIX.size or (len(payload) - AUDIO_PREFIX.size) % FRAME_BYTES:
        raise ServerLost()
    index, flags, age_s = AUDIO_PREFIX.unpack_from(payload)
    age_s = age_s if 0 < age_s < float("inf") else 0.0
    return LeanAudio(index, memoryview(payload)[AUDIO_PREFIX.size:], bool(flags & FLAG_SENTENCE_END),
                     bool(flags & FLAG_PAUSE), age_s)


def json_frame(payload: bytes) -> dict[str, Any]:
    try:
        message = json.loads(payload.decode())
    except (ValueError, RecursionError):
        raise ServerLost() from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ServerLost()
    return message


def open_player(info: dict[str, Any], device: int | str | None, latency: float, buffer_s: float) -> LeanPlayer:
    """The player at the server's rate; LeanDeclined where the device wants another one."""
    try:
        return LeanPlayer(int(info["sample_rate"]), device=device, latency=latency, buffer_s=buffer_s)
    except RateRefused:
        raise LeanDeclined() from None


def open_file(info: dict[str, Any], out) -> FloatWav:
    """`--out`'s WAV at the server's rate."""
    return FloatWav(out, int(info["sample_rate"]))


def speak(sent: Any, request_id: str, player: LeanPlayer | FloatWav, events: Any) -> None:
    """Play the answer to the request `sent` carries on `player` (or write it: a FloatWav, which is not paced),
    then wait until it has been heard (or the file is complete); `events` gets what RemoteSynthesizer would report. Raises the server's error as a VoiceError, and
    a lookalike of voiceapp.server.client.ServerGone (a VoiceError with `audio_started`) when the server goes away."""
    info = sent.info
    rate = player.sample_rate
    paced = isinstance(player, LeanPlayer)
    pacer = Pacer.from_hello(info, probe=paced, learnt=True)
    if isinstance(player, LeanPlayer):
        player.set_preroll(pacer.preroll_s(PREROLL_S, FAST_PREROLL_S, player.pull_s))
    pace = pacer.request()
    reader = FrameReader(sent.sock)
    t0 = sent.sent_perf
    events(RequestStarted(request_id, t0))
    held: list[memoryview] = []
    planned: dict[int, float] = {}
    heard = False
    replied = False
    """Any frame has come: until then the server is asked whether it still answers every FIRST_REPLY_S."""
    probe_at = time.perf_counter() + FIRST_REPLY_S

    def release() -> None:
        message = pacer.notice()
        if message is not None:
            events(Notice(message))
        for data in held:
            t = time.perf_counter()
            player.write(data)
            pace.blocked(time.perf_counter() - t)
        held.clear()

    while True:
        deadline = pace.release_at()
        if not replied and sent.path is not None:
            deadline = probe_at if deadline is None else min(deadline, probe_at)
        try:
            frame = reader.next(deadline)
            if frame is None and not replied and sent.path is not None and time.perf_counter() >= probe_at:
                if not still_answers(sent.path):
                    raise Gone(not_answering(sent.path, CONNECT_TIMEOUT_S), False)
                probe_at = time.perf_counter() + FIRST_REPLY_S
                continue
            replied = replied or frame is not None
        except ServerLost:
            said = "after some audio" if heard else "before any audio"
            raise Gone(f"the voicectl server (pid {info.get('pid', '?')}) stopped in the middle of the request, "
                       f"{said} (killed or crashed?)", heard) from None
        if frame is None:  # the held sentence's moment came before its next chunk
            pace.release()
            release()
            continue
        if isinstance(frame, LeanAudio):
            now = time.perf_counter()
            if not frame.pause and not heard:
                events(FirstAudio(request_id, now - t0))
                heard = True
            held.append(frame.data)
            made_at = now - frame.age_s if frame.age_s > 0 else None
            if not paced or not pace.arrived(len(frame.data) / FRAME_BYTES / rate, frame.sentence_end, now,
                                             planned.get(frame.sentence_index), made_at):
                release()
                if frame.sentence_end and pacer.holds_sentences:
                    player.allow_pause()
        elif frame["type"] == "event":
            event = parse_event(frame, request_id)
            if isinstance(event, SentenceStarted):
                planned[event.sentence_index] = event.planned_s
            if event is not None:
                events(event)
        elif frame["type"] == "done":
            if frame.get("cancelled"):
                raise errors.Cancelled("the request was cancelled")
            break
        elif frame["type"] == "error":
            if frame.get("code") == "shutdown":
                raise Gone(str(frame.get("message") or "the voicectl server was stopped"), heard)
            raise error_from(frame)
    release()
    player.drain()


class Gone(errors.VoiceError):
    """The server went away mid-request (voiceapp.server.client.ServerGone's meaning, without importing asyncio)."""

    def __init__(self, message: str, audio_started: bool) -> None:
        super().__init__(message)
        self.audio_started = audio_started


def error_from(reply: dict[str, Any]) -> errors.VoiceError:
    """The VoiceError subclass the server named (so exit codes match the in-process run)."""
    cls = getattr(errors, str(reply.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.VoiceError)):
        cls = errors.VoiceError
    return cls(str(reply.get("message") or "the server reported an error"))
