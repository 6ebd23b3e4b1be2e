"""Provides `voicectl serve`: keep one engine warm and serve `say` (and other clients) over a Unix socket, with
--http the OpenAI-compatible speech API over HTTP (voiceapp.http.api), and with --wyoming Home Assistant's Wyoming
protocol (voiceapp.wyoming.api), all on the same engine."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

from voiceapp.common import add_engine_args, engine_config
from voiceapp.server.rendezvous import LOG_PREFIX

if TYPE_CHECKING:
    from engine.errors import VoiceError

RAY_ONLY = ("replicas", "min_replicas", "max_replicas", "replica_streams", "replica_cpus", "scale_down_after")
"""Options that only --ray takes."""
WARMUP_TEXT = "Warming up."
WARMUP_TOKENS = 40
"""Enough to run every stage once (prompt, generation, a few decode windows) without a long render."""


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="keep the engine warm for `say` and the TUI (Unix socket; stop with "
                                     "`voicectl stop`, Ctrl-C or SIGTERM)")
    p.add_argument("--socket", metavar="PATH",
                   help="socket path (default: $VOICEAPP_SOCKET, else $XDG_RUNTIME_DIR/voiceapp/engine.sock, "
                        "else /tmp/voiceapp-$UID/engine.sock)")
    p.add_argument("--idle-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="stop once no client has been connected for SECONDS (default 0: never; a server that "
                        "`say` or the TUI start gets $VOICEAPP_IDLE_TIMEOUT, else 600)")
    p.add_argument("--no-tune", action="store_true",
                   help="answer with the engine one listener gets and build nothing more (with --backend auto: "
                        "no lane sized for crowds, no vLLM)")
    p.add_argument("--auto-started", action="store_true", help=argparse.SUPPRESS)  # see first_config
    g = p.add_argument_group("HTTP API (OpenAI-compatible: POST /v1/audio/speech)")
    g.add_argument("--http", metavar="[HOST:]PORT",
                   help="also serve the speech API over HTTP (host 127.0.0.1 unless given; any address other "
                        "machines can reach needs an API key; port 0 picks a free one, the log says which)")
    g.add_argument("--api-key", metavar="KEY",
                   help="the key every HTTP request must carry (Authorization: Bearer KEY); default "
                        "$VOICEAPP_API_KEY, which keeps it out of the process list. Without one, loopback only")
    g.add_argument("--http-max-chars", type=int, default=4096, metavar="N",
                   help="characters of text per HTTP request (default 4096, as OpenAI's API)")
    g.add_argument("--http-max-streams", type=int, default=64, metavar="N",
                   help="HTTP speech requests served at once; more get 429 (default 64)")
    g.add_argument("--http-max-connections", type=int, default=256, metavar="N",
                   help="HTTP connections held at once, idle ones included; more get 503 (default 256, fewer "
                        "where the descriptor limit is low)")
    g.add_argument("--http-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long a client may take to send its request's head or body, or leave a response "
                        "unread, before its connection is closed (default 10)")
    g.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000; repeat for more, or * for any) call "
                        "the API from a browser; off by default")
    w = p.add_argument_group("Wyoming (Home Assistant)")
    w.add_argument("--wyoming", metavar="tcp://HOST:PORT",
                   help="also serve text to speech over the Wyoming protocol (e.g. tcp://0.0.0.0:10200; it has no "
                        "authentication: listen where only your Home Assistant reaches)")
    r = p.add_argument_group("Ray (engine replicas on a Ray cluster: pip install 'voiceapp[ray]'; docs/scale.md)")
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run the engine as Ray Serve replicas, one per GPU of the cluster at ADDRESS (a head's "
                        "HOST:PORT, ray://HOST:10001, or auto; none: a local cluster), behind this process's "
                        "socket, HTTP and Wyoming servers")
    r.add_argument("--replicas", type=int, metavar="N",
                   help="a fixed number of replicas (default: one per GPU; 1 on a cluster without GPUs)")
    r.add_argument("--min-replicas", type=int, metavar="N",
                   help="autoscale from N replicas (0: none while idle; the first request then waits for one)")
    r.add_argument("--max-replicas", type=int, metavar="N", help="autoscale up to N replicas (default: the GPUs)")
    r.add_argument("--replica-streams", type=int, metavar="N",
                   help="most streams one replica takes at once (default 256 on a GPU, 32 on CPUs; a replica "
                        "admits fewer while more would run late: requests go to the replica with the most room)")
    r.add_argument("--scale-down-after", type=float, metavar="SECONDS",
                   help="autoscaling: remove a replica once the others have had room to spare for SECONDS "
                        "(default 60)")
    r.add_argument("--replica-cpus", type=float, metavar="N",
                   help="CPUs a replica holds on a cluster without GPUs (default 1)")
    add_engine_args(p)
    p.set_defaults(run=run)


def serve_config(args: argparse.Namespace):
    """The engine a server tunes itself into (or builds before it answers, with a backend other than auto): it
    carries many streams, so every decoder graph gets timed cuDNN algorithms when built up front, and the graph lane
    as many rows as the GPU holds (a crowd stays on the lane; vLLM starts only behind a lane too small for one)."""
    return replace(engine_config(args), decoder_autotune="all", lane_rows=None)


def first_config(args: argparse.Namespace):
    """The engine a server answers with first. With --backend auto (and on a server `say` or the TUI started):
    the one they would build in-process, ready as soon; the crowd's parts follow in the background (`tunes`).
    With another backend: the crowd's engine, built before it answers."""
    return engine_config(args, one_listener=True) if args.auto_started or args.backend == "auto" else serve_config(args)


