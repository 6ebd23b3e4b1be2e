"""Provides what runs inside a Ray cluster for `voicectl serve --ray` (voiceapp.cluster.serve): `EngineReplica`, the Ray
Serve deployment's class (one engine on the GPU Ray gives its process, or on CPUs), and `CapacityRouter`, the
deployment's request router (replicas that admit another stream first, then the one with the most room, by the
streams, capacity and admission each replica reports). Imports Ray, so it is imported only once Ray is known to be
installed.

A request's stream from a replica is a header ({"replica": its info, with "admits": whether it takes this request}),
then {"chunk": AudioChunk} items, or one {"error": class name, "message"} item: an engine error crosses as data and
becomes the same engine.errors class on the other side, never a Ray traceback. A replica that does not admit the
request (`EngineReplica.verdict`) sends the header and an EngineBusy item, before any audio: the ingress asks
another replica (voiceapp.cluster.serve)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from ray import serve
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from engine.config import EngineConfig, SynthesisRequest
from engine.deadlines import Verdict
from engine.errors import VoiceError, one_line
from engine.events import Event, Notice
from voiceapp.cluster.relay import TextFeed, relayed_text

LOG = logging.getLogger("voiceapp.replica")


@dataclass(frozen=True)
class ReplicaPlan:
    """What every replica builds (`voicectl serve --ray`'s engine flags), sent to each replica."""

    first: EngineConfig
    """The engine a replica answers with (cmd_serve.first_config)."""
    crowd: EngineConfig
    """The engine it tunes itself into in the background where `tune` (cmd_serve.serve_config)."""
    tune: bool
    """Build the crowd's parts after the first request (cmd_serve.tunes)."""
    streams: int
    """Most streams a replica takes at once (Serve's max_ongoing_requests); its own capacity may be less."""
    short_windows: bool = True
    """Where it does not `tune`: capture the short sentences' window graphs after the first request
    (engine.tuning short_window_tuning; not with --no-tune)."""


class EngineReplica:
    """One engine (engine.pipeline.Synthesizer) served as a Ray Serve replica."""

    def __init__(self, plan: ReplicaPlan) -> None:
        from engine.factory import build_synthesizer

        t0 = time.monotonic()
        self.plan = plan
        self.synth = build_synthesizer(plan.first, events=self._event)
        self.build_s = time.monotonic() - t0
        """Seconds its engine took to load (its share of a cold start)."""
        self.ready_at = time.time()
        """When it could take its first request (wall clock: compared with the ingress's)."""
        self.live = 0
        self.served = 0
        self.tuning_task: asyncio.Task | None = None
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id if context is not None else f"pid{os.getpid()}"

    def _event(self, event: Event) -> None:
        """The engine's notices go to the replica's log (Ray keeps it); request events stay here."""
        if isinstance(event, Notice):
            LOG.warning("%s", event.message)

    def capacity(self) -> int:
        """Streams this replica keeps in real time: its graph lane's rows where it has one (they grow when the
        tuned lane is swapped in), else the CPU LLM's rows; never more than the deployment's ceiling, never less
        than one. The fake engine takes the ceiling."""
        from engine.cpu_pools import CPU_LLM_ROWS
        from engine.factory import lane_rows

        if self.synth.model_info is None:
            return self.plan.streams
        rows = lane_rows(self.synth.generator)
        own = rows if rows else CPU_LLM_ROWS if all(d == "cpu" for d in self.synth.devices) else self.plan.streams
        return max(1, min(own, self.plan.streams))

    def verdict(self) -> Verdict:
        """Whether this replica takes one more stream now: below its capacity (its lane's rows) and admitted by its
        engine's deadlines (Synthesizer.admit: no live stream pushed into an underrun), as the plain server
        admits. Serve's max_ongoing_requests is only a ceiling; this is what keeps each stream in real time."""
        if self.live >= self.capacity():
            return Verdict(False, f"{self.live} streams live, the most it takes at once")
        return self.synth.admit()

    def info(self, verdict: Verdict | None = None) -> dict[str, Any]:
        """What the ingress learns from every stream's header (and at start-up); "admits": `verdict`, where the
        request's own was decided, else now's."""
        admits = (verdict or self.verdict()).admit
        return {"replica": self.name, "pid": os.getpid(), "node": os.uname().nodename, "live": self.live,
                "capacity": self.capacity(), "admits": admits, "served": self.served, "build_s": self.build_s,
                "ready_at": self.ready_at, "sample_rate": self.synth.sample_rate,
                "voices": self.synth.voices.all(), "default_voice": self.synth.voices.default,
                "preset_voices": list(self.synth.voices.presets()), "describe": self.synth.describe(),
                **self.synth.status()}

    def record_routing_stats(self) -> dict[str, Any]:
        """What CapacityRouter ranks replicas by (Serve polls it every request_routing_stats_period_s): its live
        streams, its capacity, and whether it admits one more now (`verdict`)."""
        return {"live": self.live, "capacity": self.capacity(), "admits": self.verdict().admit}

    async def synthesize(self, req: SynthesisRequest, feed: TextFeed | None = None,
                         avoid: tuple[str, ...] = ()) -> AsyncIterator[dict[str, Any]]:
        """The request's stream (the module's docstring says its items); `feed`: where its streamed text comes
        from, as it arrives (voiceapp.cluster.relay); `avoid`: the replicas that refused it already (read by
        CapacityRouter, not here)."""
        verdict = self.verdict()
        yield {"replica": {k: v for k, v in self.info(verdict).items() if k != "voices"}}
        if not verdict.admit:
            yield {"error": "EngineBusy", "message": refusal(self.name, verdict)}
            return
        self.live += 1  # before anything else: the router ranks replicas by what they report live
        try:
            self._tune_once()
            text = None if feed is None else relayed_text(feed)
            async with aclosing(self.synth.synthesize(req, text)) as chunks:
                async for chunk in chunks:
                    yield {"chunk": dataclasses.replace(chunk, made_at=None)}  # another process's clock
            self.served += 1
        except VoiceError as err:
            yield {"error": type(err).__name__, "message": str(err)}
        finally:
            self.live -= 1

    def _tune_once(self) -> None:
        """Start the background tuning (engine.tuning) with the first request, on the replica's event loop."""
        if not (self.plan.tune or self.plan.short_windows) or self.tuning_task is not None:
            return
        from engine.tuning import server_tuning

        tuning = server_tuning(self.synth, self.plan.crowd, self._event, crowd=self.plan.tune)
        self.tuning_task = asyncio.get_running_loop().create_task(tuning.run())

    async def check_health(self) -> None:
        """Serve's health check: a failed background step is a notice, not ill health; the engine answers."""
        if self.tuning_task is not None and self.tuning_task.done() and not self.tuning_task.cancelled():
            err = self.tuning_task.exception()
            if err is not None:
                LOG.warning("tuning failed: %s", one_line(err))


def refusal(replica: str, verdict: Verdict) -> str:
    """The EngineBusy message of a replica that does not admit a stream: the verdict's reason, worded as the plain
    server's 429 words it (voiceapp.http.api)."""
    return f"replica {replica} is at capacity ({verdict.reason})"


class CapacityRouter(FIFOMixin, RequestRouter):
    """Ranks replicas that admit another stream (as each last reported: `record_routing_stats`; a replica that has
    not reported yet counts as admitting) before those that do not, and the replicas the request names in `avoid`
    (they refused it already: voiceapp.cluster.serve) last of all; within each group by the share of their capacity
    in use (fewest first; ties at random): the streams each reported or, fresher, the router's own count of what it
    sent, over the capacity it reported (Serve's max_ongoing_requests before its first report). Serve then sends
    the request to the first replica of the ranking that is not full."""

    def initialize_state(self, **kwargs: Any) -> None:
        pass

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> Sequence[list[RunningReplica]]:
        avoid: tuple[str, ...] = ()
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # no tight loop while every replica is full
            avoid = tuple(pending_request.kwargs.get("avoid", ()))
        return [[replica] for replica in sorted(candidate_replicas, key=lambda r: self._rank(r, avoid))]

    def _rank(self, replica: RunningReplica, avoid: tuple[str, ...]) -> tuple[bool, bool, float, float]:
        stats = replica.routing_stats or {}
        sent = self.replica_queue_len_cache.get(replica.replica_id)
        share = load_share(stats, sent, replica.max_ongoing_requests)
        return (*rank(stats, share, replica.replica_id.unique_id in avoid), random.random())


def load_share(stats: dict[str, Any], sent: int | None, ceiling: int) -> float:
    """The share of a replica's capacity in use: its live streams (what the router sent, where it knows, else what
    the replica reported) over its capacity (as reported, else `ceiling`)."""
    capacity = max(1, int(stats.get("capacity") or ceiling))
    live = sent if sent is not None else int(stats.get("live", 0))
    return live / capacity


def rank(stats: dict[str, Any], share: float, avoided: bool) -> tuple[bool, bool, float]:
    """A replica's place in CapacityRouter's ranking, smallest first: not avoided by the request, then admitting
    (as it last reported; unknown counts as admitting), then the share of its capacity in use (`load_share`)."""
    return avoided, not stats.get("admits", True), share
