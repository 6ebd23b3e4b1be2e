"""Provides the native speech-dispatcher output module: one persistent process (`voicectl speechd module CONFIG`,
started by speechd through the `sd_voiceapp` script install writes) that speaks speechd's module protocol on stdin
and stdout and speaks through the warm engine server, starting one when none runs.

The protocol (speech-dispatcher's "Communication Protocol for Output Modules"): lines end in LF; a reply is one or
more lines `NNN-...` closed by `NNN text`; SPEAK, SET, AUDIO and LOGLEVEL take a body ended by a line holding only
`.` (a body line starting with `.` has one more dot in front); STOP and PAUSE get no reply. While a message plays
the module reports 701 BEGIN (as its first audio plays), 700 for each index mark as the audio before it has played,
and then exactly one of 702 END, 703 STOP or 704 PAUSE.

Threads: the main thread reads stdin and answers (`ModuleProtocol`); the messages are spoken on an asyncio loop of
its own thread (`Speaker`), onto one output stream kept open between messages (`WarmPlayer`: started at each
message's first audio, primed from it) and through the last message's server connection; PortAudio's start and the
stream's opening run on threads of their own, bounded, so that a frozen sound server holds neither. Everything
written to stdout goes through one lock, one whole reply or event at a time, and no event of a message is written
before its `200 OK SPEAKING`.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from engine.pacing import FAST_PREROLL_S, PREROLL_S
from voiceapp.speechd.ssml import Segment, segments

if TYPE_CHECKING:
    from engine.backends.sounddevice_sink import Player
    from engine.families.base import ModelFamily
    from engine.voices import VoiceBank

SPEAK_COMMANDS = {"SPEAK": "text", "CHAR": "char", "KEY": "key", "SOUND_ICON": "icon"}
"""Commands that carry a message body, and what the body is."""
PARAM_COMMANDS = {"SET": (203, "", "203 OK SETTINGS RECEIVED"), "AUDIO": (207, "AUDIO ", "203 OK AUDIO INITIALIZED"),
                  "LOGLEVEL": (207, "LOGLEVEL ", "203 OK LOGLEVEL SET")}
"""Commands that carry `name=value` lines: the code and words of the first reply, and the closing reply."""
MARK_POLL_S = 0.005
"""How often a playing message checks how far the speakers got (marks, BEGIN): 5 ms of lateness at most."""
MAX_BODY_CHARS = 1 << 22
"""A message body longer than this is cut (speechd sends paragraphs; a runaway client's 4 MB is enough)."""
WARM_S = 30.0
"""How long the output stream stays open (stopped) after a message: a screen reader speaks at every keystroke, and
the next message then starts a stream that is already open. Closed after this long without one, so that an idle
module holds no stream on the sound server."""


# ---- configuration ---------------------------------------------------------------------------------------------

@dataclass
class ModuleConfig:
    """What `voicectl speechd install` wrote into the module's configuration file."""

    args: list[str] = field(default_factory=list)
    """voicectl options for the engine and playback (--model with an absolute path, --backend, --seed, ...)."""
    voice_types: dict[str, str] = field(default_factory=dict)
    """speechd voice type (MALE1, ...) -> our voice."""
    default_voice: str = "default"
    """What a message without a voice type or a known synthesis voice speaks."""
    log: Path | None = None
    """The module's own log: what `voicectl speechd status` shows when it failed."""

    @property
    def model(self) -> str | None:
        """The --model recorded in `args` (None: the engine's default)."""
        args = self.args
        return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model"), None)


def read_config(path: Path) -> ModuleConfig:
    """Parse the module configuration (`Key value ...` lines, shell-quoted; `#` starts a comment). Raises
    ValueError with one line naming what is wrong."""
    config = ModuleConfig()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        key, values = words[0], words[1:]
        if key == "Args":
            config.args = values
        elif key == "VoiceType" and len(values) == 2:
            config.voice_types[values[0].upper()] = values[1]
        elif key == "DefaultVoice" and len(values) == 1:
            config.default_voice = values[0]
        elif key == "Log" and len(values) == 1:
            config.log = Path(values[0])
        else:
            raise ValueError(f"{path}:{number}: unknown setting {line.strip()!r}")
    return config


def config_text(args: list[str], voice_types: dict[str, str], default_voice: str, log: Path) -> str:
    """The module configuration `read_config` reads."""
    lines = ["# speech-dispatcher output module voiceapp: written by `voicectl speechd install` (edits are lost on",
             "# the next install); read by `voicectl speechd module`.",
             "Args " + shlex.join(args),
             f"DefaultVoice {shlex.quote(default_voice)}",
             f"Log {shlex.quote(str(log))}"]
    lines += [f"VoiceType {kind} {shlex.quote(name)}" for kind, name in voice_types.items()]
    return "\n".join(lines) + "\n"


def module_parser() -> argparse.ArgumentParser:
    """The options a configuration's Args line may hold (as `voicectl say` takes them)."""
    from voiceapp.common import add_engine_args, add_playback_args, add_socket_arg, add_voice_args

    p = argparse.ArgumentParser(prog="voiceapp module", add_help=False)
    add_playback_args(p)
    add_voice_args(p, default_seed=0)
    add_socket_arg(p)
    add_engine_args(p)
    return p


# ---- what a message asks for --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """speechd's SET values for the next message (strings as sent; "NULL" means unset)."""

    voice_type: str = "NULL"
    synthesis_voice: str = "NULL"
    language: str = "NULL"
    rate: str = "0"
    pitch: str = "0"

    def updated(self, values: dict[str, str]) -> "Settings":
        names = {"voice": "voice_type", "synthesis_voice": "synthesis_voice", "language": "language",
                 "rate": "rate", "pitch": "pitch"}
        return replace(self, **{names[k]: v for k, v in values.items() if k in names})


def choose_voice(settings: Settings, config: ModuleConfig, voices: dict, family_default: str) -> str:
    """Our voice for a message: a synthesis voice that is one of ours, else the voice type's (by name, whatever the
    locale or the user's own voices), else the configured default (`family_default`, the model family's own, for
    "default"); then moved by rate and pitch (speechd.install.pick_voice)."""
    from voiceapp.speechd.install import pick_voice, speechd_number

    name = None
    if settings.synthesis_voice not in ("", "NULL") and settings.synthesis_voice in voices:
        name = settings.synthesis_voice
    elif settings.voice_type.upper() in config.voice_types:
        name = config.voice_types[settings.voice_type.upper()]
    if name is None or name not in voices:
        name = family_default if config.default_voice in ("", "default") else config.default_voice
    if name not in voices:
        name = family_default if family_default in voices else sorted(voices)[0]
    return pick_voice(name, speechd_number(settings.rate), speechd_number(settings.pitch), voices)


# ---- the protocol --------------------------------------------------------------------------------------------

class Output:
    """stdout, one whole reply or event at a time."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def send(self, *lines: str) -> None:
        with self.lock:
            self.stream.write("".join(line + "\n" for line in lines))
            self.stream.flush()


class ModuleProtocol:
    """speechd's side of the conversation, a line at a time: replies go to `out`, messages to `speaker` (anything
    with prepare(), speak(kind, text, settings) -> bool, stop(), pause(), voices() and close())."""

    def __init__(self, out: Output, speaker, log: Callable[[str], None] = lambda line: None) -> None:
        self.out, self.speaker, self.log = out, speaker, log
        self.settings = Settings()
        self._body: list[str] | None = None
        self._body_size = 0
        self._command = ""
        self.initialized = False
        self.done = False
        """QUIT was handled (or stdin ended)."""

    def feed(self, line: str) -> None:
        """One line from speechd, its LF removed."""
        if self._body is not None:
            self._body_line(line)
            return
        command = line.strip()
        if not self.initialized:
            if command == "INIT":
                self.initialized = True
                self.speaker.prepare()
                self.out.send("299-voiceapp: the engine server speaks (started when needed)",
                              "299 OK LOADED SUCCESSFULLY")
            else:
                self.out.send("399-the first command must be INIT", "399 ERR CANT INIT MODULE")
            return
        word = command.split(" ", 1)[0] if command else ""
        if command in SPEAK_COMMANDS or command in PARAM_COMMANDS:
            self._command, self._body, self._body_size = command, [], 0
            if command in SPEAK_COMMANDS:
                self.out.send("202 OK RECEIVING MESSAGE")
            else:
                code, what, _ = PARAM_COMMANDS[command]
                self.out.send(f"{code} OK RECEIVING {what}SETTINGS")
        elif command == "STOP":
            self.speaker.stop()
        elif command == "PAUSE":
            self.speaker.pause()
        elif word == "LIST" and command.split()[:2] == ["LIST", "VOICES"]:
            self._list_voices(command.split()[2:])
        elif word == "DEBUG":
            self.out.send("200 OK DEBUGGING " + (command.split()[1] if len(command.split()) > 1 else "OFF"))
        elif command == "QUIT":
            self.speaker.close()
            self.out.send("210 OK QUIT")
            self.done = True
        else:
            self.log(f"unknown command {command[:80]!r}")
            self.out.send("300 ERR UNKNOWN COMMAND")

    def _body_line(self, line: str) -> None:
        assert self._body is not None
        if line == ".":
            body, self._body = self._body, None
            self._finish(self._command, body)
            return
        line = line[1:] if line.startswith(".") else line
        if self._body_size < MAX_BODY_CHARS:
            self._body.append(line)
            self._body_size += len(line) + 1

    def _finish(self, command: str, body: list[str]) -> None:
        if command in PARAM_COMMANDS:
            values, bad = {}, False
            for line in body:
                name, sep, value = line.partition("=")
                if not sep or not name:
                    bad = True
                else:
                    values[name.strip()] = value.strip()
            if bad:
                self.out.send("302 ERROR BAD SYNTAX")
                return
            if command == "SET":
                self.settings = self.settings.updated(values)
            self.out.send(PARAM_COMMANDS[command][2])
            return
        text = "\n".join(body)
        kind = SPEAK_COMMANDS[command]
        if kind != "text" and len(body) > 1:
            self.out.send("305 DATA MORE THAN ONE LINE")
            return
        if not text.strip() and kind != "key":
            self.out.send("301 ERROR CANT SPEAK")
            return
        with self.out.lock:  # no event of this message before its reply
            started = self.speaker.speak(kind, text, self.settings)
            self.out.stream.write("200 OK SPEAKING\n" if started else "301 ERROR CANT SPEAK\n")
            self.out.stream.flush()

    def _list_voices(self, wanted: list[str]) -> None:
        rows = []
        for name, language in self.speaker.voices():
            if wanted and wanted[0].lower() not in (language.lower(), language.split("-")[0].lower()):
                continue
            if len(wanted) > 1 and wanted[1].lower() != "none":
                continue
            rows.append(f"200-{name}\t{language}\tnone")
        self.out.send(*rows, "200 OK VOICE LIST SENT") if rows else self.out.send("304 CANT LIST VOICES")


# ---- speaking --------------------------------------------------------------------------------------------------

def message_text(kind: str, text: str) -> list[Segment]:
    """The segments of a message: SSML for SPEAK; a character, a key name or an icon's name otherwise."""
    if kind == "text":
        return segments(text)
    if kind == "key":
        text = {"space": "space"}.get(text, text.replace("_", " "))
    return [Segment((), text)]


