"""`voicectl serve --ray` as a process, on a local Ray cluster with two CPU replicas of the fake engine: HTTP answers
the samples the plain engine gives, concurrent requests spread over both replicas, a replica killed mid-stream cuts
only its own stream (and Serve replaces it), a replica whose engine refuses hands its streams to the other and both
refusing is a 429 with Retry-After, a head that goes away stops the ingress with one line; no Ray, or a head nobody
answers at, is one line. The router's ranking and the ingress's admission and retry rules on their own, without
Ray's cluster."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import descendants, one_line_error, voicectl
from tests.server.conftest import wait_for

pytest.importorskip("ray", reason="the Ray tests need the extra: pip install 'voiceapp[ray]'")
# a local Ray cluster starts in each (seconds on 2 cores); one cluster at a time under xdist (the "ray" group):
# two would share its session folder and contend for the two cores while starting
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

TEXT = "The first one. And a second, a little longer."
LONG_TEXT = " ".join(f"Sentence number {i} goes on for a while." for i in range(40))
SEED, VOICE = 5, "mia"
REFUSING = Path(__file__).parent / "refusing"
"""The folder whose sitecustomize makes the fake engine of a listed process refuse (its docstring says how)."""


class RayServed:
    """`voicectl serve ENGINE --ray --replicas N --http 127.0.0.1:0` (the fake engine, two replicas of half a CPU
    by default), its stderr read as it comes; its engines refuse where `refuse` says (tests/server/refusing)."""

    def __init__(self, *engine: str, replicas: int = 2, cpus: float = 0.5) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vr-"))
        self.env = {**os.environ, "VOICEAPP_SOCKET": str(self.dir / "engine.sock"),
                    "XDG_CACHE_HOME": str(self.dir / "cache"), "XDG_DATA_HOME": str(self.dir / "data"),
                    "PYTHONPATH": os.pathsep.join([str(REFUSING), os.environ.get("PYTHONPATH", "")]),
                    "VOICEAPP_TEST_REFUSE": str(self.dir / "refuse")}
        self.proc = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "serve", *(engine or ("--backend", "fake")),
                                      "--ray", "--replicas", str(replicas), "--replica-cpus", str(cpus),
                                      "--http", "127.0.0.1:0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=self.env, text=True)
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        assert wait_for(lambda: any("listening on" in line for line in self.log) or self.proc.poll() is not None,
                        timeout=120), "".join(self.log)
        assert self.proc.poll() is None, "".join(self.log)
        self.port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", "".join(self.log)).group(1))

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def status(self) -> dict:
        import asyncio

        from voiceapp.server.client import server_status

        return asyncio.run(server_status(Path(self.env["VOICEAPP_SOCKET"])))

    def speech(self, text: str, status: int = 200) -> http.client.HTTPResponse:
        """A streamed pcm response at the engine's rate (float samples -> int16, as the API documents), of
        `status`."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        body = {"model": "tts-1", "voice": VOICE, "input": text, "response_format": "pcm", "sample_rate": 16000,
                "seed": SEED}
        conn.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == status, response.read()
        return response

    def refuse(self, *who: int | str) -> None:
        """The engines of the replicas of these pids refuse every stream ("all": every replica's); none: none."""
        (self.dir / "refuse").write_text(" ".join(map(str, who)))

    def replica_pids(self) -> list[int]:
        """The pids of the replicas running now (Ray names a replica's process after its class)."""
        return [pid for pid, command in descendants(self.proc.pid) if command.startswith("ray::ServeReplica")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # its local Ray cluster goes with it
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def served():
    server = RayServed()
    yield server
    server.stop()


def int16(samples: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(samples.astype(np.float64), -1, 1) * 32767).astype(np.int16)


def replicas(served: RayServed) -> dict[str, dict]:
    return {r["replica"]: r for r in served.status()["replicas"]}


def test_http_through_ray_gives_the_samples_the_plain_engine_gives(served, tmp_path):
    out = tmp_path / "ref.wav"
    proc = voicectl("say", TEXT, "--no-server", "--backend", "fake", "--voice", VOICE, "--seed", str(SEED),
                    "--out", str(out))
    assert proc.returncode == 0, proc.stderr.decode()
    import soundfile

    said, _ = soundfile.read(str(out), dtype="float32")
    got = np.frombuffer(served.speech(TEXT).read(), "<i2")
    assert len(said) > 16000 and np.array_equal(got, int16(said))
    status = served.status()
    assert status["ray"] is True and status["backend"] == "fake" and len(status["replicas"]) >= 1
    said_once = [line for line in served.log if "has no GPUs" in line]
    assert said_once == ["voicectl serve: the Ray cluster has no GPUs: the engine replicas run on CPUs\n"]


def test_streams_spread_over_both_replicas_and_a_killed_one_cuts_only_its_own(served):
    first = served.speech(LONG_TEXT)
    first.read(3200)  # under way
    assert wait_for(lambda: sum(r["live"] for r in replicas(served).values()) == 1, timeout=10)
    victim = next(r for r in replicas(served).values() if r["live"] == 1)
    second = served.speech(LONG_TEXT)
    second.read(3200)
    live = {name: r["live"] for name, r in replicas(served).items()}
    assert sorted(live.values())[-2:] == [1, 1], live  # one stream on each replica: the emptier one took it
    before = set(live)
    os.kill(victim["pid"], signal.SIGKILL)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        first.read()  # the chunked response ends without its last chunk: the client sees it was cut
    whole = second.read()
    assert len(whole) > 16000 * 2 * 10  # the other stream was spoken to its end (tens of seconds)
    assert wait_for(lambda: any("engine replica serving this request stopped" in line for line in served.log), 10)
    assert served.status()["lost_streams"] == 1

    def replaced() -> bool:  # Serve starts a new replica: a later request lands on a name not seen before
        served.speech(TEXT).read()
        return bool(set(replicas(served)) - before)

    assert wait_for(replaced, timeout=60, step=0.5), served.status()["replicas"]


def test_a_replica_whose_engine_refuses_hands_its_streams_to_the_other_and_both_refusing_is_a_429(served):
    """Each replica admits by its engine's deadlines (Synthesizer.admit, made to refuse here): the streams go to
    the one that admits, whichever the router offered them to first; with both refusing, the request is offered to
    each (the message names both) and is a 429 with Retry-After, and the next one is refused by the ingress at
    once (it heard both refuse just now); once they admit again, requests are served."""
    from voiceapp.cluster.serve import REPORT_FRESH_S

    pids = served.replica_pids()
    assert len(pids) == 2, descendants(served.proc.pid)
    refusing, other = pids
    served.refuse(refusing)
    streams = [served.speech(LONG_TEXT) for _ in range(2)]
    try:
        for stream in streams:
            assert len(stream.read(3200)) == 3200  # under way
        live = {r["pid"]: r["live"] for r in replicas(served).values()}
        assert live.get(other) == 2 and not live.get(refusing), live  # the emptier replica refused them both
    finally:
        for stream in streams:
            stream.close()

    served.refuse("all")
    busy = served.speech(TEXT, status=429)
    said = json.loads(busy.read())["error"]["message"]
    assert int(busy.getheader("Retry-After")) >= 1
    assert said.startswith("every engine replica asked refused the stream") and said.count("refuses") == 2, said
    again = served.speech(TEXT, status=429)  # within REPORT_FRESH_S of both refusals: the ingress refuses
    said = json.loads(again.read())["error"]["message"]
    assert int(again.getheader("Retry-After")) >= 1
    assert said.startswith("this server is at capacity (every engine replica refused a stream"), said
    assert served.status()["rerouted_streams"] >= 1

    served.refuse()
    time.sleep(REPORT_FRESH_S)  # the replicas' refusals no longer stand: the next request is offered to one
    assert len(served.speech(TEXT).read()) > 16000


def test_a_head_that_goes_away_stops_the_ingress_with_one_line(served):
    """The cluster's head (its GCS and raylet, which the ingress started for its local cluster) killed: the ingress
    says so, stops within its grace (well before Ray would end it abruptly, at 60 s) with one line and exit 1, its
    socket removed. The module's cluster ends here: the tests below need none."""
    from voiceapp.cluster.serve import HEAD_CHECK_S, HEAD_LOST_AFTER_S

    below = descendants(served.proc.pid)
    head = [pid for pid, command in below if command.split(" ")[0].endswith(("/gcs_server", "/raylet"))]
    assert len(head) == 2, below
    for pid in head:
        os.kill(pid, signal.SIGKILL)
    assert served.proc.wait(HEAD_LOST_AFTER_S + 3 * HEAD_CHECK_S + 10) == 1
    said = [line for line in served.log if line.startswith("voicectl: ")]
    assert len(said) == 1 and "the Ray head at" in said[0] and "has not answered" in said[0], served.log
    assert any("stopping in" in line for line in served.log) and not any("Traceback" in line for line in served.log)
    assert not Path(served.env["VOICEAPP_SOCKET"]).exists()


def test_ray_options_without_ray_or_an_unreachable_head_are_one_line(tmp_path):
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('no ray here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]),
           "VOICEAPP_SOCKET": str(tmp_path / "s.sock")}
    proc = voicectl("serve", "--backend", "fake", "--ray", env=env)
    assert proc.returncode == 2 and "pip install 'voiceapp[ray]'" in one_line_error(proc)
    with socket_nobody_listens_on() as port:
        proc = voicectl("serve", "--backend", "fake", "--ray", f"127.0.0.1:{port}",
                        env={"VOICEAPP_SOCKET": str(tmp_path / "s.sock")})
    assert proc.returncode == 1 and f"cannot reach the Ray head at 127.0.0.1:{port}" in one_line_error(proc)
    proc = voicectl("serve", "--backend", "fake", "--replicas", "2", env={"VOICEAPP_SOCKET": str(tmp_path / "s.sock")})
    assert proc.returncode == 2 and "--replicas is an option of --ray" in one_line_error(proc)


class socket_nobody_listens_on:
    """A loopback port bound but not listening: a connect there is refused at once."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def test_replicas_are_one_per_gpu_or_autoscaled_between_the_bounds():
    from engine.errors import InputError
    from voiceapp.cluster.serve import Scaling, check_scaling

    assert Scaling(gpus=2).options()["num_replicas"] == 2
    assert Scaling(gpus=2).options()["ray_actor_options"] == {"num_gpus": 1}
    assert Scaling(gpus=0, replicas=3, cpus=0.5).options()["ray_actor_options"] == {"num_cpus": 0.5}
    auto = Scaling(gpus=2, min_replicas=0, streams=32, idle_s=5).options()["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"], auto["initial_replicas"]) == (0, 2, 1)
    assert auto["target_ongoing_requests"] == 16 and auto["downscale_delay_s"] == 5
    gpu = Scaling(gpus=2, min_replicas=0, streams=256).options()
    assert gpu["max_ongoing_requests"] == 256 and gpu["autoscaling_config"]["target_ongoing_requests"] == 16
    assert Scaling(gpus=0, min_replicas=0, streams=8).options()["autoscaling_config"]["target_ongoing_requests"] == 4
    for bad, says in [(Scaling(gpus=1, min_replicas=3, max_replicas=2), "is more than --max-replicas"),
                      (Scaling(gpus=1, replicas=2, max_replicas=2), "--replicas is a fixed count")]:
        with pytest.raises(InputError, match=says):
            check_scaling(bad)


def test_the_router_ranks_replicas_by_the_share_of_their_capacity_in_use():
    from voiceapp.cluster.replica import load_share

    assert load_share({"live": 3, "capacity": 4}, None, 32) == 0.75
    assert load_share({"live": 3, "capacity": 4}, 1, 32) == 0.25  # the router's own count is fresher
    assert load_share({}, 2, 8) == 0.25  # before the first report: Serve's ceiling
    shares = {name: load_share(stats, None, 32) for name, stats in
              {"big lane": {"live": 8, "capacity": 64}, "small lane": {"live": 4, "capacity": 8}}.items()}
    assert min(shares, key=shares.get) == "big lane"  # more streams, yet more room

