"""Provides `voicectl serve --ray`: the engine as replicas on a Ray cluster (Ray Serve), one per GPU, served by this
process's front ends (the Unix socket, the HTTP API, Wyoming) through `RayEngine`, an engine.engine_api.Engine.

This process is the ingress: it keeps voiceapp's own servers and forwards each request to one replica for its life,
as one streaming call (`handle.options(stream=True)`); the replica is chosen by voiceapp.cluster.replica.CapacityRouter
(replicas that admit first, then the share of capacity in use, as each replica reports them). Each replica admits by
its engine's deadlines, as the plain server does: one that refuses a request (before any audio) gets it offered to
another, up to ROUTE_TRIES, and only then is the request refused (EngineBusy: HTTP's 429 with Retry-After); while
every replica refused within REPORT_FRESH_S, the ingress refuses at once (`RayEngine.admit`). Streamed text
(`say -`) reaches the replica as it arrives, through the ingress's text relay (voiceapp.cluster.relay). Closing a
request cancels its call, which aborts it on the replica. A replica that dies fails only the streams it carried
(GenerationError, one line) and Serve starts another. With autoscaling (`--min-replicas`, `--max-replicas`; 0
allowed), a request that arrives while no replica runs waits for one: the wait is logged and shown by status
(`cold_starts`).

Ray is an optional extra (`pip install 'voiceapp[ray]'`), imported only here and in voiceapp.cluster.replica.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterable, Sequence

from engine import errors
from engine.config import SynthesisRequest
from engine.deadlines import Verdict
from engine.errors import EngineBusy, GenerationError, InputError, VoiceError, one_line
from engine.types import AudioChunk
from engine.voices import Voice

RAY_EXTRA = "pip install 'voiceapp[ray]'"
APP_NAME = "voiceapp"
DEPLOYMENT_NAME = "voiceapp-engine"
REPLICA_STREAMS = 32
"""Default most streams one CPU replica takes at once (Serve's max_ongoing_requests); a replica reports its own
capacity below that, which the router ranks by."""
GPU_REPLICA_STREAMS = 256
"""The same for a GPU replica: a ceiling above what one GPU's engine admits by deadline (its crowd lane has up to
512 rows), so that its own admission refuses a stream, at once and with a reason, before Serve queues requests
for a full replica in the ingress, where they wait unanswered."""
AUTOSCALE_STREAMS = 16
"""Streams on each replica past which Serve's autoscaler adds one (half the ceiling where that is less): the next
replica loads (tens of seconds) while the others still have room. Far below what a GPU admits by deadline, so a
replica that refuses past its capacity never hides the need for another (the autoscaler counts admitted streams)."""
STATS_PERIOD_S = 1.0
"""How often Serve asks each replica for its live streams and capacity (the router's data between its own
counts)."""
HEALTH_PERIOD_S = 2.0
"""Serve's health checks: a replica whose process died is noticed within about this and replaced."""
COLD_START_S = 0.5
"""A request that waited longer than this for a replica that became ready after it was asked is a cold start."""
COLD_STARTS_KEPT = 16
"""Cold starts status lists (the latest)."""
CONSTRUCTOR_TRIES = 2
"""Times Serve tries to build a replica's engine before the deployment fails (Serve's default is 20)."""
CONNECT_TIMEOUT_S = 5.0
"""How long `connect` tries to reach a head's port before saying it cannot (ray.init itself retries for minutes)."""
REPORT_FRESH_S = 1.0
"""How long a replica's word that it does not admit another stream (its refusal, or its header saying so) stands
for the ingress's own admission (`RayEngine.admit`): within it, a request every replica would refuse is refused at
once, without a round trip to each; after it the replicas are asked again, so room that frees up is found within
this. One routing-stats period (STATS_PERIOD_S): by then the router has each replica's newer word too."""
ROUTE_TRIES = 3
"""Most replicas one request is offered to: the first the router picks, then others while each refuses it before
any audio (`retry_refusal`); bounded by the replicas known too, so a crowd past capacity costs a few round trips
per request, not one per replica of a large cluster."""
HEAD_CHECK_S = 2.0
"""How often the ingress checks that the cluster's head (its GCS port) still answers."""
HEAD_LOST_AFTER_S = 10.0
"""How long the head may not answer before the ingress stops with one line. Ray itself ends a process whose head
has not answered for 60 s, abruptly (its socket left behind, its clients cut without a word); stopping well before
closes the socket and ends each request with its line. A head back within it (Ray's GCS fault tolerance) is
waited for; the replicas' own processes go on serving meanwhile."""