def tunes(args: argparse.Namespace) -> bool:
    """Whether this server builds the crowd's parts after it answers: an explicit `serve` on backend auto."""
    return args.backend == "auto" and not (args.auto_started or args.no_tune)


def run(args: argparse.Namespace) -> int:
    from engine.errors import InputError, VoiceError
    from voiceapp.server.autostart import unblock_stop_signals

    unblock_stop_signals()  # a parent's blocked or ignored SIGTERM would make `voicectl stop` wait in vain
    if args.idle_timeout < 0:
        raise InputError(f"--idle-timeout {args.idle_timeout:g}: must be 0 (never) or more seconds")
    if args.wyoming is not None:
        from voiceapp.wyoming.api import parse_uri

        parse_uri(args.wyoming)  # a bad address fails before anything starts
    if args.ray is not None:
        from voiceapp.cluster.serve import import_ray

        import_ray()  # no Ray: one line naming the extra, before anything starts
    elif any(getattr(args, name) is not None for name in RAY_ONLY):
        raise InputError(f"--{next(n for n in RAY_ONLY if getattr(args, n) is not None).replace('_', '-')} "
                         f"is an option of --ray")
    try:
        asyncio.run(serve(args, http_settings(args)))
    except VoiceError as err:
        if args.ray is not None and ray_head_lost(err):
            exit_now(err)
        raise
    return 0


