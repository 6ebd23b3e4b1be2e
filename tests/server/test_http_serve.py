"""`voicectl serve --http` as a process, driven by the official `openai` client: every format decodes to the samples
`voicectl say --out` gives, audio streams while it is synthesized, refusals are OpenAI-style 4xx JSON, a client that
leaves cancels its request, and the limits hold."""
import asyncio
import http.client
import io
import json
import re
import shutil
import signal
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tests.cli_helpers import kill_servers, one_line_error, voicectl
from tests.server.conftest import start_serve, wait_for
from voiceapp.server.client import server_status
from voiceapp.http.rules import RETRY_AFTER_MAX_S
from voiceapp.http.formats import supported_formats

openai = pytest.importorskip("openai")
av = pytest.importorskip("av")

TEXT = "The first one. And a second, a little longer."
LONG_TEXT = " ".join(f"Sentence number {i} goes on for a while." for i in range(80))
SEED, VOICE = 5, "mia"


class Served:
    """A `voicectl serve --http 127.0.0.1:0` process with its own socket and user dirs."""

    def __init__(self, *args: str, env: dict | None = None, **popen) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vh-"))
        self.env = {"VOICEAPP_SOCKET": str(self.dir / "engine.sock"), "XDG_CACHE_HOME": str(self.dir / "cache"),
                    "XDG_DATA_HOME": str(self.dir / "data"), **(env or {})}
        self.proc = start_serve("--http", "127.0.0.1:0", *args, env=self.env, **popen)
        self.url = re.search(r"http://\S+/v1", self.proc.startup_log).group(0)

    def client(self, key: str = "none"):
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60)

    def status(self) -> dict:
        return asyncio.run(server_status(Path(self.env["VOICEAPP_SOCKET"])))

    def http(self) -> dict:
        return self.status()["http"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_servers(self.env["VOICEAPP_SOCKET"])
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def served():
    server = Served("--backend", "fake")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def said(served, tmp_path_factory):
    """The float samples `voicectl say --out` writes for TEXT, voice and seed (in-process, the same engine)."""
    out = tmp_path_factory.mktemp("say") / "ref.wav"
    proc = voicectl("say", TEXT, "--no-server", "--backend", "fake", "--voice", VOICE, "--seed", str(SEED),
                    "--out", str(out), env={k: v for k, v in served.env.items() if k.startswith("XDG")})
    assert proc.returncode == 0, proc.stderr.decode()
    samples, rate = soundfile.read(str(out), dtype="float32")
    assert rate == 16000 and len(samples) > 16000
    return samples


def int16(samples: np.ndarray) -> np.ndarray:
    """What the API documents for its 16-bit formats: round(x * 32767) of the float samples."""
    return np.rint(np.clip(samples.astype(np.float64), -1, 1) * 32767).astype(np.int16)


def av_decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        return np.concatenate(frames), container.streams.audio[0].rate


def best_correlation(got: np.ndarray, want: np.ndarray, max_lag: int) -> float:
    """Correlation of `want` with `got` delayed by the best lag in [0, max_lag] (a codec's delay)."""
    n = min(len(want), len(got)) - max_lag
    w = (want[:n] - want[:n].mean()) / want[:n].std()
    g = (got[:n + max_lag] - got[:n + max_lag].mean()) / got[:n + max_lag].std()
    size = 1 << (2 * (n + max_lag)).bit_length()
    corr = np.fft.irfft(np.fft.rfft(g, size) * np.conj(np.fft.rfft(w, size)), size)  # corr[lag] = sum g[lag+i] w[i]
    return float(np.max(corr[:max_lag + 1]) / n)


def speak(client, fmt: str, text: str = TEXT, **extra) -> bytes:
    response = client.audio.speech.create(model="tts-1", voice=VOICE, input=text, response_format=fmt,
                                          extra_body={"seed": SEED, **extra})
    return response.read()


def post(url: str, body: bytes, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"{url}/audio/speech", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {}
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# ---- audio -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", supported_formats())
def test_every_format_decodes_to_the_samples_say_out_gives(served, said, fmt):
    client = served.client()
    if fmt == "pcm":  # 24 kHz by default, as OpenAI's; at the engine's rate it is exactly say's samples
        assert np.array_equal(np.frombuffer(speak(client, fmt, sample_rate=16000), "<i2"), int16(said))
        import soxr

        got = np.frombuffer(speak(client, fmt), "<i2").astype(int)
        want = int16(soxr.resample(said, 16000, 24000, quality="HQ")).astype(int)
        assert abs(len(got) - len(want)) <= 1 and np.max(np.abs(got[:len(want)] - want[:len(got)])) <= 2
        return
    data = speak(client, fmt)
    if fmt == "wav":  # libsndfile reads the streamed header too
        decoded, rate = soundfile.read(io.BytesIO(data), dtype="int16")
        assert rate == 16000 and np.array_equal(decoded, int16(said))
    decoded, rate = av_decode(data)
    if fmt in ("wav", "flac"):
        assert rate == 16000 and np.array_equal(decoded, int16(said))
    else:  # lossy: the same audio within the codec's delay (Opus decodes at 48 kHz)
        import soxr

        want = soxr.resample(said, 16000, rate) if rate != 16000 else said
        got = decoded.astype(np.float64) / (32768 if decoded.dtype == np.int16 else 1)
        assert abs(len(got) - len(want)) < 0.2 * rate, (len(got), len(want))
        assert best_correlation(got, want, max_lag=rate // 5) > 0.9


def test_streaming_sends_audio_while_the_engine_is_still_speaking(served):
    client = served.client()
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="shimmer", input=LONG_TEXT[:300], response_format="wav",
            extra_body={"seed": SEED}) as response:
        assert response.headers["content-type"] == "audio/wav"
        pieces = response.iter_bytes()
        first = next(pieces)
        streams = served.status()["streams"]  # the first bytes are here and the request still runs
        assert len(streams) == 1 and streams[0]["client"].startswith("http 127.0.0.1:")
        assert streams[0]["voice"] == "mia"  # shimmer means mia
        data = first + b"".join(pieces)
    assert data == speak(client, "wav", LONG_TEXT[:300])  # the same seed: the same bytes, streamed or not


def test_a_client_that_leaves_mid_stream_cancels_its_request(served):
    before, client = served.http(), served.client()
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=VOICE, input=LONG_TEXT, response_format="pcm") as response:
        pieces = response.iter_bytes()  # held: dropping it closes the connection
        next(pieces)
        assert served.http()["live"] == 1
    assert wait_for(lambda: served.http()["cancelled"] == before["cancelled"] + 1, timeout=10)
    status = served.status()
    assert status["streams"] == [] and status["http"]["live"] == 0
    assert status["http"]["served"] == before["served"]  # cut short: the engine did not finish it
    text = voicectl("status", env=served.env).stdout.decode()
    assert f"{status['http']['cancelled']} cancelled" in text and served.url in text


def test_listings_and_health(served):
    client = served.client()
    assert "tts-1" in [m.id for m in client.models.list()]
    voices = json.loads(urllib.request.urlopen(f"{served.url}/audio/voices", timeout=10).read())["voices"]
    assert {"mia", "alloy"} <= {v["id"] for v in voices}
    health = json.loads(urllib.request.urlopen(served.url.removesuffix("/v1") + "/health", timeout=10).read())
    assert health["status"] == "ok"


# ---- refusals ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, param, code", [
    ({"voice": "bogus"}, "voice", "invalid_voice"),
    ({"input": ""}, "input", "empty_input"),
    ({"input": "x" * 4097}, "input", "string_above_max_length"),
    ({"speed": 4.5}, "speed", "unsupported_value"),
    ({"response_format": "ogg"}, "response_format", "unsupported_value"),
])
def test_bad_requests_get_a_400_with_an_openai_error_body(served, change, param, code):
    request = {"model": "tts-1", "voice": VOICE, "input": TEXT, **change}
    before = served.http()["rejected"]
    with pytest.raises(openai.BadRequestError) as caught:
        served.client().audio.speech.create(**request)
    error = caught.value.response.json()["error"]
    assert caught.value.status_code == 400 and (error["param"], error["code"]) == (param, code)
    assert error["type"] == "invalid_request_error" and error["message"]
    assert served.http()["rejected"] == before + 1