def import_ray():
    """Ray, or one line naming the extra to install."""
    try:
        import ray
        from ray import serve  # noqa: F401 - the extra installs both
    except ImportError:
        raise InputError(f"--ray needs Ray, which is not installed here: {RAY_EXTRA}") from None
    return ray


def connect(address: str | None, log: Callable[[str], None], **init: Any) -> None:
    """Join the Ray cluster at `address` (HOST:PORT of a head, ray://HOST:PORT, or "auto": the one `ray start`
    started on this machine), or start a local one of this process's own (None); nothing where this process already
    joined one. An address nothing answers at is one line."""
    ray = import_ray()
    if ray.is_initialized():
        return
    if address not in (None, "auto"):
        check_reachable(address)
    try:
        # Ray's own INFO and WARNING lines would mix with voicectl's on stderr: its errors still show
        # "local": a new cluster of this process, never one a stale record of an earlier `ray start` points at
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, **init)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise errors.VoiceError(f"cannot join the Ray cluster at {address}: {one_line(err)}") from None
    where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
    resources = ray.cluster_resources()
    log(f"joined {where}: {int(resources.get('CPU', 0))} CPUs, {int(resources.get('GPU', 0))} GPUs")


def check_reachable(address: str) -> None:
    """One line unless something listens at `address`'s host and port (ray.init would retry for minutes)."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"--ray {address}: give the head's HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:10001 "
                         f"or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise errors.VoiceError(f"cannot reach the Ray head at {address}: {err.strerror or err}") from None


class HeadLost(errors.VoiceError):
    """The Ray cluster's head stopped answering: the ingress stops (`voicectl serve` exits with this line)."""


async def watch_head(log: Callable[[str], None], joined: str | None = None) -> None:
    """Return never while the cluster's head answers; raise HeadLost once it has not for HEAD_LOST_AFTER_S (a
    line in the log when it first does not, and when it is back). The head's GCS port is probed, or, where this
    process cannot tell it (a Ray Client connection), `joined`: the address it joined at."""
    address = head_address() or joined
    if address is None or address == "auto":
        await asyncio.Event().wait()  # nothing to probe: Ray's own end of the process stays the only one
        return
    loop = asyncio.get_running_loop()
    silent_since: float | None = None
    while True:
        await asyncio.sleep(HEAD_CHECK_S)
        try:
            await loop.run_in_executor(None, check_reachable, address)
        except errors.VoiceError as err:
            if silent_since is None:
                silent_since = time.monotonic()
                log(f"{err}; stopping in {HEAD_LOST_AFTER_S:g} s unless it answers again")
            elif time.monotonic() - silent_since >= HEAD_LOST_AFTER_S:
                raise HeadLost(f"the Ray head at {address} has not answered for {HEAD_LOST_AFTER_S:g} s: stopped "
                               f"(start voicectl serve --ray again once the cluster is back)") from None
            continue
        if silent_since is not None:
            log(f"the Ray head at {address} answers again")
            silent_since = None


def head_address() -> str | None:
    """HOST:PORT of the joined cluster's GCS, or None where this process cannot tell."""
    import ray

    try:
        return ray.get_runtime_context().gcs_address or None
    except Exception:  # noqa: BLE001 - a Ray Client connection has no GCS address of its own
        return None