def exit_now(err: VoiceError) -> NoReturn:
    """The command's line, then the end of the process at once: Ray's shutdown, ours and the one it runs at the
    interpreter's exit, waits for the lost head for tens of seconds. The socket is closed and every client was
    told by then."""
    print(f"voicectl: {err}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(err.exit_code)


def http_settings(args: argparse.Namespace):
    """--http and its options as voiceapp.http.rules.HttpSettings, checked before anything starts; None without
    --http."""
    from engine.errors import InputError
    from voiceapp.http.rules import API_KEY_ENV, HttpLimits, http_settings as settings

    if args.http is None:
        return None
    limits = HttpLimits(max_chars=args.http_max_chars, max_streams=args.http_max_streams,
                        max_connections=args.http_max_connections, timeout_s=args.http_timeout)
    key = args.api_key or os.environ.get(API_KEY_ENV)
    if key and not sendable_key(key):
        where = "--api-key" if args.api_key else API_KEY_ENV
        raise InputError(f"the API key from {where} must be printable ASCII without spaces (an Authorization "
                         f"header cannot carry anything else, so no client could use it)")
    return settings(args.http, key, limits, cors=args.cors)


def sendable_key(key: str) -> bool:
    """Whether a client can send `key` in `Authorization: Bearer KEY`: printable ASCII, no whitespace (HTTP
    header values are ASCII by practice, and the spaces around a value are stripped)."""
    return all("!" <= c <= "~" for c in key)


def log(line: str) -> None:
    """One line of the server's log (stderr; `voiceapp.server.autostart` relays these while a client waits)."""
    print(f"{LOG_PREFIX}{line}", file=sys.stderr, flush=True)


async def serve(args: argparse.Namespace, http=None) -> None:
    """`http`: the HTTP API's voiceapp.http.rules.HttpSettings (None: no HTTP API)."""
    from engine.factory import build_synthesizer
    from engine.tuning import server_tuning
    from voiceapp.server.client import is_default_location, socket_path
    from voiceapp.server.engine_server import EngineServer, LiveRequests, SocketLock, prepare_socket_dir

    first, crowd = first_config(args), serve_config(args)  # bad engine flags fail before the socket is touched
    path = socket_path(args.socket)
    private = is_default_location(path)
    prepare_socket_dir(path, private)
    lock = SocketLock.acquire(path)  # before loading the model: a second server refuses at once
    requests = LiveRequests(log)  # the engine's events: Notices (while it loads too) to the log, the rest to clients
    listener = wyoming_listener = None
    try:
        if http is not None:  # bound now: a port in use fails before the model loads
            from voiceapp.http.api import bind_listener

            listener = bind_listener(http.host, http.port)
        if getattr(args, "wyoming", None) is not None:
            from voiceapp.wyoming import api as wyoming_api

            wyoming_listener = wyoming_api.bind_listener(*wyoming_api.parse_uri(args.wyoming))
        if args.ray is not None:
            synth = await ray_engine(args, first, crowd)
        else:
            log(f"loading the engine ({describe_flags(args)})")
            synth = build_synthesizer(first, events=requests.route)
    except BaseException:
        for sock in (listener, wyoming_listener):
            if sock is not None:
                sock.close()
        lock.release()
        raise
    tuning = (server_tuning(synth, crowd, requests.route, crowd=tunes(args))
              if args.ray is None and not args.no_tune else None)
    server = EngineServer(synth, path, requests, lock=lock, private_dir=private, idle_timeout_s=args.idle_timeout,
                          auto_started=args.auto_started, tuning=tuning)
    if listener is not None:
        from voiceapp.http.api import HttpApi

        server.http = HttpApi(server, listener, api_key=http.api_key, limits=http.limits, cors=http.cors, log=log)
    wyoming = None
    if wyoming_listener is not None:
        from voiceapp.wyoming.api import WyomingApi

        wyoming = WyomingApi(server, wyoming_listener, log=log)
    background = None
    head_lost = False
    try:
        if not (args.no_warm_up or first.one_listener or args.ray is not None):  # one listener's: in the factory
            log("warming up")
            await warm_up(synth)
        if tuning is not None and tuning.steps:
            log("answering now; tuning in the background: " + ", ".join(step.name for step in tuning.steps))
            background = asyncio.create_task(tuning.run())
        await listen(server, wyoming, watch=ray_watch(args))
    except BaseException as err:
        head_lost = args.ray is not None and ray_head_lost(err)
        raise
    finally:
        if background is not None:
            background.cancel()
        if wyoming is not None:
            await wyoming.close()
        if server.http is not None:
            await server.http.close()
        await server.close()
        if args.ray is not None and not head_lost:  # a lost head: run() leaves the cluster as it is
            from voiceapp.cluster import serve as ray_serve

            ray_serve.shutdown()


def ray_watch(args: argparse.Namespace):
    """With --ray, what ends the server when the cluster's head goes away (voiceapp.cluster.serve.watch_head, to
    call); else None."""
    if args.ray is None:
        return None
    from functools import partial

    from voiceapp.cluster.serve import watch_head

    return partial(watch_head, log, args.ray or None)


def ray_head_lost(err: BaseException) -> bool:
    """Whether `err` is the cluster's head gone (voiceapp.cluster.serve.HeadLost)."""
    from voiceapp.cluster.serve import HeadLost

    return isinstance(err, HeadLost)


async def ray_engine(args: argparse.Namespace, first, crowd):
    """`--ray`: join (or start) the cluster, deploy the engine replicas, and the engine that forwards to them
    (voiceapp.cluster.serve). The blocking Ray calls run on a worker thread; the loop is this process's servers'."""
    import time

    from voiceapp.cluster import serve as ray_serve
    from voiceapp.cluster.replica import ReplicaPlan

    ray_serve.import_ray()  # one line naming the extra, before anything else
    if first.backend != "fake":  # a checkpoint that is not there is one line here, not replicas failing to load
        from engine.families import detect
        from engine.model import resolve_model_dir

        root = resolve_model_dir(first.model)
        detect(root).read(root)
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    await loop.run_in_executor(None, ray_serve.connect, args.ray or None, log)
    scaling = ray_scaling(args)
    plan = ReplicaPlan(first, crowd, tunes(args), scaling.streams, short_windows=not args.no_tune)
    log(f"deploying the engine ({describe_flags(args)})")
    handle = await loop.run_in_executor(None, ray_serve.deploy, plan, scaling, log)
    engine = await ray_serve.RayEngine.start(handle, log)
    log(f"replicas answering {time.monotonic() - t0:.1f} s after start (cold start of the first: joining Ray, "
        f"starting Serve and loading an engine)")
    return engine


def ray_scaling(args: argparse.Namespace):
    """--replicas, --min-replicas, --max-replicas, --replica-streams and --replica-cpus against the cluster."""
    import ray

    from voiceapp.cluster.serve import GPU_REPLICA_STREAMS, REPLICA_STREAMS, Scaling, check_scaling

    gpus = int(ray.cluster_resources().get("GPU", 0))
    scaling = Scaling(gpus=gpus, replicas=args.replicas,
                      min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                      streams=args.replica_streams or (GPU_REPLICA_STREAMS if gpus else REPLICA_STREAMS),
                      cpus=args.replica_cpus or 1.0,
                      idle_s=60.0 if args.scale_down_after is None else args.scale_down_after)
    check_scaling(scaling)
    return scaling


async def listen(server, wyoming=None, watch=None) -> None:
    """Serve until SIGTERM or SIGINT, or until the idle timeout passes with no client. `wyoming`: the Wyoming front
    end (voiceapp.wyoming.api.WyomingApi), started with the rest. `watch`: a coroutine function whose coroutine
    raises once the server must stop (--ray: the cluster's head went away); its error is raised here."""
    from voiceapp.server.autostart import idle_text

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    if server.http is not None:
        await server.http.start()
    if wyoming is not None:
        await wyoming.start()
    hello = server.hello()
    model = hello["model"]["path"] if hello["model"] else "no model"
    http = f" and {server.http.url}" if server.http is not None else ""
    http += f" and Wyoming {wyoming.uri}" if wyoming is not None else ""
    log(f"pid {hello['pid']}, {model}, backend {hello['backend']}, listening on {server.path}{http}")
    stopped, idle = asyncio.create_task(stop.wait()), asyncio.create_task(server.wait_idle())
    watched = asyncio.create_task(watch() if watch is not None else asyncio.Event().wait())
    await asyncio.wait({stopped, idle, watched}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopped, idle, watched):
        task.cancel()
    error = watched.exception() if watched.done() and not watched.cancelled() else None
    if error is not None:
        raise error  # the caller closes the server; the error is the command's line
    log(f"no client for {idle_text(server.idle_timeout_s)}: stopping" if not stop.is_set() else "stopping")


def describe_flags(args: argparse.Namespace) -> str:
    """The engine flags, for the log's first line."""
    model = "fake engine" if args.backend == "fake" else f"model {args.model or '(default)'}"
    return f"{model}, backend {args.backend}, compute {args.compute}"


async def warm_up(synth) -> None:
    """One short request so the first client does not pay for lazy initialization (voice globals, kernels)."""
    from engine.config import SamplingOptions, SynthesisRequest

    await synth.render(SynthesisRequest(WARMUP_TEXT, options=SamplingOptions(seed=0, max_tokens=WARMUP_TOKENS)))