def test_an_oversized_body_is_a_413_before_it_is_read_whole(served):
    status, body = post(served.url, json.dumps({"input": "Hi.", "padding": "x" * 60000}).encode())
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = post(served.url, b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"


@pytest.fixture(scope="module")
def keyed():
    """A server that takes one stream at a time and wants a key."""
    server = Served("--backend", "fake", "--http-max-streams", "1", env={"VOICEAPP_API_KEY": "s3cret"})
    yield server
    server.stop()


def test_a_wrong_or_missing_api_key_is_a_401_on_every_endpoint(keyed):
    assert speak(keyed.client("s3cret"), "wav")[:4] == b"RIFF"
    with pytest.raises(openai.AuthenticationError) as caught:
        speak(keyed.client("wrong"), "wav")
    assert caught.value.response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        keyed.client("wrong").models.list()
    status, body = post(keyed.url, json.dumps({"input": "Hi."}).encode())
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    for path in ("/audio/voices", "/audio/models"):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(keyed.url + path, timeout=10)
        assert caught.value.code == 401
    assert keyed.http()["api_key"] is True


def test_more_streams_than_allowed_get_a_429(keyed):
    client = keyed.client("s3cret")
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice=VOICE, input=LONG_TEXT,
                                                             response_format="pcm") as response:
        pieces = response.iter_bytes()  # held: dropping it closes the connection
        next(pieces)
        with pytest.raises(openai.RateLimitError) as caught:
            speak(client, "wav")
        assert caught.value.response.json()["error"]["code"] == "too_many_requests"
        # the live stream's text (LONG_TEXT, minutes of speech) is far from its end: a long wait, within the cap
        wait = caught.value.response.headers["retry-after"]
        assert wait.isdigit() and 5 <= int(wait) <= RETRY_AFTER_MAX_S
        assert f"try again in {wait} s" in caught.value.response.json()["error"]["message"]
    assert keyed.http()["busy"] == 1
    assert wait_for(lambda: keyed.http()["live"] == 0)
    assert speak(client, "wav")[:4] == b"RIFF"  # the slot is free again


