"""The HTTP API cannot be held or driven by others (issue 41): idle, slowloris and never-reading connections under a
low descriptor limit leave the server answering (HTTP and its Unix socket) and leak nothing; a loopback server
checks the Host header and wants JSON; the voice listing names no file path; pipelined requests are all answered;
the body limit counts characters; fuzzed requests leave it healthy."""
import asyncio
import json
import os
import resource
import socket
import time
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.server.test_http_serve import Served
from tests.server.conftest import wait_for
from voiceapp.server.client import server_status

FD_LIMIT = 128
TIMEOUT_S = 1.0
"""--http-timeout for these servers: the deadlines pass within the test."""


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Limited(Served):
    """A server started under a descriptor limit of FD_LIMIT, with --http-timeout TIMEOUT_S."""

    def __init__(self, *args: str) -> None:
        super().__init__("--http-timeout", str(TIMEOUT_S), *args, preexec_fn=lower_descriptor_limit)


def lower_descriptor_limit() -> None:
    """In the server's process, before it runs: at most FD_LIMIT open descriptors."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.fixture(scope="module")
def limited():
    server = Limited("--backend", "fake")
    yield server
    server.stop()


def address(served) -> tuple[str, int]:
    url = urllib.parse.urlsplit(served.url)
    return url.hostname, url.port


def exchange(served, data: bytes, timeout: float = 5.0, shut: bool = False) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it (or `timeout` passes)."""
    with socket.create_connection(address(served), timeout=timeout) as conn:
        conn.sendall(data)
        if shut:
            conn.shutdown(socket.SHUT_WR)
        got = b""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                piece = conn.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not piece:
                break
            got += piece
        return got


