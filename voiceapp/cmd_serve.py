"""Provides `voicectl serve`: keep one engine warm and serve `say` (and other clients) over a Unix socket."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import replace

from voiceapp.common import add_engine_args, engine_config

WARMUP_TEXT = "Warming up."
WARMUP_TOKENS = 40
"""Enough to run every stage once (prompt, generation, a few decode windows) without a long render."""


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="keep the engine warm for `say` (Unix socket; stop with Ctrl-C or SIGTERM)")
    p.add_argument("--socket", metavar="PATH",
                   help="socket path (default: $VOICEAPP_SOCKET, else $XDG_RUNTIME_DIR/voiceapp/engine.sock, "
                        "else /tmp/voiceapp-$UID/engine.sock)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up request before listening")
    add_engine_args(p)
    p.set_defaults(run=run)


def serve_config(args: argparse.Namespace):
    """The engine config a server runs. It starts once and then carries many streams: every decoder graph gets
    timed cuDNN algorithms (~85 s more start-up on an H200, faster batched decode; docs/benchmarks.md, run 8) and
    the graph lane as many rows as the GPU holds (128 on an H200: a crowd stays on the lane, vLLM takes the
    rest)."""
    return replace(engine_config(args), decoder_autotune="all", lane_rows=None)


def run(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    from engine.factory import build_synthesizer
    from voiceapp.client import SOCKET_ENV, default_socket_path, socket_path
    from voiceapp.server import EngineServer, SocketLock, prepare_socket_dir

    path = socket_path(args.socket)
    private = path == default_socket_path({k: v for k, v in os.environ.items() if k != SOCKET_ENV})
    prepare_socket_dir(path, private)
    lock = SocketLock.acquire(path)  # before loading the model: a second server refuses at once
    try:
        synth = build_synthesizer(serve_config(args))
    except BaseException:
        lock.release()
        raise
    server = EngineServer(synth, path, lock=lock, private_dir=private)
    try:
        if not args.no_warmup:
            await warm_up(synth)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.start()
        hello = server.hello()
        model = hello["model"]["path"] if hello["model"] else "no model"
        print(f"voicectl serve: pid {hello['pid']}, {model}, backend {hello['backend']}, listening on {path}",
              file=sys.stderr, flush=True)
        await stop.wait()
        print("voicectl serve: stopping", file=sys.stderr, flush=True)
    finally:
        await server.close()


async def warm_up(synth) -> None:
    """One short request so the first client does not pay for lazy initialization (voice globals, kernels)."""
    from engine.config import SamplingOptions, SynthesisRequest

    await synth.render(SynthesisRequest(WARMUP_TEXT, options=SamplingOptions(seed=0, max_tokens=WARMUP_TOKENS)))
