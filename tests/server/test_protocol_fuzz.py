"""Protocol fuzzing (hypothesis, bounded): arbitrary bytes, frames that look valid, deep nesting and huge fields
sent to a live server. After all of them no descriptor is left open, no client lingers, and the server still
answers a real request."""
from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.protocol import HEADER, PROTOCOL_VERSION, encode_message, read_frame
from tests.server.conftest import wait_for
from tests.server.test_server import open_fds, still_serves

TYPES = ["hello", "say", "text", "end", "cancel", "status", "ping", "bogus"]
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
MESSAGES = st.builds(lambda kind, fields: {**fields, "type": kind}, st.sampled_from(TYPES),
                     st.dictionaries(st.sampled_from(["text", "voice", "seed", "options", "stream", "v", "x"]),
                                     JSON_VALUES, max_size=5))


def frame(payload: bytes, kind: bytes = b"J") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


INPUTS = st.one_of(
    st.binary(max_size=2048),
    st.lists(MESSAGES.map(lambda m: frame(json.dumps(m).encode())), min_size=1, max_size=4).map(b"".join),
    st.integers(1, 100_000).map(lambda n: frame(b"[" * n + b"]" * n)),
    st.integers(1, 200_000).map(lambda n: frame(json.dumps({"type": "say", "text": "a" * n}).encode())),
    st.tuples(st.sampled_from([b"J", b"A", b"X"]), st.binary(max_size=64)).map(lambda kp: frame(kp[1], kp[0])),
)


async def poke(path, data: bytes, idle_s: float = 0.1, most_s: float = 0.3) -> None:
    """Hello, then `data`; read what comes back until the server closes, stays quiet for `idle_s` or `most_s` have
    passed (a valid request may stream audio for long); then hang up mid-stream, as a killed client would."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    end = asyncio.get_running_loop().time() + most_s
    try:
        writer.write(encode_message({"type": "hello", "v": PROTOCOL_VERSION}) + data)
        await writer.drain()
        while asyncio.get_running_loop().time() < end:
            if await asyncio.wait_for(read_frame(reader), idle_s) is None:
                break
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


def test_fuzzed_input_leaks_nothing_and_the_server_still_serves(fake_server) -> None:
    assert asyncio.run(still_serves(fake_server.path))
    assert wait_for(lambda: fake_server.status()["clients"] == 0)
    before = open_fds()

    @settings(max_examples=100, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(data=INPUTS)
    def exchange(data: bytes) -> None:
        asyncio.run(poke(fake_server.path, data))

    exchange()
    assert wait_for(lambda: fake_server.status()["clients"] == 0, timeout=10), fake_server.status()
    assert wait_for(lambda: not fake_server.status()["streams"], timeout=10), fake_server.status()["streams"]
    assert wait_for(lambda: open_fds() <= before, timeout=10), (open_fds(), before)
    assert asyncio.run(still_serves(fake_server.path))