def sentence_count(text: str) -> int:
    """How many sentences the engine speaks for `text` alone: its splitter's, the unspeakable ones left out. The
    message goes to the engine with its segments on lines of their own, and the splitter ends a sentence at every
    line break, so the segments' counts add up to the message's."""
    from engine.config import JoinConfig
    from engine.text import is_speakable, normalize, split_sentences

    return sum(is_speakable(normalize(s)) for s in split_sentences(text, JoinConfig().max_sentence_chars))


def counted(remote):
    """`remote` (a RemoteSynthesizer) whose `speak` also notes where each sentence's audio ends, in model samples
    from the request's start (`sentence_ends`)."""
    from engine.folds import UtteranceFolds

    class Counted(UtteranceFolds):
        def __init__(self) -> None:
            self.pacer, self.events = remote.pacer, remote.events
            self.sentence_ends: list[int] = []

        async def synthesize(self, req, text_stream=None):
            total = 0
            async for chunk in remote.synthesize(req, text_stream):
                total += len(chunk.samples)
                if chunk.sentence_end:
                    self.sentence_ends.append(total)
                yield chunk

    return Counted()


class MarkingSink:
    """The Player as the request's AudioSink, noting the player's position at each sentence's end: the chunks reach
    it in the order they came, so its count of model samples meets `speaker.sentence_ends` at chunk edges."""

    def __init__(self, player, speaker, progress: "_Progress") -> None:
        self.player, self.speaker, self.progress = player, speaker, progress
        self.written = 0

    async def write(self, samples) -> None:
        await self.player.write(samples)
        self.written += len(samples)
        ends = self.speaker.sentence_ends
        while len(self.progress.ends) < len(ends) and ends[len(self.progress.ends)] <= self.written:
            self.progress.ends.append(self.player.queued_frames)

    def allow_pause(self) -> None:
        self.player.allow_pause()

    async def drain(self) -> None:
        await self.player.drain()

    def clear(self) -> None:
        self.player.clear()

    def close(self) -> None:
        return None


