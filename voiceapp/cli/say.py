"""Provides `voicectl say`: speak text (or stdin, sentence by sentence as it arrives) through the speakers."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from voiceapp.common import (add_engine_args, add_playback_args, add_server_args, add_voice_args, engine_config,
                             process_start_perf, require_speakable, require_voice, sampling_options)

if TYPE_CHECKING:
    from voiceapp.audio.lean_player import FloatWav, LeanPlayer
    from voiceapp.cli.say_metrics import SayMetrics


def add_parser(sub) -> None:
    p = sub.add_parser("say", help='speak text: voicectl say "Hello" | voicectl say - (stdin)')
    p.add_argument("text", nargs="+", help="text to speak, or - to speak stdin as it arrives")
    p.add_argument("--out", metavar="FILE.wav", help="write a WAV file instead of playing")
    add_playback_args(p)
    p.add_argument("--stats", action="store_true", help="print one line of metrics at the end (stderr)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON on stdout")
    add_server_args(p, "say")
    add_voice_args(p, default_seed=None)
    add_engine_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.config import SynthesisRequest

    process_start_perf()  # fixes the clock's origin now where /proc cannot tell
    from_stdin = args.text == ["-"]
    text = "" if from_stdin else " ".join(args.text)
    req = SynthesisRequest(text, voice=args.voice, options=sampling_options(args))
    notices: list = []
    sent = send_ahead(args, req, from_stdin, notices.append)  # first: the rest is imported while the server works
    from voiceapp.cli.say_metrics import SayMetrics

    metrics = SayMetrics()
    for notice in notices:
        metrics.on_event(notice)
    if sent is not None and say_lean(req, text, args, metrics, sent):
        report(args, metrics)
        return 0
    try:
        check_input(args, text, speakable=not from_stdin and sent is None)
    except BaseException:
        if sent is not None:
            sent.cancel()
        raise
    import asyncio

    asyncio.run(say(req, from_stdin, args, metrics, sent))
    report(args, metrics)
    return 0


def report(args: argparse.Namespace, metrics: SayMetrics) -> None:
    """--stats and --json."""
    if args.stats:
        print(metrics.line(), file=sys.stderr)
    if args.json:
        print(json.dumps(metrics.as_dict()))


def say_lean(req, text: str, args: argparse.Namespace, metrics: SayMetrics, sent) -> bool:
    """Play the request `sent` carries, or write it to --out, on the lean road (voiceapp.cli.lean_say: no numpy, no
    asyncio before its first audio is queued, nor after); False, with `sent` untouched, where that road cannot play it (the caller then takes
    the full one). A server that goes away before any audio: spoken in-process, as `say` does."""
    from engine.errors import InputError
    from voiceapp.cli import lean_say

    player: LeanPlayer | FloatWav
    try:
        # the voice is the server's to refuse (the same VoiceNotFound), not checked here on every launch: the model
        # family's voices and text rules would be imported while the first audio waits
        if args.out:
            from voiceapp.audio.wavout import check_output

            check_output(Path(args.out))
            player = lean_say.open_file(sent.info, Path(args.out))
        else:
            player = lean_say.open_player(sent.info, _device(args), args.latency, args.buffer)
    except lean_say.LeanDeclined:
        return False
    except BaseException:
        sent.cancel()
        raise
    metrics.server_pid = sent.info.get("pid")
    try:
        try:
            lean_say.speak(sent, req.request_id, player, metrics.on_event)
        except OSError as err:  # only the file is written to here; a server that left is lean_say.Gone
            if not args.out:
                raise
            from engine.errors import OutputError
            from voiceapp.audio.wavout import disk_full

            if disk_full(err, Path(args.out)):
                raise OutputError(f"disk full while writing {args.out}; nothing was written") from None
            raise OutputError(f"cannot write {args.out}: {err.strerror or err}") from None
        if metrics.t0 is not None and not args.out:
            metrics.played_s = time.perf_counter() - metrics.t0
        metrics.heard_at(player.onset_perf)
        metrics.underruns = player.underruns
        metrics.device_underruns = player.output_underflows
        if player.first_write_perf is not None:
            metrics.phases["queued"] = player.first_write_perf - process_start_perf()
    except InputError:
        require_speakable(req.text, "the text")  # the engine refused it: say why as the local check would have
        raise
    except lean_say.Gone as err:
        if err.audio_started:
            raise
        player.close()
        sent.cancel()
        from engine.events import Notice

        metrics.on_event(Notice(f"{err}; speaking in-process instead"))
        metrics.server_pid = None
        import asyncio

        asyncio.run(speak_in_process(req, False, args, metrics, None))
    finally:
        player.close()
        sent.cancel()
    return True


def send_ahead(args: argparse.Namespace, req, from_stdin: bool, events):
    """The request sent to a running server before this process imports its audio stack and checks its input
    (`voiceapp.server.rendezvous.send_say`), or None: stdin, no server wanted, none running, or one that cannot stand
    in (the usual road then starts one or says why). A server that does not answer: a Notice to `events`, and
    `args.no_server` set, so that the usual road speaks in-process without waiting on it again."""
    from engine.protocol import MAX_TEXT_PIECE
    from voiceapp.server.rendezvous import ServerNotAnswering, send_say, server_disabled, socket_path

    if from_stdin or not req.text.strip() or len(req.text) > MAX_TEXT_PIECE or server_disabled(args.no_server):
        return None
    try:
        return send_say(socket_path(args.socket), args.backend, args.model, req)
    except ServerNotAnswering as err:
        from engine.events import Notice

        events(Notice(f"{err}; speaking in-process"))
        args.no_server = True
        return None


def check_input(args: argparse.Namespace, text: str, speakable: bool) -> None:
    """The one-line errors for an unknown voice, an unusable --out file and, with `speakable`, nothing to say. A
    request sent ahead is checked for that by the server, whose pipeline refuses it the same way (and `say` then
    words the error as here), so that the text rules are not imported while it waits."""
    if speakable:
        require_speakable(text, "the text")
    require_voice(args.voice, args.model)
    if args.out:
        from voiceapp.audio.wavout import check_output  # numpy comes with it: only where a file is written

        check_output(Path(args.out))


async def say(req, from_stdin: bool, args: argparse.Namespace, metrics: SayMetrics, sent=None) -> None:
    """Speak through a running `voicectl serve` (the audio still plays here), started in the background when none
    runs; in-process with --no-server or VOICEAPP_NO_SERVER, or when no server can stand in. `sent`: the request,
    already sent to a server (`send_ahead`), its text not checked here yet.

    If the server dies before any audio arrived, a text argument is spoken in-process instead (stdin cannot be
    replayed: that is an error, like a server dying mid-speech).
    """
    from engine.errors import InputError
    from engine.events import Notice
    from voiceapp.server.client import ServerGone

    player = None
    checked_later = sent is not None and not from_stdin
    try:
        if not args.out:
            check_device(args)  # fail on a missing device before loading a model
        remote = await connect_server(args, metrics.on_event, sent)
        sent = None
        if remote is not None:
            metrics.server_pid, metrics.server_started = remote.info.get("pid"), remote.started_server
            player = None if args.out else open_player(args, remote.sample_rate)
            try:
                return await speak_with(remote, req, from_stdin, args, metrics, player)
            except ServerGone as err:
                if err.audio_started or from_stdin:
                    raise
                metrics.on_event(Notice(f"{err}; speaking in-process instead"))
                metrics.server_pid, metrics.server_started = None, False
            finally:
                await remote.close()
        await speak_in_process(req, from_stdin, args, metrics, player)
    except InputError:
        if checked_later:  # the engine refused it: say why as the local check would have
            require_speakable(req.text, "the text")
        raise
    finally:
        if sent is not None:
            sent.cancel()
        if player is not None:
            player.close()


async def speak_in_process(req, from_stdin: bool, args: argparse.Namespace, metrics: SayMetrics, player) -> None:
    """Build the engine here and speak `req`, on `player` or on one opened once the model has loaded."""
    from engine.factory import build_synthesizer

    metrics.phases["launch"] = time.perf_counter() - process_start_perf()
    synth = build_synthesizer(engine_config(args, one_listener=True), events=metrics.on_event)
    own = player is None and not args.out
    if own:
        # Opened only now: while a model loads, the GIL-heavy import and load would starve the stream's
        # callback and ALSA would report underruns of the silence it plays.
        player = open_player(args, synth.sample_rate)
    try:
        await speak_with(synth, req, from_stdin, args, metrics, player)
    finally:
        await synth.close()
        if own:
            player.close()


async def speak_with(synth, req, from_stdin: bool, args: argparse.Namespace, metrics: SayMetrics,
                     player) -> None:
    """One request on `synth` (a Synthesizer or a RemoteSynthesizer): to the player, or to --out."""
    from voiceapp.cli.stdin_text import stdin_pieces

    stream = stdin_pieces() if from_stdin else None
    if player is None:
        from voiceapp.audio.wavout import write_wav

        await write_wav(synth.synthesize(req, stream), Path(args.out), synth.sample_rate, subtype="FLOAT")
        return
    player.mark_utterance_start()
    await synth.speak(req, player, stream)  # returns once the player has played everything
    if metrics.t0 is not None:
        metrics.played_s = time.perf_counter() - metrics.t0
    metrics.heard_at(player.last_onset_perf)
    metrics.underruns = player.underruns
    metrics.device_underruns = player.output_underflows


async def connect_server(args: argparse.Namespace, events, sent=None):
    """A RemoteSynthesizer on the server that `sent` went to, else on the running (or just started) server, or None
    (see `voiceapp.server.autostart.connect_or_start`)."""
    from voiceapp.server.autostart import connect_or_start
    from voiceapp.server.client import RemoteSynthesizer
    from voiceapp.server.rendezvous import server_disabled, socket_path

    if sent is not None:
        return await RemoteSynthesizer.adopt(sent, socket_path(args.socket), events)
    if server_disabled(args.no_server):
        return None
    return await connect_or_start(socket_path(args.socket), engine_config(args, one_listener=True), events)


def _device(args: argparse.Namespace) -> int | str | None:
    return int(args.device) if args.device and args.device.isdigit() else args.device


def check_device(args: argparse.Namespace) -> None:
    """Raise AudioDeviceError (suggesting --out) unless the output device exists and can play."""
    from engine.backends.sounddevice_sink import _device_error, import_sounddevice

    sd = import_sounddevice()
    try:
        sd.query_devices(_device(args), "output")
    except (sd.PortAudioError, ValueError) as err:
        raise _device_error("no usable audio output device", err) from err


def open_player(args: argparse.Namespace, sample_rate: int):
    """The speaker's Player for audio at `sample_rate` (the engine's: never assumed)."""
    from engine.backends.sounddevice_sink import Player

    return Player(sample_rate=sample_rate, device=_device(args), latency=args.latency, buffer_s=args.buffer)