def request(served, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    host, port = address(served)
    head = {"Host": f"{host}:{port}", "Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items() if v is not None)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def health_within(served, seconds: float) -> bool:
    start = time.monotonic()
    got = exchange(served, request(served, "GET", "/health"), timeout=seconds)
    return status_of(got) == 200 and time.monotonic() - start <= seconds


def socket_answers_within(served, seconds: float) -> bool:
    async def ask():
        return await asyncio.wait_for(server_status(Path(served.env["VOICEAPP_SOCKET"])), seconds)
    return asyncio.run(ask())["pid"] == served.proc.pid


# ---- held connections --------------------------------------------------------------------------------------

def test_idle_slowloris_and_never_reading_clients_do_not_hold_the_server(limited):
    pid = limited.proc.pid
    assert health_within(limited, 1.0)
    before = descriptors(pid)
    host, port = address(limited)
    slow = []
    for _ in range(10):
        conn = socket.create_connection((host, port), timeout=5)
        conn.sendall(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n".encode())  # a head never finished
        slow.append(conn)
    readers = []
    body = json.dumps({"input": "Sentence number one goes on for a while. " * 90, "voice": "alloy",
                       "response_format": "pcm", "sample_rate": 48000}).encode()
    for _ in range(3):
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.connect((host, port))
        conn.sendall(request(limited, "POST", "/v1/audio/speech", body, {"Content-Type": "application/json"}))
        readers.append(conn)  # never read
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(3 * FD_LIMIT // 2)]  # past the cap
    try:
        assert socket_answers_within(limited, 1.0)  # the Unix socket answers while HTTP is flooded
        assert health_within(limited, 1.0)  # and so does HTTP: the silent connections made room
        assert descriptors(pid) < FD_LIMIT - 8
        for _ in range(2):  # a byte now and then does not keep a head alive past the deadline
            for conn in slow:
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass  # already closed
            time.sleep(TIMEOUT_S * 0.6)
        assert wait_for(lambda: limited.http()["live"] == 0, timeout=TIMEOUT_S * 6)  # never-reading: cut
        assert health_within(limited, 1.0) and socket_answers_within(limited, 1.0)
        for conn in slow:  # the server closed them
            conn.settimeout(2)
            try:
                rest = conn.recv(65536)
            except (ConnectionResetError, socket.timeout):
                rest = b""
            assert b"200 OK" not in rest
        http = limited.http()
        assert http["evicted_connections"] > 0 and http["cancelled"] >= 3
    finally:
        for conn in idle + slow + readers:
            conn.close()
    assert wait_for(lambda: descriptors(pid) <= before, timeout=5), (descriptors(pid), before)
    assert health_within(limited, 1.0) and socket_answers_within(limited, 1.0)


def test_a_trickled_body_gets_a_408_and_an_idle_connection_is_closed(limited):
    host, port = address(limited)
    with socket.create_connection((host, port), timeout=5) as conn:
        head = request(limited, "POST", "/v1/audio/speech", headers={"Content-Type": "application/json",
                                                                     "Content-Length": "1000"})
        conn.sendall(head + b'{"input": ')
        start = time.monotonic()
        got = conn.recv(65536)
        assert status_of(got) == 408 and time.monotonic() - start < TIMEOUT_S + 2
    with socket.create_connection((host, port), timeout=5) as conn:
        start = time.monotonic()
        assert conn.recv(1) == b"" and time.monotonic() - start < TIMEOUT_S + 2  # nothing sent: closed


# ---- who may ask -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    server = Served("--backend", "fake")
    yield server
    server.stop()


SPEECH = json.dumps({"input": "Hi.", "voice": "alloy", "response_format": "wav"}).encode()


@pytest.mark.parametrize("host, status", [
    ("evil.example:{port}", 403), ("127.0.0.1.nip.io:{port}", 403), ("127.0.0.1", 403), ("127.0.0.1:1", 403),
    ("localhost:{port}", 200), ("127.0.0.1:{port}", 200), ("LOCALHOST:{port}", 200),
])
def test_a_loopback_server_answers_only_its_own_host_names(served, host, status):
    port = address(served)[1]
    got = exchange(served, request(served, "GET", "/v1/models", headers={"Host": host.format(port=port)}))
    assert status_of(got) == status
    if status == 403:
        assert b'"host_not_allowed"' in got


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_a_post_must_say_its_body_is_json(served, content_type):
    got = exchange(served, request(served, "POST", "/v1/audio/speech", SPEECH, {"Content-Type": content_type}))
    assert status_of(got) == 415 and b'"unsupported_media_type"' in got
    ok = exchange(served, request(served, "POST", "/v1/audio/speech", SPEECH,
                                  {"Content-Type": "application/json; charset=utf-8"}))
    assert status_of(ok) == 200


def test_the_voice_listing_names_no_file_path(served):
    voices = Path(served.env["XDG_DATA_HOME"]) / "voiceapp" / "voices"
    voices.mkdir(parents=True, exist_ok=True)
    (voices / "clone.toml").write_text('name = "clone"\ndescription = "cloned from /home/ada/private/ref.wav"\n'
                                       'gender = "female"\n', encoding="utf-8")
    got = exchange(served, request(served, "GET", "/v1/audio/voices"))
    body = json.loads(got.split(b"\r\n\r\n", 1)[1])
    clone = next(v for v in body["voices"] if v["id"] == "clone")
    assert clone["description"] == "cloned from ref.wav" and b"/home/" not in got


# ---- requests the way clients may send them ----------------------------------------------------------------

@pytest.mark.parametrize("half_close", [False, True], ids=["open", "half-closed"])
def test_pipelined_requests_are_all_answered_in_order(served, half_close):
    """half-closed: the client shuts its side once the requests are out, as `printf ... | nc` does (uvicorn closed
    the connection at that end of the data, and every answer after the first JSON one was lost)."""
    keep = {"Connection": None}
    bad = json.dumps({"input": "Hi.", "voice": "nobody"}).encode()
    requests = [request(served, "GET", "/health", headers=keep),
                request(served, "POST", "/v1/audio/speech", bad, {"Content-Type": "application/json", **keep}),
                request(served, "GET", "/v1/models", headers=keep),
                request(served, "POST", "/v1/audio/speech", SPEECH, {"Content-Type": "application/json", **keep}),
                request(served, "GET", "/nowhere", headers=keep),
                request(served, "GET", "/health")]
    got = exchange(served, b"".join(requests), timeout=10, shut=half_close)
    statuses = [int(part[:3]) for part in got.split(b"HTTP/1.1 ")[1:] if part[:3].isdigit()]
    assert statuses == [200, 400, 200, 200, 404, 200], statuses


def test_the_body_limit_counts_characters_not_escaped_bytes(served):
    for count, code in ((4096, None), (4097, b'"string_above_max_length"')):
        body = json.dumps({"input": "\U0001D400" * count, "voice": "alloy", "response_format": "pcm"}).encode()
        assert len(body) > 6 * 4096 + 4096  # over what the old byte limit let through
        got = exchange(served, request(served, "POST", "/v1/audio/speech", body,
                                       {"Content-Type": "application/json"}), timeout=30)
        assert status_of(got) != 413
        if code is None:
            assert status_of(got) == 200
        else:
            assert status_of(got) == 400 and code in got


def test_field_names_of_any_characters_stay_inside_the_ignored_header(served):
    names = ["a\r\nX-Evil: 1", "\u00e9", "\u2028", "x" * 300] + [f"\u4e00{i}" for i in range(20)]  # sorted last
    body = json.dumps({"input": "Hi.", "voice": "alloy", **{name: 1 for name in names}}).encode()
    got = exchange(served, request(served, "POST", "/v1/audio/speech", body, {"Content-Type": "application/json"}))
    head = got.split(b"\r\n\r\n", 1)[0].decode("ascii")
    assert status_of(got) == 200 and not [line for line in head.split("\r\n") if line.lower().startswith("x-evil")]
    ignored = next(line for line in head.split("\r\n") if line.lower().startswith("x-voiceapp-ignored:"))
    assert "a\\r\\nX-Evil: 1" in ignored and "\\u00e9" in ignored and ignored.endswith("and 8 more")


# ---- fuzzing -----------------------------------------------------------------------------------------------

FIELD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 6, 10 ** 6), st.floats(allow_nan=True),
                         st.text(max_size=40), st.lists(st.integers(), max_size=3),
                         st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
BODIES = st.one_of(
    st.binary(max_size=300),
    st.dictionaries(st.one_of(st.sampled_from(["input", "voice", "response_format", "speed", "model",
                                               "instructions", "stream_format", "stream", "seed", "sample_rate",
                                               "lang_code"]), st.text(max_size=12)),
                    FIELD_VALUES, max_size=8).map(lambda d: json.dumps({"input": "Hi.", **d}).encode()),
)
HEADER_NAMES = st.sampled_from(["Content-Type", "Content-Length", "Transfer-Encoding", "Host", "Authorization",
                                "Origin", "Expect", "Connection", "X-Any"])
HEADER_VALUES = st.one_of(st.sampled_from(["application/json", "chunked", "100-continue", "-1", "99999999",
                                           "close", ""]),
                          st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "OPTIONS", "PUT", "BREW"]),
       path=st.sampled_from(["/v1/audio/speech", "/v1/models", "/health", "/v1/audio/voices", "/%00", "/" + "a" * 300]),
       body=BODIES, extra=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4))