class Speaker:
    """Speaks one message at a time on its own thread's event loop, through the warm server."""

    def __init__(self, config: ModuleConfig, out: Output, log: Callable[[str], None]) -> None:
        self.config, self.out, self.log = config, out, log
        self.args = module_parser().parse_args(config.args)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="speechd-speaker", daemon=True)
        self.thread.start()
        self._pacer: tuple | None = None
        """(server pid, its engine.pacing.Pacer) of the server last spoken with: what it learnt of the engine's speed
        carries over from message to message (a fresh one would hold every message back to measure it again)."""
        self._task: concurrent.futures.Future[None] | None = None
        self._active = False
        """A message is being spoken: from its SPEAK until just before its closing event goes out (speechd may send
        the next SPEAK as soon as it reads that event, before the task has quite returned)."""
        self._ending: str | None = None
        """What ends the message being spoken: "STOP" or "PAUSE" once asked, else None (its end)."""
        self._family: ModelFamily | None = None
        self._bank: VoiceBank | None = None
        """The model family's VoiceBank, kept: each message asks it for the voices on disk now (a voice cloned since
        counts), and it reads again only the files that changed."""
        self.output = WarmPlayer(self.args, self.loop)
        """The output stream, kept open between messages."""
        self._kept = None
        """The last message's server connection (a RemoteSynthesizer after a whole request), kept for the next: no
        connect and hello before its request goes out."""
        self._connecting: asyncio.Task | None = None
        """After a stopped message (whose connection closed: the server aborts a request whose client hung up), a
        connection being made for the next one while none plays: a screen reader stops a message at every
        keystroke, and the next one should not wait for a connect and hello."""
        self._idle: asyncio.TimerHandle | None = None
        """Closes the stream and the kept connection WARM_S after the last message."""
        self._rate: int | None = None
        """The sample rate the stream opens at before the server says its own: the last server's, else the model
        family's."""

    def family(self) -> ModelFamily:
        """The configured model's family, found once (from its folder: no model loaded)."""
        if self._family is None:
            from engine.families import family_of

            self._family = family_of(self.config.model)
        return self._family

    def voice_bank(self) -> VoiceBank:
        """The configured model family's VoiceBank, made once."""
        if self._bank is None:
            self._bank = self.family().voices()
        return self._bank

    def bank(self) -> dict:
        """The voices of the configured model's family (Spark's presets and the user's own, or Orpheus's names), as
        they are on disk now."""
        return self.voice_bank().all()

    def choose_voice(self, settings: Settings) -> str:
        """The voice a message with these settings speaks (`choose_voice`)."""
        bank = self.voice_bank()
        return choose_voice(settings, self.config, bank.all(), bank.default)

    def voices(self) -> list[tuple[str, str]]:
        """Every voice under each language the family speaks (`spd-say -L`)."""
        return [(name, language) for language in self.family().languages for name in sorted(self.bank())]

    def speak(self, kind: str, text: str, settings: Settings) -> bool:
        """Start speaking (the caller holds the output lock and replies); False while a message still plays."""
        if self._active:
            return False
        voice = self.choose_voice(settings)
        self._ending = None
        self._active = True
        self._task = asyncio.run_coroutine_threadsafe(self._speak(message_text(kind, text), voice), self.loop)
        return True

    def stop(self) -> None:
        self._end("STOP")

    def pause(self) -> None:
        self._end("PAUSE")

    def _end(self, how: str) -> None:
        task = self._task
        if task is None or task.done() or not self._active:
            return
        self._ending = how
        self.loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        self.stop()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                self._task.result(5)
        with contextlib.suppress(BaseException):
            asyncio.run_coroutine_threadsafe(self._rest(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _speak(self, pieces: list[Segment], voice: str) -> None:
        progress = _Progress(self.out)
        ending = "702 END"
        if self._idle is not None:
            self._idle.cancel()
        try:
            await self._play(pieces, voice, progress)
            progress.reached(None)  # the marks after the last audio: everything has played
        except asyncio.CancelledError:
            ending = "704 PAUSE" if self._ending == "PAUSE" else "703 STOP"
        except Exception as err:  # noqa: BLE001 - one line in the log, and speechd hears this message ended
            from engine.backends.sounddevice_sink import FILE_HINT
            from engine.errors import AudioDeviceError, VoiceError

            said = str(err).removesuffix(f"; {FILE_HINT}")  # (speechd's user cannot pass --out)
            self.log(f"error: {said}" if isinstance(err, VoiceError) else f"error: {type(err).__name__}: {err}")
            ending = "703 STOP"
            if isinstance(err, AudioDeviceError) or not isinstance(err, VoiceError):
                await self.output.drop()  # the stream is not trusted again: the next message opens another
        finally:
            progress.stop()  # (a stopped message's audio was dropped by the player's clear: silent already)
            self._idle = self.loop.call_later(WARM_S, lambda: self.loop.create_task(self._rest()))
            if ending != "702 END":
                self._connect_ahead()
            self._active = False
            progress.finish(ending)

    async def _rest(self) -> None:
        """No message for WARM_S (or QUIT): close the stream and the kept connection."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        kept, self._kept = self._kept, None
        for remote in (kept, self._made_ahead()):
            if remote is not None:
                await remote.close()
        await self.output.close()

    async def _play(self, pieces: list[Segment], voice: str, progress: "_Progress") -> None:
        """The message as one request, its segments on lines of their own, onto the warm Player; each segment's
        marks wait for the sentences before it."""
        from engine.config import SynthesisRequest
        from voiceapp.server.client import ServerGone
        from voiceapp.common import sampling_options

        before = 0
        for piece in pieces:
            progress.mark_after(piece.marks, before)
            before += sentence_count(piece.text) if piece.text.strip() else 0
        if before == 0:
            return  # nothing speakable: the marks are reported as the message ends
        self.output.open_ahead(self._rate or self._family_rate())  # the stream opens while the request goes out
        remote, self._kept = self._kept, None
        made = self._made_ahead()
        if remote is None:
            remote = made
        elif made is not None:
            await made.close()
        reused = remote is not None
        if remote is None:
            remote = await self._connect()
        try:
            self._rate = remote.sample_rate
            player = await self.output.get(self._rate)
            progress.watch(player, player.mark_utterance_start())
            req = SynthesisRequest("\n".join(piece.text for piece in pieces), voice=voice,
                                   options=sampling_options(self.args))
            queued = player.queued_frames
            try:
                await self._request(remote, req, player, progress)
            except (ServerGone, OSError):
                if not reused or player.queued_frames != queued:
                    raise
                await remote.close()  # the server of the kept connection went away since: ask the one there now
                remote = await self._connect()
                await self._request(remote, req, player, progress)
            self._kept, remote = remote, None  # a whole request: its connection serves the next message
        finally:
            if remote is not None:
                await remote.close()

    async def _request(self, remote, req, player, progress: "_Progress") -> None:
        player.set_preroll(remote.pacer.preroll_s(PREROLL_S, FAST_PREROLL_S, player.pull_s))
        speaker = counted(remote)
        await speaker.speak(req, MarkingSink(player, speaker, progress))

    def _connect_ahead(self) -> None:
        """Start making the next message's connection (see `_connecting`), unless one is kept or on its way."""
        if self._kept is None and self._connecting is None:
            self._connecting = self.loop.create_task(self._connect_quietly())

    def _made_ahead(self):
        """The connection made ahead, if it is there by now (else it is given up: a server slow to answer is
        connected to by the message itself, not waited on twice)."""
        connecting, self._connecting = self._connecting, None
        if connecting is None:
            return None
        if not connecting.done():
            connecting.cancel()
            return None
        return connecting.result()

    async def _connect_quietly(self):
        """A connection to the server that runs now, or None (none runs, or it failed: the next message connects,
        or starts one, itself and says what fails)."""
        try:
            return await self._connect(start=False, notices=False)
        except Exception:  # noqa: BLE001 - see the docstring
            return None

    async def _connect(self, start: bool = True, notices: bool = True):
        from engine.errors import VoiceError
        from voiceapp.server.autostart import connect_or_start
        from voiceapp.common import engine_config
        from voiceapp.server.rendezvous import socket_path

        remote = await connect_or_start(socket_path(self.args.socket), engine_config(self.args, one_listener=True),
                                        lambda event: self.log(f"{getattr(event, 'message', event)}")
                                        if notices and type(event).__name__ == "Notice" else None, start=start)
        if remote is None:
            raise VoiceError("no engine server could be used or started (see the notices above)")
        pid = remote.info.get("pid")
        if self._pacer is not None and self._pacer[0] == pid:
            remote.pacer = self._pacer[1]
        self._pacer = (pid, remote.pacer)
        return remote

    def prepare(self) -> None:
        """Import what speaking needs (the client, the player) on the speaker's thread, and start PortAudio on a
        thread of its own (engine.backends.portaudio_calls: a frozen sound server holds that thread, not the
        speaker's), so that the first message waits for none of it."""
        async def load() -> None:
            try:
                from engine.backends.portaudio_calls import start_loading

                start_loading()
                import engine.backends.sounddevice_sink  # noqa: F401
                import engine.config  # noqa: F401
                import voiceapp.server.autostart  # noqa: F401

                sentence_count("Warm, here.")  # the text's imports and tables (normalize's)
                self._family_rate()
                self.bank()
            except Exception as err:  # noqa: BLE001 - said again, as a one-line error, by the first message
                self.log(f"preparing: {type(err).__name__}: {err}")

        asyncio.run_coroutine_threadsafe(load(), self.loop)

    def _family_rate(self) -> int:
        """The configured model family's sample rate (no model loaded): what the first message's stream opens at."""
        if self._rate is None:
            self._rate = self.family().sample_rate
        return self._rate


class WarmPlayer:
    """The module's output stream (engine.backends.sounddevice_sink's Player), opened as a message's request goes
    out and kept open between messages (started at each one's first audio, stopped after it: start_on_audio),
    closed by the Speaker once WARM_S pass without one. Used on the speaker's loop only; the stream opens on a thread of its own,
    bounded by the Player (a frozen sound server: AudioDeviceError after a few seconds), so that a STOP meanwhile is
    heard at once."""

    def __init__(self, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
        self.args, self.loop = args, loop
        self.player = None
        self._opening: asyncio.Future | None = None
        """The Player being opened: awaited by the message that needs it, kept across a STOP."""
        self._opening_rate = 0

    def open_ahead(self, rate: int) -> None:
        """Start opening a stream at `rate` unless one is open or opening at it."""
        if (self.player is not None and self.player.sample_rate == rate) or (
                self._opening is not None and self._opening_rate == rate):
            return
        if self._opening is not None:  # at another rate: closed once it opened
            self._opening.add_done_callback(_close_opened)
        self._opening_rate = rate
        self._opening = self.loop.run_in_executor(None, self._open, rate)

    async def get(self, rate: int):
        """The open stream at `rate` (opened now where the one ahead was at another). AudioDeviceError where
        PortAudio refuses or does not answer; a cancel (STOP) leaves a stream still opening to the next message."""
        self.open_ahead(rate)
        opening = self._opening
        if opening is None:
            return self.player
        try:
            player = await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening is opening:
                self._opening = None
        await self.drop()
        self.player = player
        return player

    def _open(self, rate: int):
        from engine.backends.sounddevice_sink import Player

        device = self.args.device
        device = int(device) if device and device.isdigit() else device
        return Player(sample_rate=rate, device=device, latency=self.args.latency, preroll_s=PREROLL_S,
                      buffer_s=self.args.buffer, start_on_audio=True)

    async def drop(self) -> None:
        """Close the open stream (bounded: engine.backends.sounddevice_sink's Player.close), on a thread."""
        player, self.player = self.player, None
        if player is not None:
            await self.loop.run_in_executor(None, player.close)

    async def close(self) -> None:
        """Close the stream, and one still opening once it opened."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.add_done_callback(_close_opened)
        await self.drop()


def _close_opened(opening: asyncio.Future) -> None:
    """A stream opened for nobody: closed (bounded) on a thread."""
    if not opening.cancelled() and opening.exception() is None:
        threading.Thread(target=opening.result().close, name="speechd-close", daemon=True).start()


class _Progress:
    """A message's events: 701 BEGIN once its first audio plays, each mark once the sentences before it have been
    heard, then its one closing event; nothing after that."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self.begun = self.finished = False
        self.pending: list[tuple[int, str]] = []
        """(sentences before the mark, its name), in message order."""
        self.ends: list[int] = []
        """The player's position (queued_frames) at the end of each sentence written so far."""
        self.player: Player | None = None
        self._watch: asyncio.Task | None = None

    def mark_after(self, names: tuple[str, ...], sentences: int) -> None:
        self.pending += [(sentences, name) for name in names]

    def watch(self, player: Player, utterance: int) -> None:
        """Follow `player` playing its utterance number `utterance` (the message's)."""
        self.player = player
        self._watch = asyncio.get_running_loop().create_task(self._poll(utterance))

    async def _poll(self, utterance: int) -> None:
        player = self.player
        if player is None:
            return
        ahead = int(player.latency_s * player.device_rate)  # what the device holds before it is heard
        while not self.finished:
            onset = player.onset_perf(utterance)
            if not self.begun and onset is not None and time.perf_counter() >= onset:
                self.begin()
            if self.begun:
                self.reached(player.played_frames - ahead)
            await asyncio.sleep(MARK_POLL_S)

    def begin(self) -> None:
        if not self.begun:
            self.begun = True
            self.out.send("701 BEGIN")

    def reached(self, heard: int | None) -> None:
        """Report the marks whose sentences before them have been heard up to frame `heard` (all with None)."""
        def due(sentences: int) -> bool:
            return (heard is None or sentences == 0
                    or (len(self.ends) >= sentences and self.ends[sentences - 1] <= heard))

        while self.pending and due(self.pending[0][0]):
            _, name = self.pending.pop(0)
            self.begin()
            self.out.send(f"700-{name}", "700 INDEX MARK")

    def finish(self, event: str) -> None:
        """The message's closing event (after a BEGIN, which it always follows)."""
        self.begin()
        self.out.send(event)

    def stop(self) -> None:
        """No more marks or BEGIN from the watcher."""
        self.finished = True
        if self._watch is not None:
            self._watch.cancel()


# ---- the process ---------------------------------------------------------------------------------------------

class ModuleLog:
    """The module's own log (its configuration's Log file), also written to stderr (speechd keeps that too)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def __call__(self, line: str) -> None:
        text = f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {line}"
        print(text, file=sys.stderr, flush=True)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text + "\n")


def run_module(config_path: str, stdin: TextIO, stdout: TextIO) -> int:
    """The module's life: read the configuration, answer INIT, serve until QUIT or the end of stdin."""
    out = Output(stdout)
    try:
        config = read_config(Path(config_path))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        ModuleLog(None)(f"error: cannot read the configuration: {err}")
        if stdin.readline().strip() == "INIT":
            out.send(f"399-cannot read {config_path}: {err}", "399 ERR CANT INIT MODULE")
        return 1
    log = ModuleLog(config.log)
    try:
        speaker = Speaker(config, out, log)
    except SystemExit:
        log(f"error: the configuration's Args are not voicectl options: {shlex.join(config.args)}")
        if stdin.readline().strip() == "INIT":
            out.send("399-the module's configuration is broken: run `voicectl speechd install` again",
                     "399 ERR CANT INIT MODULE")
        return 1
    log(f"started (configuration {config_path})")
    protocol = ModuleProtocol(out, speaker, log)
    for line in stdin:
        protocol.feed(line.rstrip("\n"))
        if protocol.done:
            break
    else:
        speaker.close()
    log("quit")
    return 0