# ---- the command line --------------------------------------------------------------------------------------

def test_a_public_address_without_a_key_or_a_taken_port_fail_before_the_model_loads(tmp_path):
    env = {"VOICEAPP_SOCKET": str(tmp_path / "s.sock"), "VOICEAPP_API_KEY": ""}
    err = one_line_error(voicectl("serve", "--backend", "fake", "--http", "0.0.0.0:0", env=env))
    assert "VOICEAPP_API_KEY" in err
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        err = one_line_error(voicectl("serve", "--backend", "fake", "--http", f"127.0.0.1:{port}", env=env))
    assert f"127.0.0.1:{port}" in err and "loading" not in err
    assert not (tmp_path / "s.sock.lock").exists()


def test_sigterm_during_a_stream_cuts_it_and_the_server_exits_cleanly():
    server = Served("--backend", "fake")
    client = server.client()
    try:
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice=VOICE, input=LONG_TEXT, response_format="pcm") as response:
            pieces = response.iter_bytes()
            next(pieces)
            server.proc.send_signal(signal.SIGTERM)
            with pytest.raises(Exception):  # the stream ends early: the client sees it was cut
                for _ in pieces:
                    pass
        assert server.proc.wait(15) == 0
        assert not Path(server.env["VOICEAPP_SOCKET"]).exists()
    finally:
        server.stop()


@pytest.mark.slow
def test_http_audio_equals_say_out_on_the_tiny_checkpoint(tiny_model, tmp_path):
    model = ["--model", str(tiny_model), "--backend", "torch", "--threads", "2"]
    server, client = Served(*model), None
    try:
        client = server.client()
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="ava", input="Short. And one more.", response_format="wav",
                extra_body={"seed": 2}) as response:
            data = response.read()
        env = {k: v for k, v in server.env.items() if k.startswith("XDG")}
    finally:
        server.stop()
    said = voicectl("say", "Short. And one more.", "--no-server", *model, "--voice", "ava", "--seed", "2",
                    "--out", str(tmp_path / "a.wav"), env=env)
    assert said.returncode == 0, said.stderr.decode()
    want, _ = soundfile.read(str(tmp_path / "a.wav"), dtype="float32")
    got, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == 16000 and len(want) > 16000 and np.array_equal(got, int16(want))


def test_bench_load_over_http_counts_refusals_and_their_retry_after(keyed, tmp_path):
    """`voicectl bench --load --http` against the one-stream server: the pcm bodies are heard as they stream, and
    requests that arrive while one is live are refused with a Retry-After the report keeps."""
    out = tmp_path / "load.json"
    proc = voicectl("bench", "--load", "12", "--load-seconds", "1.5", "--http", keyed.url, "--json", str(out),
                    env={"VOICEAPP_API_KEY": "s3cret"}, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rate = json.loads(out.read_text())["rates"][0]
    assert rate["served"] > 0 and rate["refused"] > 0 and rate["failed"] == 0
    assert rate["served"] + rate["refused"] == rate["streams"]
    assert rate["retry_after_s"] and all(1 <= s <= RETRY_AFTER_MAX_S for s in rate["retry_after_s"])
    assert 0 < rate["first_ms_p50"] <= rate["first_ms_max"]
    # one stream at a time, as the server allows; the client may see a stream's last bytes after the server has
    # freed its slot and taken the next
    assert 1 <= rate["peak_concurrency"] <= 2


@pytest.mark.parametrize("fmt", ["mp3", "pcm"])
def test_sigterm_mid_stream_stops_quietly(fmt):
    """SIGTERM while a response streams (issue 41 reported two ASGI tracebacks then; not reproduced since the HTTP
    protocol went under our own deadlines): the server stops with its own lines only, exit 0, and says how many
    responses it cut short."""
    server = Served("--backend", "fake")
    try:
        body = json.dumps({"model": "tts-1", "input": LONG_TEXT, "voice": VOICE, "response_format": fmt}).encode()
        req = urllib.request.Request(f"{server.url}/audio/speech", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.read(4096)
            server.proc.send_signal(signal.SIGTERM)
            try:
                resp.read()
            except (OSError, ValueError, http.client.HTTPException):
                pass  # cut short
        assert server.proc.wait(30) == 0
        err = server.proc.stderr.read().decode()
        assert "Traceback" not in err and "Exception" not in err, err
        assert "stopping" in err and "cut short" in err, err
    finally:
        server.stop()
