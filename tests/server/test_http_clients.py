"""The speech API as real clients call it: each test replays one client's request (body and headers as its source
sends them; the source is named above each), and every format decodes with soundfile and PyAV to the duration the
engine synthesized. Also server-sent events read by the `openai` SDK's stream parser, and CORS."""
import http.client
import io
import json
import urllib.parse

import numpy as np
import pytest
import soundfile

from tests.server.test_http_serve import Served
from voiceapp.http.formats import QUIET_PEAK, supported_formats

openai = pytest.importorskip("openai")
av = pytest.importorskip("av")

TEXT = "Turn on the kitchen lights. They are on now."
ORIGIN = "http://localhost:3000"
SEED = 3
"""For the tests that compare samples (the fake engine, like the real one, varies without a seed)."""


@pytest.fixture(scope="module")
def served():
    server = Served("--backend", "fake", "--cors", ORIGIN)
    yield server
    server.stop()


def send(served, body, headers=None, method="POST", path="/v1/audio/speech"):
    """One request (`body` as JSON, None for none) on its own connection: (status, headers with lower-case names,
    body)."""
    url = urllib.parse.urlsplit(served.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def reference(served):
    """The engine's audio for TEXT (seed SEED) as 16-bit samples at its own rate (a sized WAV says both)."""
    status, _, data = send(served, {"input": TEXT, "voice": "alloy", "response_format": "wav", "stream": False,
                                    "seed": SEED},
                           {"Content-Type": "application/json"})
    assert status == 200
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert len(samples) > rate // 2
    return samples, rate


def decoded_length(data: bytes, fmt: str, engine_rate: int) -> tuple[int, int]:
    """(samples, rate) PyAV decodes from a response; for pcm, the raw count at the rate asked."""
    if fmt == "pcm":
        return len(data) // 2, engine_rate
    with av.open(io.BytesIO(data)) as container:
        n = sum(frame.samples for frame in container.decode(audio=0))
        return n, container.streams.audio[0].rate


SLACK = {"mp3": 1152}
"""Samples a streamed body may decode to (PyAV) beyond the audio: MP3's end padding (up to a frame: the count is not
known when its info frame goes out). AAC: `aac_length`."""
SOUNDFILE_SLACK = {"mp3": 2 * 1152}
"""The same for libsndfile (mpg123), which does not trim the encoder's delay of a streamed MP3 either."""
AAC = 1024
"""AAC-LC's frame and its encoder's priming, in samples."""


def aac_length(samples: np.ndarray) -> int:
    """What FFmpeg decodes an AAC (ADTS) response of these 16-bit samples to, sized or streamed: a frame for each
    packet, the last one's padding included, and the encoder's priming where neither the audio's first frame nor
    the samples of its last, partial one are quiet (voiceapp.http.formats's _Muxer._lets_go: over a frame, as ADTS
    cannot say it)."""
    padded = -(-len(samples) // AAC) * AAC
    partial = len(samples) - (padded - AAC)
    quiet_end = partial < AAC and np.abs(samples[-partial:].astype(int)).max() <= QUIET_PEAK
    quiet_start = np.abs(samples[:AAC].astype(int)).max() <= QUIET_PEAK
    return padded if quiet_start or quiet_end else padded + AAC


def assert_duration(data: bytes, fmt: str, samples: int, engine_rate: int, sized: bool) -> None:
    """`data` decodes (PyAV, and libsndfile where it reads the format) to `samples` at the engine's rate, within the
    format's slack (AAC: `assert_aac_length`)."""
    got, rate = decoded_length(data, fmt, engine_rate)
    want = samples * rate // engine_rate
    assert want <= got <= want + (SLACK.get(fmt, 0) if not sized else 0), (fmt, sized, got, want)
    if fmt in ("pcm", "aac") or (fmt == "flac" and not sized):
        return  # libsndfile reads no raw PCM unless told its layout, no AAC, and no FLAC of unknown length
    read, sf_rate = soundfile.read(io.BytesIO(data), dtype="int16")
    want = samples * sf_rate // engine_rate
    assert want <= len(read) <= want + (SOUNDFILE_SLACK.get(fmt, 0) if not sized else 0), (fmt, sized, len(read))


# ---- formats -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sized", [False, True], ids=["streamed", "sized"])
@pytest.mark.parametrize("fmt", supported_formats())
def test_every_format_decodes_to_the_synthesized_duration(served, reference, fmt, sized):
    samples, rate = reference
    body = {"input": TEXT, "voice": "alloy", "response_format": fmt, "sample_rate": rate, "stream": not sized,
            "seed": SEED}
    status, headers, data = send(served, body, {"Content-Type": "application/json"})
    assert status == 200, data
    assert ("content-length" in headers) == sized and ("chunked" in headers.get("transfer-encoding", "")) != sized
    if fmt == "aac":
        got, got_rate = decoded_length(data, fmt, rate)
        assert (got_rate, got) == (rate, aac_length(samples)), (got, len(samples))
    else:
        assert_duration(data, fmt, len(samples), rate, sized)
    if fmt == "wav":
        assert np.array_equal(soundfile.read(io.BytesIO(data), dtype="int16")[0], samples)


def test_a_sized_wav_says_its_sizes_and_a_streamed_one_says_unknown(served, reference):
    samples, _ = reference
    _, _, sized = send(served, {"input": TEXT, "voice": "alloy", "response_format": "wav", "stream": False,
                                "seed": SEED}, {"Content-Type": "application/json"})
    _, _, streamed = send(served, {"input": TEXT, "voice": "alloy", "response_format": "wav", "seed": SEED},
                          {"Content-Type": "application/json"})
    assert int.from_bytes(sized[40:44], "little") == 2 * len(samples) == len(sized) - 44
    assert int.from_bytes(streamed[40:44], "little") == 0x7FFFF000 and streamed[44:] == sized[44:]


def test_flac_is_sized_by_default_with_its_sample_count(served, reference):
    samples, _ = reference
    status, headers, data = send(served, {"input": TEXT, "voice": "alloy", "response_format": "flac", "seed": SEED},
                                 {"Content-Type": "application/json"})
    assert status == 200 and int(headers["content-length"]) == len(data)
    assert soundfile.info(io.BytesIO(data)).frames == len(samples)
    assert np.array_equal(soundfile.read(io.BytesIO(data), dtype="int16")[0], samples)


# ---- clients, replayed -------------------------------------------------------------------------------------

async def _home_assistant_core(served) -> tuple[bytes, dict]:
    # home-assistant/core, homeassistant/components/openai_conversation/tts.py: the async SDK's streaming response,
    # instructions=str(the prompt option) -- "None" when no prompt is set -- speed from its option (default 1.0),
    # model gpt-4o-mini-tts, voice "marin", format mp3 by default
    client = openai.AsyncOpenAI(base_url=served.url, api_key="sk-home-assistant", max_retries=0)
    async with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="marin", input=TEXT, instructions=str(None), speed=1.0,
            response_format="mp3") as response:
        data = bytearray()
        async for chunk in response.iter_bytes():
            data.extend(chunk)
        return bytes(data), dict(response.headers)


def test_home_assistant_core_gets_mp3_and_its_none_instructions_are_no_instructions(served, reference):
    import asyncio

    data, headers = asyncio.run(_home_assistant_core(served))
    assert "x-voiceapp-ignored" not in headers
    assert_duration(data, "mp3", len(reference[0]), reference[1], sized=False)


def test_home_assistant_custom_integration_with_speed_and_instructions(served, reference):
    # sfortis/openai_tts, custom_components/openai_tts/openaitts_engine.py (get_tts): urllib POST, these headers,
    # speed from the integration's slider, instructions when the user set some
    body = {"model": "tts-1", "input": TEXT, "voice": "shimmer", "response_format": "mp3", "speed": 1.2,
            "instructions": "Speak calmly."}
    status, headers, data = send(served, body, {"Content-Type": "application/json",
                                                "User-Agent": "HomeAssistant-OpenAI-TTS",
                                                "Authorization": "Bearer sk-x"})
    assert status == 200 and headers["content-type"] == "audio/mpeg"
    assert headers["x-voiceapp-ignored"] == "instructions"
    assert_duration(data, "mp3", round(len(reference[0]) / 1.2), reference[1], sized=False)
    # its streaming path (async_get_tts_stream): aiohttp, json=payload, opus
    status, _, data = send(served, {**body, "response_format": "opus", "speed": 0.8},
                           {"Content-Type": "application/json", "User-Agent": "HomeAssistant-OpenAI-TTS"})
    assert status == 200
    assert_duration(data, "opus", round(len(reference[0]) / 0.8), reference[1], sized=False)


def test_sillytavern_custom_openai_tts(served, reference):
    # SillyTavern/SillyTavern, src/endpoints/openai.js (custom /generate-voice): node-fetch, a "Bearer " header even
    # with no key saved, and exactly these five fields
    body = {"input": TEXT, "response_format": "mp3", "voice": "nova", "speed": 1.5, "model": "tts-1"}
    status, _, data = send(served, body, {"Content-Type": "application/json", "Authorization": "Bearer "})
    assert status == 200
    assert_duration(data, "mp3", round(len(reference[0]) / 1.5), reference[1], sized=False)


def test_open_webui(served, reference):
    # open-webui/open-webui, backend/open_webui/routers/audio.py (speech, engine "openai"): aiohttp json= the UI's
    # {input, voice} with the configured model, and the user headers when ENABLE_FORWARD_USER_INFO_HEADERS is on
    body = {"input": TEXT, "voice": "alloy", "model": "tts-1"}
    status, headers, data = send(served, body, {"Content-Type": "application/json", "Authorization": "Bearer sk-1",
                                                "X-OpenWebUI-User-Name": "Ada", "X-OpenWebUI-User-Id": "u1",
                                                "X-OpenWebUI-User-Email": "ada@example.org",
                                                "X-OpenWebUI-User-Role": "user"})
    assert status == 200 and headers["content-type"] == "audio/mpeg"
    assert_duration(data, "mp3", len(reference[0]), reference[1], sized=False)


def test_kokoro_style_clients_with_stream_and_lang_code(served, reference):
    # remsky/Kokoro-FastAPI, api/src/structures/schemas.py (OpenAISpeechRequest): the fields a client written for it
    # may send besides OpenAI's; stream false asks for the whole file at once
    body = {"model": "kokoro", "input": TEXT, "voice": "alloy", "response_format": "wav", "stream": False,
            "lang_code": "a", "speed": 1.0, "download_format": None, "return_download_link": False,
            "volume_multiplier": 1.0, "normalization_options": {"normalize": True}}
    status, headers, data = send(served, body, {"Content-Type": "application/json"})
    assert status == 200 and int(headers["content-length"]) == len(data)
    assert headers["x-voiceapp-ignored"] == ("download_format, lang_code, normalization_options, "
                                             "return_download_link, volume_multiplier")
    assert len(soundfile.read(io.BytesIO(data), dtype="int16")[0]) == len(reference[0])


def test_unknown_fields_are_ignored_named_and_logged_once():
    server = Served("--backend", "fake")
    try:
        for _ in range(2):
            status, headers, _ = send(server, {"input": "Hi.", "voice": "alloy", "temperature": 0.3,
                                               "normalize": True}, {"Content-Type": "application/json"})
            assert status == 200 and headers["x-voiceapp-ignored"] == "normalize, temperature"
        server.proc.terminate()
        log = server.proc.stderr.read().decode()
    finally:
        server.stop()
    assert log.count('"temperature"') == 1 and log.count('"normalize"') == 1


def test_the_openai_sdk_parses_the_server_sent_events(served, reference):
    client = served.client()
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse",
            extra_body={"sample_rate": reference[1], "seed": SEED}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(openai.Stream(cast_to=object, response=response.http_response, client=client))
    deltas, done = events[:-1], events[-1]
    assert {e["type"] for e in deltas} == {"speech.audio.delta"} and done["type"] == "speech.audio.done"
    import base64

    audio = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in deltas), "<i2")
    assert np.array_equal(audio, reference[0])
    starts = [s for e in deltas for s in e.get("sentences", [])]
    assert [s["index"] for s in starts] == [0, 1] and starts[0]["start_s"] == 0
    assert 0.2 < starts[1]["start_s"] < len(audio) / reference[1]
    assert set(done["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}


# ---- CORS --------------------------------------------------------------------------------------------------

PREFLIGHT = {"Access-Control-Request-Method": "POST",  # as the openai SDK in a browser asks
             "Access-Control-Request-Headers": "authorization,content-type,x-stainless-lang,x-stainless-retry-count"}


def test_cors_preflight_is_answered_for_an_allowed_origin(served):
    status, headers, _ = send(served, None, {"Origin": ORIGIN, **PREFLIGHT}, method="OPTIONS")
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in headers["access-control-allow-methods"]
    status, headers, _ = send(served, {"input": "Hi.", "voice": "alloy"},
                              {"Origin": ORIGIN, "Content-Type": "application/json"})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN


def test_an_origin_not_allowed_gets_no_cors_headers(served):
    status, headers, body = send(served, None, {"Origin": "http://evil.example", **PREFLIGHT}, method="OPTIONS")
    assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed"
    assert not [h for h in headers if h.startswith("access-control-")]
    status, headers, _ = send(served, None, {"Origin": "http://evil.example"}, method="GET", path="/health")
    assert status == 200 and not [h for h in headers if h.startswith("access-control-")]


def test_without_cors_a_preflight_is_refused_and_carries_no_cors_headers():
    server = Served("--backend", "fake")
    try:
        status, headers, body = send(server, None, {"Origin": ORIGIN, **PREFLIGHT}, method="OPTIONS")
        assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
        assert not [h for h in headers if h.startswith("access-control-")]
    finally:
        server.stop()