@dataclass(frozen=True)
class Scaling:
    """How many replicas, on what: `--replicas`, `--min-replicas`, `--max-replicas` against the cluster's GPUs."""

    gpus: int
    """GPUs in the cluster: one replica each (0: CPU replicas)."""
    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    streams: int = REPLICA_STREAMS
    cpus: float = 1.0
    """CPUs each CPU replica holds (Ray's num_cpus)."""
    idle_s: float = 60.0
    """Autoscaling: how long replicas must have had less to do before one is removed (the last, with a minimum of
    0, included)."""

    def options(self) -> dict[str, Any]:
        """The deployment's options for serve.deployment: replicas (fixed, or autoscaled between the bounds) and
        what each holds (a GPU, or `cpus`)."""
        actor = {"num_gpus": 1} if self.gpus else {"num_cpus": self.cpus}
        opts: dict[str, Any] = {"ray_actor_options": actor, "max_ongoing_requests": self.streams,
                                "health_check_period_s": HEALTH_PERIOD_S,
                                # an engine that cannot load (a bad checkpoint, no memory) fails again: say so soon
                                "max_constructor_retry_count": CONSTRUCTOR_TRIES}
        if self.min_replicas is None and self.max_replicas is None:
            return {**opts, "num_replicas": self.replicas or self.gpus or 1}
        low = self.min_replicas if self.min_replicas is not None else 0
        high = self.max_replicas if self.max_replicas is not None else max(self.gpus, low, 1)
        return {**opts, "autoscaling_config": {
            "min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
            "target_ongoing_requests": max(1, min(self.streams // 2, AUTOSCALE_STREAMS)), "upscale_delay_s": 1.0,
            "downscale_delay_s": self.idle_s}}

    def describe(self) -> str:
        what = f"{'one GPU' if self.gpus else f'{self.cpus:g} CPUs'} each"
        if self.min_replicas is None and self.max_replicas is None:
            return f"{self.options()['num_replicas']} replicas, {what}"
        scale = self.options()["autoscaling_config"]
        return f"{scale['min_replicas']} to {scale['max_replicas']} replicas, {what}"


def check_scaling(scaling: Scaling) -> None:
    """The replica counts make sense (one line otherwise)."""
    for name in ("replicas", "min_replicas", "max_replicas"):
        value = getattr(scaling, name)
        if value is not None and value < (0 if name == "min_replicas" else 1):
            raise InputError(f"--{name.replace('_', '-')} {value}: must be at least "
                             f"{0 if name == 'min_replicas' else 1}")
    if (scaling.min_replicas is not None and scaling.max_replicas is not None
            and scaling.min_replicas > scaling.max_replicas):
        raise InputError(f"--min-replicas {scaling.min_replicas} is more than --max-replicas {scaling.max_replicas}")
    if scaling.replicas is not None and (scaling.min_replicas is not None or scaling.max_replicas is not None):
        raise InputError("--replicas is a fixed count; leave it out with --min-replicas/--max-replicas")
    if scaling.streams < 1:
        raise InputError(f"--replica-streams {scaling.streams}: must be at least 1")


def deploy(plan, scaling: Scaling, log: Callable[[str], None]):
    """Run the engine deployment (replacing one this cluster runs already) and wait until its first replicas
    answer. Returns its handle."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from voiceapp.cluster.replica import CapacityRouter, EngineReplica

    check_scaling(scaling)
    if not scaling.gpus:
        log("the Ray cluster has no GPUs: the engine replicas run on CPUs")
    serve.start(proxy_location="Disabled")  # this process is the ingress: no Serve HTTP proxy
    router = RequestRouterConfig(request_router_class=CapacityRouter, request_routing_stats_period_s=STATS_PERIOD_S)
    deployment = serve.deployment(name=DEPLOYMENT_NAME, request_router_config=router,
                                  **scaling.options())(EngineReplica)
    log(f"starting {scaling.describe()} on Ray Serve")
    try:
        return serve.run(deployment.bind(plan), name=APP_NAME, route_prefix=None)
    except Exception as err:  # noqa: BLE001 - Serve's own errors: a replica that could not build its engine
        raise errors.VoiceError(f"the engine replicas did not start: {one_line(err)} (their log: Ray's "
                                f"session folder, logs/serve)") from None


class ReplicaVoices:
    """The voices the replicas have (engine.engine_api.Voices), as the first replica listed them."""

    def __init__(self, voices: dict[str, Voice], default: str, presets: list[str]) -> None:
        self._voices, self.default, self._presets = dict(voices), default, tuple(presets)

    def all(self) -> dict[str, Voice]:
        return dict(self._voices)

    def presets(self) -> dict[str, Voice]:
        return {name: self._voices[name] for name in self._presets if name in self._voices}


@dataclass(frozen=True)
class AdmitReport:
    """A replica's latest word on whether it admits another stream, as the ingress heard it."""

    admits: bool
    reason: str
    """Why not (the replica's refusal); empty where it admits."""
    at: float
    """When the ingress heard it (time.monotonic)."""


class ReplicaRefused(EngineBusy):
    """One replica did not admit the request (before any audio): the ingress may offer it to another."""

    def __init__(self, replica: str, message: str) -> None:
        super().__init__(message)
        self.replica = replica


def fleet_verdict(reports: Iterable[AdmitReport], now: float, fresh_s: float = REPORT_FRESH_S) -> Verdict:
    """The ingress's admission: refused when the replicas heard from within `fresh_s` of `now` all said they do not
    admit (their reasons given); admitted otherwise, as when none was heard from within it, so a replica decides.
    A word older than `fresh_s` does not count either way: a replica that died, or that no request reached, says
    nothing. Each request ends served by a replica (its header says it admits) or refused by every replica it was
    offered to (`retry_refusal`), so the fresh words all say no only when recent requests found no room."""
    fresh = [r for r in reports if now - r.at <= fresh_s]
    if not fresh or any(r.admits for r in fresh):
        return Verdict(True)
    return Verdict(False, f"every engine replica refused a stream in the last {fresh_s:g} s: "
                          + "; ".join(r.reason for r in fresh))


def retry_refusal(audio_out: bool, refused_by: Sequence[str], known: int) -> bool:
    """Whether a request the replicas in `refused_by` refused (in order) is offered to another: never once any of
    its audio went out (the listener heard a voice; another replica would start over), nor once a replica refused
    it twice (the router had no other to offer: CapacityRouter ranks those that refused last); else while fewer
    than the bound refused it: the `known` replicas, at least two (a replica not heard from yet may be there), at
    most ROUTE_TRIES."""
    if audio_out or len(set(refused_by)) < len(refused_by):
        return False
    return len(refused_by) < min(ROUTE_TRIES, max(2, known))


class RayEngine:
    """engine.engine_api.Engine over the replicas of a Ray Serve deployment (the module's docstring)."""

    def __init__(self, handle: Any, info: dict[str, Any], log: Callable[[str], None], relay: Any = None) -> None:
        self.handle, self.log = handle, log
        self.relay = relay
        """The text relay streamed requests' text goes through (voiceapp.cluster.relay.TextRelay's actor)."""
        self.sample_rate: int = info["sample_rate"]
        self.voices = ReplicaVoices(info["voices"], info["default_voice"], info["preset_voices"])
        self._describe = dict(info["describe"])
        self.replicas: dict[str, dict[str, Any]] = {}
        """What each replica said in its latest header, by name."""
        self.cold_starts: list[dict[str, Any]] = []
        """The latest waits for a replica that started for the request: {"wait_s", "replica", "build_s"}."""
        self.lost = 0
        """Streams cut short by a replica that died."""
        self.carrying: dict[str, int] = {}
        """Streams this ingress has under way on each replica, by name."""
        self.reports: dict[str, AdmitReport] = {}
        """Each replica's latest word on admission, by name (`admit`)."""
        self.rerouted = 0
        """Requests a replica refused that were offered to another."""
        self._note(info)

    @classmethod
    async def start(cls, handle: Any, log: Callable[[str], None]) -> "RayEngine":
        """The engine over `handle`'s deployment, described by one of its replicas, with its text relay."""
        return cls(handle, await handle.info.remote(), log, start_relay())

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "ray": True}

    def admit(self) -> Verdict:
        """Refused only while the replicas' fresh words (REPORT_FRESH_S) all say they do not admit (`fleet_verdict`);
        else admitted, and the replica the router picks decides by its own engine's deadlines,
        which only it knows from moment to moment (`synthesize` offers a refused request to another). Refusing here
        spares a crowd past capacity a round trip to each replica per request, and lets the socket server's line
        (voiceapp.server.engine_server.AdmissionLine) hold requests instead of failing them; the word goes stale
        soon, so room that frees up on a replica is found by asking it."""
        return fleet_verdict(self.reports.values(), time.monotonic())

    def capacity(self) -> float | None:
        """The streams the replicas last said they carry, summed (None before any said)."""
        said = [r["capacity"] for r in self.replicas.values() if r.get("capacity") is not None]
        return sum(said) if said else None

    def status(self) -> dict[str, Any]:
        return {"devices": [], "replicas": [{**{k: v for k, v in r.items() if k not in ("voices", "describe")},
                                             "live": self.carrying.get(name, 0)}
                                            for name, r in self.replicas.items()],
                "cold_starts": list(self.cold_starts), "lost_streams": self.lost, "rerouted_streams": self.rerouted}

    async def synthesize(self, req: SynthesisRequest,
                         text_stream: AsyncIterable[str] | None = None) -> AsyncIterator[AudioChunk]:
        """The request's audio from one replica: a replica that does not admit it (before any audio) gets it offered
        to another (`retry_refusal`); refused by every one offered, it is EngineBusy. Streamed text follows the
        request's own through the relay as it arrives (voiceapp.cluster.relay), so the replica speaks each sentence
        once it is complete; a replica that refused took none of it, so the next one gets it all."""
        from voiceapp.cluster.relay import TextFeed, pump

        feed, feeding = None, None
        if text_stream is not None:  # its pieces go to the relay while the replica speaks
            feed = TextFeed(self.relay, uuid.uuid4().hex)
            feeding = asyncio.create_task(pump(feed, text_stream))
        refused: list[ReplicaRefused] = []
        try:
            while True:
                audio_out = False
                try:
                    avoid = tuple(r.replica for r in refused)
                    async with contextlib.aclosing(self._from_replica(req, feed, feeding, avoid)) as chunks:
                        async for chunk in chunks:
                            audio_out = True
                            yield chunk
                    return
                except ReplicaRefused as err:
                    refused.append(err)
                    if not retry_refusal(audio_out, [r.replica for r in refused], len(self.replicas)):
                        raise EngineBusy(refused_by_all(refused)) from None
                    self.rerouted += 1
        finally:
            if feed is not None and feeding is not None:
                stop_feeding(feed, feeding)

    async def _from_replica(self, req: SynthesisRequest, feed: Any, feeding: "asyncio.Task[None] | None",
                            avoid: tuple[str, ...]) -> AsyncGenerator[AudioChunk, None]:
        """The request's audio from the replica the router picks (those in `avoid` last); ReplicaRefused where it
        does not admit the request."""
        import ray
        from ray.serve.exceptions import BackPressureError

        asked, t0 = time.time(), time.monotonic()
        stream = self.handle.options(stream=True).synthesize.remote(req, feed, avoid=avoid)
        finished, replica, audio_out = False, None, False
        try:
            async for item in stream:
                if "replica" in item:
                    replica = item["replica"]["replica"]
                    self.carrying[replica] = self.carrying.get(replica, 0) + 1
                    self._note(item["replica"], asked, time.monotonic() - t0)
                elif "error" in item:
                    err = feeding_error(feeding) or engine_error(item["error"], item["message"])
                    if isinstance(err, EngineBusy) and replica is not None and not audio_out:
                        self.reports[replica] = AdmitReport(False, str(err), time.monotonic())
                        raise ReplicaRefused(replica, str(err))
                    raise err
                else:
                    audio_out = True
                    yield item["chunk"]
            finished = True
        except BackPressureError:  # every replica full and the handle's queue too
            raise EngineBusy("every engine replica carries as many streams as it takes; try again shortly") from None
        except ray.exceptions.RayError as err:  # the replica's process died, or the cluster went away
            self.lost += 1
            raise GenerationError(f"the engine replica serving this request stopped ({type(err).__name__}); "
                                  f"the audio so far is all there is (Ray Serve replaces a lost replica; a lost "
                                  f"Ray head needs this server restarted)") from None
        finally:
            if not finished:
                stream.cancel()
            if replica is not None:
                self.carrying[replica] -= 1

    def _note(self, info: dict[str, Any], asked: float | None = None, wait_s: float = 0.0) -> None:
        """Keep a replica's header and its word on admission; log a cold start (a replica that became ready after
        the request was asked)."""
        self.replicas[info["replica"]] = info
        admits = bool(info.get("admits", True))
        self.reports[info["replica"]] = AdmitReport(admits, "" if admits else f"replica {info['replica']} does not "
                                                                              f"admit another stream", time.monotonic())
        if asked is not None and info["ready_at"] > asked and wait_s > COLD_START_S:
            start = {"wait_s": round(wait_s, 3), "replica": info["replica"], "build_s": round(info["build_s"], 3)}
            self.cold_starts = (self.cold_starts + [start])[-COLD_STARTS_KEPT:]
            self.log(f"cold start: a request waited {wait_s:.1f} s for replica {info['replica']} to start "
                     f"(its engine loaded in {info['build_s']:.1f} s)")

    async def close(self) -> None:
        """End the text relay; the deployment stays on the cluster until `shutdown` (requests under way end with
        their streams)."""
        import ray

        if self.relay is not None:
            # before `shutdown`: while the relay lived, serve.delete waited for good (Ray 2.60, a local cluster)
            with contextlib.suppress(Exception):  # noqa: BLE001 - a cluster already gone took it with it
                ray.kill(self.relay)
            self.relay = None


def start_relay() -> Any:
    """The ingress's text relay: a Ray actor of this process (it ends with it), holding no CPU (it only passes
    text on)."""
    import ray

    from voiceapp.cluster.relay import TextRelay

    return ray.remote(TextRelay).options(num_cpus=0).remote()


def feeding_error(feeding: "asyncio.Task[None] | None") -> BaseException | None:
    """Why the streamed text stopped, where its pump failed (the error the request ends with), else None."""
    if feeding is None or not feeding.done() or feeding.cancelled():
        return None
    return feeding.exception()


def stop_feeding(feed: Any, feeding: "asyncio.Task[None]") -> None:
    """The request is over: stop its pump and drop its text from the relay (a replica still taking it returns)."""
    if not feeding.done():
        feeding.cancel()
    else:
        feeding_error(feeding)  # seen: a failure reported as the request's own is not logged again by asyncio
    feed.relay.drop.remote(feed.key)


def refused_by_all(refused: Sequence[ReplicaRefused]) -> str:
    """The EngineBusy message of a request every replica offered refused: each one's reason, once."""
    reasons = {r.replica: str(r) for r in refused}
    return f"every engine replica asked refused the stream: {'; '.join(reasons.values())}"


def engine_error(name: str, message: str) -> VoiceError:
    """The engine.errors class a replica named (VoiceError where it names none of them)."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, VoiceError):
        return cls(message)
    return VoiceError(message)


def shutdown() -> None:
    """Remove the deployment (its replicas end) and leave the cluster."""
    import ray
    from ray import serve

    try:
        serve.delete(APP_NAME)
    finally:
        ray.shutdown()