def test_fuzzed_requests_leave_the_server_healthy(fuzz_target, method, path, body, extra):
    host, port = address(fuzz_target)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in extra)]
    got = exchange(fuzz_target, ("\r\n".join(lines) + "\r\n\r\n").encode() + body, timeout=TIMEOUT_S + 3,
                   shut=True)
    if got:
        assert got.startswith(b"HTTP/1.1 ") and b"Traceback" not in got
        assert status_of(got) < 500 or status_of(got) == 503


@pytest.fixture(scope="module")
def fuzz_target():
    server = Limited("--backend", "fake")
    before = None
    try:
        assert health_within(server, 2.0)
        before = descriptors(server.proc.pid)
        yield server
        assert wait_for(lambda: server.http()["live"] == 0, timeout=10)
        assert health_within(server, 1.0) and socket_answers_within(server, 1.0)
        assert wait_for(lambda: descriptors(server.proc.pid) <= before, timeout=TIMEOUT_S + 5)
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_at_the_cap_a_busy_server_refuses_new_connections_with_a_503():
    server = Served("--backend", "fake", "--http-max-connections", "2", "--http-timeout", "5")
    busy = []
    try:
        for _ in range(2):  # each in the middle of a body: a request under way, not to be evicted
            conn = socket.create_connection(address(server), timeout=5)
            conn.sendall(request(server, "POST", "/v1/audio/speech", headers={"Content-Type": "application/json",
                                                                                "Content-Length": "100"}) + b"{")
            busy.append(conn)
        time.sleep(0.3)
        got = exchange(server, request(server, "GET", "/health"), timeout=3)
        assert status_of(got) == 503 and b'"too_many_connections"' in got
        assert server.http()["refused_connections"] == 1
    finally:
        for conn in busy:
            conn.close()
    try:
        assert wait_for(lambda: status_of(exchange(server, request(server, "GET", "/health"))) == 200, timeout=5)
    finally:
        server.stop()


def test_status_tells_how_the_connection_cap_was_met(limited):
    from tests.cli_helpers import voicectl

    text = voicectl("status", env=limited.env).stdout.decode()
    http = limited.http()
    assert (f"connections at the cap ({http['max_connections']}): {http['evicted_connections']} idle ones replaced, "
            f"{http['refused_connections']} refused") in text
