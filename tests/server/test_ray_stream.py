"""Streamed text through `voicectl serve --ray`, on a local Ray cluster with one CPU replica of the tiny checkpoint's
real engine: `say -` from a pipe kept open gets its first audio before its last line is written, the same samples
as the plain server gives; the text relay between ingress and replica (voiceapp.cluster.relay) on its own."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.conftest import same_audio, start_serve, wait_for
from tests.server.test_ray_serve import RayServed

pytest.importorskip("ray", reason="the Ray tests need the extra: pip install 'voiceapp[ray]'")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

LINES = [b"The first line is spoken at once.\n", b"And the last one comes a while later.\n"]
SEED = "3"


def engine(model: Path) -> list[str]:
    """The tiny checkpoint on one torch thread (a Ray replica of one CPU has one: the same samples need the same)."""
    return ["--model", str(model), "--backend", "torch", "--threads", "1"]


def say_args(model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "voiceapp.cli", "say", "-", *engine(model), "--seed", SEED, "--max-tokens", "120",
            "--voice", "mia", "--out", str(out)]


@pytest.fixture(scope="module")
def served(tiny_model):
    server = RayServed(*engine(tiny_model), "--no-tune", replicas=1, cpus=1)
    yield server
    server.stop()


def live_audio_s(socket: str) -> float:
    """Seconds of audio the server at `socket` has sent its one live stream so far (0 with none)."""
    from voiceapp.server.client import server_status

    streams = asyncio.run(server_status(Path(socket)))["streams"]
    return streams[0]["audio_s"] if streams else 0.0


def say_from_a_held_pipe(model: Path, out: Path, env: dict[str, str]) -> str:
    """`say -` writing LINES[0], then, once the server has sent audio, the last line; its stderr. The audio must
    come while the pipe is still open: from the first line alone."""
    proc = subprocess.Popen(say_args(model, out), stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(LINES[0])
    proc.stdin.flush()
    try:
        assert wait_for(lambda: live_audio_s(env["VOICEAPP_SOCKET"]) > 0, timeout=30, step=0.05), \
            "no audio came while the pipe was open"
        proc.stdin.write(LINES[1])
    finally:
        proc.stdin.close()
    assert proc.wait(60) == 0, proc.stderr.read().decode()
    return proc.stderr.read().decode()


@pytest.mark.slow  # a local Ray cluster starts (seconds on 2 cores)
def test_say_stdin_through_ray_speaks_before_the_pipe_closes_and_as_the_plain_server(served, tiny_model, tmp_path):
    ray_env = {**served.env, "VOICEAPP_NO_SERVER": "0"}  # the fixture's env predates the server tests' opt-in
    err = say_from_a_held_pipe(tiny_model, tmp_path / "ray.wav", ray_env)
    assert served.status()["served"] >= 1 and "LLM on the CPU" not in err  # spoken by the replica, not in-process

    # the plain server, its text arriving the same way (a sentence that comes after the first one's audio
    # started joins it differently from text that came all at once, on either server)
    plain_env = {**ray_env, "VOICEAPP_SOCKET": str(tmp_path / "plain.sock")}
    plain = start_serve(*engine(tiny_model), "--no-tune", env=plain_env)
    try:
        say_from_a_held_pipe(tiny_model, tmp_path / "plain.wav", plain_env)
    finally:
        plain.terminate()
        plain.wait(30)
    assert same_audio(tmp_path / "ray.wav", tmp_path / "plain.wav")


def relay_run(*steps, limit: int = 10):
    """Run the coroutines made by `steps` (functions of a fresh TextRelay holding `limit` characters a key) on one
    loop; their results."""
    from voiceapp.cluster.relay import TextRelay

    async def run():
        relay = TextRelay(limit=limit)
        return await asyncio.gather(*(step(relay) for step in steps))

    return asyncio.run(asyncio.wait_for(run(), 5))


def test_the_relay_hands_over_pieces_in_order_whichever_side_comes_first():
    from voiceapp.cluster.relay import END, OPEN

    async def taker(relay):
        first = await relay.take("k")  # before any put: waits
        second = await relay.take("k")  # what came meanwhile, at once
        return first, second, relay.keys()

    async def putter(relay):
        await asyncio.sleep(0.01)
        await relay.put("k", "One. ")
        await asyncio.sleep(0.01)
        return [await relay.put("k", piece) for piece in ("Two. ", "Three.", None)]

    (first, second, left), accepted = relay_run(taker, putter, limit=100)
    assert first == ("One. ", OPEN) and second == ("Two. Three.", END) and left == 0  # the key went with its end
    assert accepted == [True, True, True]


def test_the_relay_makes_a_fast_writer_wait_and_a_drop_frees_both_sides():
    from voiceapp.cluster.relay import GONE

    async def writer(relay):
        await relay.put("k", "0123456789")  # the limit: the next put waits for a take
        t0 = time.monotonic()
        assert await relay.put("k", "more")
        return time.monotonic() - t0

    async def reader(relay):
        await asyncio.sleep(0.2)
        return await relay.take("k")

    waited, taken = relay_run(writer, reader)
    assert waited >= 0.15 and taken == ("0123456789", "open")

    async def stuck_taker(relay):
        return await relay.take("gone")

    async def stuck_writer(relay):
        await relay.put("gone", "0123456789")
        return await relay.put("gone", "waits for room")

    async def dropper(relay):
        await asyncio.sleep(0.05)
        relay.drop("gone")
        return relay.keys()

    async def both_stuck(relay):  # a writer waiting for room and no reader: the drop frees it
        return await asyncio.gather(stuck_writer(relay), dropper(relay))

    [(freed, keys)] = relay_run(both_stuck)
    assert freed is False and keys == 0

    async def reader_then_drop(relay):
        return await asyncio.gather(stuck_taker(relay), dropper(relay))

    [(taken, keys)] = relay_run(reader_then_drop)
    assert taken == ("", GONE) and keys == 0


class LocalActor:
    """A TextRelay called as its Ray actor handle is (`handle.method.remote(...)`), in this process."""

    def __init__(self, relay) -> None:
        self.relay = relay

    def __getattr__(self, name: str):
        method = getattr(self.relay, name)
        return type("Method", (), {"remote": staticmethod(method)})


def test_a_text_stream_that_fails_ends_the_replicas_text_and_the_pump_raises_its_error():
    from engine.errors import InputError
    from voiceapp.cluster.relay import TextFeed, TextRelay, pump, relayed_text

    async def failing():
        yield "One. "
        raise ValueError("stdin broke")

    async def run():
        feed = TextFeed(LocalActor(TextRelay()), "k")
        taken: list[str] = []

        async def replica():
            with pytest.raises(InputError, match="ended before its end"):
                async for piece in relayed_text(feed):
                    taken.append(piece)

        with pytest.raises(ValueError, match="stdin broke"):  # the pump fails before the replica's first take,
            await asyncio.gather(pump(feed, failing()), replica())  # which must not wait for good
        await asyncio.sleep(0.05)  # the replica's side ends too
        return taken, feed.relay.relay.keys()

    taken, keys = asyncio.run(asyncio.wait_for(run(), 5))
    assert taken in ([], ["One. "]) and keys == 0  # what was put before the failure may go with the drop
