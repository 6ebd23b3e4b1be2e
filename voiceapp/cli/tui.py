"""Provides `voicectl tui` (also what `voicectl` runs with no command): the Textual app."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from voiceapp.common import add_engine_args, add_server_args, engine_config


def add_parser(sub) -> None:
    p = sub.add_parser("tui", help="interactive player: type text, hear it, watch the metrics (the default)")
    p.add_argument("--voice", default="default", help="initial voice preset (see `voicectl voices`)")
    p.add_argument("--device", help="output device name or index (see `voicectl devices`)")
    p.add_argument("--latency", type=float, default=0.1, help="output stream latency in seconds (default 0.1)")
    p.add_argument("--out-dir", metavar="DIR", help="write each utterance as a WAV file in DIR instead of playing")
    add_server_args(p, "the TUI")
    add_engine_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from voiceapp.tui.app import VoiceApp

    app = VoiceApp(tui_options(args))
    app.run()
    return app.return_code or 0


def tui_options(args: argparse.Namespace):
    """What the app runs with: the engine flags, the output, and the server to use (and start if none runs)."""
    from voiceapp.server.autostart import server_disabled
    from voiceapp.server.client import socket_path
    from voiceapp.tui.bridge import TuiOptions

    out_dir = prepare_out_dir(Path(args.out_dir)) if args.out_dir else None
    device = int(args.device) if args.device and args.device.isdigit() else args.device
    # The fake backend is a demo/test engine: it never stands in for a real server, nor the reverse.
    server = None if server_disabled(args.no_server) or args.backend == "fake" else socket_path(args.socket)
    return TuiOptions(engine=engine_config(args, one_listener=True), voice=args.voice, device=device,
                      latency=args.latency, out_dir=out_dir, server_socket=server, start_server=server is not None)


def prepare_out_dir(path: Path) -> Path:
    """Create the WAV folder if needed; fail before the UI starts when it cannot be written."""
    from engine.errors import OutputError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"--out-dir {path}: {err.strerror or err}") from None
    if not os.access(path, os.W_OK):
        raise OutputError(f"--out-dir {path}: directory is not writable")
    return path
