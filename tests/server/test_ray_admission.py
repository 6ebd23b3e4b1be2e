"""Admission on `voicectl serve --ray`'s replicas, without a Ray cluster: CapacityRouter's ranking (replicas that
admit first, those that refused the request last) and the ingress's rules (voiceapp.cluster.serve): when a refused
request is offered to another replica, and when the ingress refuses at once. The same on a local Ray cluster:
tests/server/test_ray_serve.py."""
from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the router is a Ray Serve class: pip install 'voiceapp[ray]'")


class Stats:
    """A replica as CapacityRouter sees it (RunningReplica's fields it reads)."""

    def __init__(self, name: str, stats: dict, ceiling: int = 32) -> None:
        from ray.serve._private.common import DeploymentID, ReplicaID

        self.replica_id = ReplicaID(name, DeploymentID("voiceapp-engine", "voiceapp"))
        self.routing_stats, self.max_ongoing_requests = stats, ceiling


def test_the_router_ranks_replicas_that_admit_first_and_those_that_refused_the_request_last():
    from voiceapp.cluster.replica import rank

    ranked = sorted({"full": rank({"admits": False}, 0.1, False), "busy": rank({"admits": True}, 0.9, False),
                     "quiet": rank({"admits": True}, 0.2, False), "new": rank({}, 0.5, False),
                     "refused it": rank({"admits": True}, 0.0, True)}.items(), key=lambda kv: kv[1])
    assert [name for name, _ in ranked] == ["quiet", "new", "busy", "full", "refused it"]


async def test_the_router_itself_orders_candidates_by_admission_then_share():
    from types import SimpleNamespace

    from voiceapp.cluster.replica import CapacityRouter

    router = CapacityRouter.__new__(CapacityRouter)  # its ranking alone: no Serve controller behind it
    router._replica_queue_len_cache = SimpleNamespace(get=lambda replica_id: None)
    candidates = [Stats("a", {"live": 1, "capacity": 8, "admits": False}), Stats("b", {"live": 6, "capacity": 8,
                  "admits": True}), Stats("c", {"live": 2, "capacity": 8, "admits": True})]
    request = SimpleNamespace(kwargs={"avoid": ("c",)}, routing_context=SimpleNamespace(should_backoff=False))
    order = await router.choose_replicas(candidates, request)
    assert [group[0].replica_id.unique_id for group in order] == ["b", "a", "c"]
    assert request.routing_context.should_backoff


def test_the_ingress_offers_a_refused_request_to_another_replica_only_before_audio_and_a_few_times():
    from voiceapp.cluster.serve import ROUTE_TRIES, retry_refusal

    assert retry_refusal(False, ["a"], known=2)  # refused before any audio: once more, on another
    assert not retry_refusal(False, ["a", "b"], known=2)  # each replica known refused it
    assert not retry_refusal(True, ["a"], known=2)  # audio went out: the listener heard it start
    assert retry_refusal(False, ["a"], known=1)  # a second replica may not have been heard from yet
    assert not retry_refusal(False, ["a", "a"], known=4)  # offered again to one that refused: no other there
    assert retry_refusal(False, ["a", "b"], known=8)
    assert not retry_refusal(False, [str(i) for i in range(ROUTE_TRIES)], known=8)  # at most ROUTE_TRIES


def test_the_ingress_refuses_at_once_only_while_every_fresh_word_is_no():
    from voiceapp.cluster.serve import REPORT_FRESH_S, AdmitReport, fleet_verdict

    now = 100.0
    no_a, no_b = AdmitReport(False, "replica a is at capacity (x)", now), AdmitReport(False, "replica b: y", now - 0.5)
    assert fleet_verdict([], now).admit  # nothing heard: a replica decides
    verdict = fleet_verdict([no_a, no_b], now)
    assert not verdict.admit and "replica a is at capacity (x)" in verdict.reason and "replica b: y" in verdict.reason
    assert fleet_verdict([no_a, AdmitReport(True, "", now - 0.2)], now).admit  # one admitted a stream just now
    stale_yes = AdmitReport(True, "", now - REPORT_FRESH_S - 1)  # a replica that died, or got nothing since
    assert not fleet_verdict([no_a, no_b, stale_yes], now).admit
    assert fleet_verdict([no_a, no_b], now + REPORT_FRESH_S + 0.1).admit  # stale: the replicas are asked again
