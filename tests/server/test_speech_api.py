"""The HTTP API's pure parts: what a speech request means (voiceapp.http.rules) and how its audio is written
(voiceapp.http.formats), without a server."""
import dataclasses
import io
import json
import struct

import numpy as np
import pytest
import soundfile

from engine.errors import InputError
from engine.families import family
from engine.voices import BUILTIN_DIR, PresetBank, Voice, VoiceBank
from voiceapp.http.rules import (OPENAI_VOICES, RETRY_AFTER_MAX_S, SPEECH_CHARS_PER_S, ApiError, HttpLimits,
                                 authorized, expected_audio_s, http_settings, is_loopback, openai_aliases,
                                 parse_listen, parse_speech, resolve_voice, retry_after_s, voices_body)
from voiceapp.http.formats import (FORMATS, QUIET_PEAK, WAV_UNKNOWN_SIZE, StreamEncoder, _Muxer, atempo_stages,
                                   pcm16, supported_formats)

VOICES = VoiceBank(dirs=[BUILTIN_DIR])
"""Spark's presets alone."""
ORPHEUS = family("orpheus").voices()
ALL_FORMATS = tuple(FORMATS)


def parse(limits=HttpLimits(), formats=ALL_FORMATS, voices=VOICES, **request):
    return parse_speech(json.dumps(request).encode(), voices, formats, 16000, limits)


def refused(status=400, **request) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(**request)
    assert caught.value.status == status
    body = caught.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]
    return caught.value


def test_a_plain_openai_request_gets_mp3_at_the_engine_rate_and_a_mapped_voice():
    p = parse(model="tts-1", input="Hello there.", voice="alloy")
    assert (p.text, p.voice, p.response_format, p.sample_rate, p.seed) == ("Hello there.", "ava", "mp3", 16000, None)
    assert parse(input="Hi.", formats=("wav", "pcm")).response_format == "wav"  # no MP3 here: WAV by default


def test_pcm_is_24_khz_as_openai_documents_unless_sample_rate_says_otherwise():
    assert parse(input="Hi.", response_format="pcm").sample_rate == 24000
    assert parse(input="Hi.", response_format="pcm", sample_rate=16000).sample_rate == 16000
    assert parse(input="Hi.", response_format="wav", sample_rate=48000, seed=7).sample_rate == 48000
    assert refused(input="Hi.", sample_rate=44100).param == "sample_rate"


def test_voices_ours_first_then_openai_names_case_insensitive():
    assert resolve_voice("mia", VOICES) == "mia" and resolve_voice("default", VOICES) == "ava"
    assert resolve_voice("Onyx", VOICES) == "max" and resolve_voice("nova", VOICES) == "emma"
    assert openai_aliases(VOICES) == {"alloy": "ava", "ash": "leo", "ballad": "max", "cedar": "leo", "coral": "emma",
                                      "echo": "leo", "fable": "sam", "marin": "ava", "nova": "emma", "onyx": "max",
                                      "sage": "mia", "shimmer": "mia", "verse": "sam"}
    mine = PresetBank({**VOICES.all(), "nova": Voice(name="nova", gender="male")})
    assert resolve_voice("nova", mine) == "nova" and "nova" not in openai_aliases(mine)  # a voice of ours wins
    err = refused(input="Hi.", voice="bogus")
    assert (err.param, err.code) == ("voice", "invalid_voice") and "mia" in str(err) and "alloy" in str(err)


def test_an_orpheus_engine_takes_openai_voices_and_no_voice_as_its_own():
    assert parse(input="Hi.", voices=ORPHEUS).voice == "tara"  # no voice: the family's default
    assert parse(input="Hi.", voice="default", voices=ORPHEUS).voice == "tara"
    assert {name: parse(input="Hi.", voice=name, voices=ORPHEUS).voice for name in OPENAI_VOICES} == {
        "alloy": "tara", "ash": "leo", "ballad": "dan", "cedar": "leo", "coral": "jess", "echo": "leo",
        "fable": "zac", "marin": "tara", "nova": "jess", "onyx": "dan", "sage": "leah", "shimmer": "leah",
        "verse": "zac"}
    assert parse(input="Hi.", voice="zoe", voices=ORPHEUS).voice == "zoe"
    err = refused(input="Hi.", voice="ava", voices=ORPHEUS)
    assert err.param == "voice" and "tara" in str(err)


@pytest.mark.parametrize("request_, param, code", [
    ({}, "input", "missing_required_parameter"),
    ({"input": "   "}, "input", "empty_input"),
    ({"input": "*** !!"}, "input", "empty_input"),
    ({"input": 5}, "input", "invalid_type"),
    ({"input": "x" * 4097}, "input", "string_above_max_length"),
    ({"input": "Hi.", "speed": 4.01}, "speed", "unsupported_value"),
    ({"input": "Hi.", "speed": 0.2}, "speed", "unsupported_value"),
    ({"input": "Hi.", "speed": "fast"}, "speed", "invalid_type"),
    ({"input": "Hi.", "speed": True}, "speed", "invalid_type"),
    ({"input": "Hi.", "instructions": 3}, "instructions", "invalid_type"),
    ({"input": "Hi.", "stream_format": "json"}, "stream_format", "unsupported_value"),
    ({"input": "Hi.", "stream": "yes"}, "stream", "invalid_type"),
    ({"input": "Hi.", "lang_code": ["en"]}, "lang_code", "invalid_type"),
    ({"input": "Hi.", "response_format": "ogg"}, "response_format", "unsupported_value"),
    ({"input": "Hi.", "seed": 1.5}, "seed", "invalid_type"),
    ({"input": "Hi.", "seed": True}, "seed", "invalid_type"),
    ({"input": "Hi.", "model": 3}, "model", "invalid_type"),
])
def test_each_bad_field_is_named_in_a_400(request_, param, code):
    err = refused(**request_)
    assert (err.param, err.code) == (param, code), str(err)


def test_what_real_clients_add_is_accepted():
    p = parse(input="Hi.", instructions="None", speed=1.5, stream=True, lang_code="a", temperature=0.5, x_y=None)
    assert (p.instructions, p.speed, p.sized, p.unused) == (None, 1.5, False, ("lang_code", "temperature", "x_y"))
    assert parse(input="Hi.", instructions="  Speak softly. ").instructions == "Speak softly."
    assert parse(input="Hi.", speed=0.25).speed == 0.25 and parse(input="Hi.", speed=4).speed == 4.0
    assert "0.25 to 4" in str(refused(input="Hi.", speed=9))


def test_stream_false_asks_for_a_sized_body_and_flac_is_sized_unless_streamed():
    assert parse(input="Hi.", response_format="wav", stream=False).sized
    assert not parse(input="Hi.", response_format="wav").sized
    assert parse(input="Hi.", response_format="flac").sized
    assert not parse(input="Hi.", response_format="flac", stream=True).sized
    assert not parse(input="Hi.", response_format="wav", stream=False, stream_format="sse").sized


def test_speed_one_and_empty_extras_are_fine_and_limits_are_configurable():
    assert parse(input="Hi.", speed=1, instructions="", stream_format="audio", model="anything").text == "Hi."
    assert parse(input="x y " * 1024, limits=HttpLimits(max_chars=4096)).text
    assert refused(input="Hello there.", limits=HttpLimits(max_chars=5)).code == "string_above_max_length"
    astral = json.dumps({"input": "\U0001F600" * 100, "voice": "mia", "model": "tts-1"}).encode()
    assert len(astral) <= HttpLimits(max_chars=100).max_body_bytes  # 100 astral characters as JSON escapes fit
    with pytest.raises(InputError):
        HttpLimits(max_streams=0)


@pytest.mark.parametrize("body", [b"", b"{", b"[1]", b"\xff\xfe", b"null", b"[" * 100000])
def test_a_body_that_is_not_a_json_object_is_a_400(body):
    with pytest.raises(ApiError) as caught:
        parse_speech(body, VOICES, ALL_FORMATS, 16000)
    assert caught.value.status == 400 and caught.value.code == "invalid_json"


def test_the_api_key_is_checked_exactly_and_anything_goes_without_one():
    assert authorized(None, None) and authorized("Bearer whatever", "")
    assert authorized("Bearer s3cret", "s3cret") and authorized("bearer s3cret", "s3cret")
    for header in (None, "", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"):
        assert not authorized(header, "s3cret"), header


def test_listen_addresses_and_which_need_a_key():
    assert parse_listen("8000") == ("127.0.0.1", 8000)
    assert parse_listen("0.0.0.0:80") == ("0.0.0.0", 80) and parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("", "host:", "::1:80", "127.0.0.1:65536", "127.0.0.1:http", ":80"):
        with pytest.raises(InputError):
            parse_listen(bad)
    assert all(is_loopback(h) for h in ("localhost", "127.0.0.1", "127.8.0.1", "::1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.2", "example.com"))
    assert http_settings("9000", None).api_key is None
    with pytest.raises(InputError, match="VOICEAPP_API_KEY"):
        http_settings("0.0.0.0:9000", "")
    assert http_settings("0.0.0.0:9000", "k").api_key == "k"


def test_voice_listing_has_ours_and_the_openai_names_in_open_webuis_shape():
    body = voices_body({"ava": "warm", "mia": "calm"}, openai_aliases(VOICES))
    ids = [v["id"] for v in body["voices"]]
    assert ids[:2] == ["ava", "mia"] and "alloy" in ids and "onyx" not in ids  # onyx means max, absent here
    assert all({"id", "name"} <= set(v) for v in body["voices"])


# ---- encoders ----------------------------------------------------------------------------------------------

def tone(seconds=1.0, rate=16000):
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def encode(fmt, samples, out_rate=16000, piece=1000, **options):
    enc = StreamEncoder(fmt, 16000, out_rate, **options)
    parts = [enc.encode(samples[i:i + piece]) for i in range(0, len(samples), piece)]
    return parts, parts and b"".join(parts) + enc.finish()


def test_pcm16_rounds_and_clips():
    got = pcm16(np.array([0.0, 1.0, -1.0, 2.0, -3.0, 0.5, 1 / 65534, -1 / 65534], np.float32))
    assert got.dtype == np.int16 and got.tolist() == [0, 32767, -32767, 32767, -32767, 16384, 0, 0]


def test_wav_and_pcm_stream_exact_samples_from_the_first_chunk():
    x = tone()
    parts, wav = encode("wav", x)
    assert parts[0][:4] == b"RIFF" and struct.unpack("<I", parts[0][40:44]) == (WAV_UNKNOWN_SIZE,)
    assert all(len(p) == 2000 for p in parts[1:])  # every chunk goes out as it comes
    data, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 16000 and np.array_equal(data, pcm16(x))
    _, pcm = encode("pcm", x)
    assert np.array_equal(np.frombuffer(pcm, "<i2"), pcm16(x))


def test_resampled_pcm_is_the_one_shot_resample_within_a_step():
    import soxr

    x = tone(0.5)
    _, pcm = encode("pcm", x, out_rate=24000, piece=777)
    got = np.frombuffer(pcm, "<i2").astype(int)
    want = pcm16(soxr.resample(x, 16000, 24000, quality="HQ")).astype(int)
    assert abs(len(got) - len(want)) <= 1
    n = min(len(got), len(want))
    assert np.max(np.abs(got[:n] - want[:n])) <= 2


@pytest.mark.parametrize("fmt", [f for f in ("flac", "mp3", "opus", "aac") if f in supported_formats()])
def test_compressed_formats_stream_while_encoding_and_decode_with_ffmpeg(fmt):
    av = pytest.importorskip("av")
    x = tone(2.0)
    parts, data = encode(fmt, x, piece=1600)
    assert sum(1 for p in parts[:5] if p) >= 2, [len(p) for p in parts]  # bytes within the first 0.5 s of audio
    with av.open(io.BytesIO(data)) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
        rate = container.streams.audio[0].rate
    if fmt == "flac":
        assert rate == 16000 and np.array_equal(decoded, pcm16(x))
    else:  # lossy: the same tone, give or take the codec's delay and resampling
        assert abs(len(decoded) / rate - 2.0) < 0.2
        spectrum = np.abs(np.fft.rfft(decoded[: rate]))
        assert abs(np.argmax(spectrum) * rate / (2 * (len(spectrum) - 1)) - 220) < 5


def test_an_abandoned_encoder_closes_quietly():
    enc = StreamEncoder("flac", 16000, 16000)
    enc.encode(tone(0.1))
    enc.close()
    enc.close()


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def av_decoded(data: bytes) -> tuple[np.ndarray, int]:
    av = pytest.importorskip("av")
    with av.open(io.BytesIO(data)) as container:
        return (np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]),
                container.streams.audio[0].rate)


def test_atempo_stages_stay_within_one_stages_range():
    assert atempo_stages(1.5) == [1.5] and atempo_stages(0.5) == [0.5]
    for speed in (0.25, 0.3, 2.5, 4.0):
        stages = atempo_stages(speed)
        assert len(stages) == 2 and all(0.5 <= s <= 2.0 for s in stages)
        assert abs(np.prod(stages) - speed) < 1e-9


@pytest.mark.parametrize("speed", [0.25, 0.8, 1.7, 4.0])
def test_speed_changes_the_length_exactly_and_keeps_the_pitch(speed):
    x = tone(1.5)  # 220 Hz
    parts, pcm = encode("pcm", x, piece=1000, speed=speed)
    got = np.frombuffer(pcm, "<i2")
    assert len(got) == round(len(x) / speed)
    assert sum(map(len, parts)) >= 0.8 * len(pcm)  # streamed as it goes: the filter holds back a window at most
    assert abs(dominant_hz(got, 16000) - 220) < 3
    tail = np.abs(got[-1600:-640].astype(int)).reshape(-1, 160)  # the last 100 ms but 40 (a fade), in 10 ms
    assert tail.max(axis=1).min() > 0.8 * 0.5 * 32767  # the tone lasts to the end: the filter's window not cut


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f in supported_formats()])
def test_sized_bodies_carry_their_length_and_decode_to_it(fmt):
    x = tone(1.0)
    parts, data = encode(fmt, x, sized=True)
    assert not any(parts)  # all of it comes from finish()
    if fmt == "pcm":
        assert np.array_equal(np.frombuffer(data, "<i2"), pcm16(x))
        return
    decoded, rate = av_decoded(data)
    want = len(x) * rate // 16000
    slack = {"aac": 1024 + 1024}.get(fmt, 0)  # ADTS cannot say the encoder's priming; see voiceapp.http.formats
    assert want <= len(decoded) <= want + slack, (len(decoded), want)
    if fmt != "aac":  # libsndfile has no AAC
        info = soundfile.info(io.BytesIO(data))
        assert info.frames == len(x) and len(soundfile.read(io.BytesIO(data))[0]) == len(x)
    if fmt == "wav":
        assert struct.unpack("<I", data[40:44]) == (2 * len(x),)


@pytest.mark.parametrize("fmt", [f for f in ("mp3", "opus", "flac", "aac") if f in supported_formats()])
def test_streamed_bodies_decode_to_the_length_within_a_codec_frame(fmt):
    x = tone(1.0)
    _, data = encode(fmt, x, piece=1600)
    decoded, rate = av_decoded(data)
    want = len(x) * rate // 16000
    frame = {"mp3": 1152, "aac": 1024 + 1024}.get(fmt, 0)  # MP3: the end padding; AAC: priming and padding
    assert want <= len(decoded) <= want + frame, (len(decoded), want)


def every_packet_aac(x: np.ndarray) -> bytes:
    """`x` as ADTS with every packet the encoder made (what the aac format sent before it could leave one out)."""
    muxer = _Muxer(dataclasses.replace(FORMATS["aac"], states_priming=True), 16000, True)
    muxer.write(pcm16(x))
    return muxer.finish()


AAC = 1024
"""AAC-LC's frame (and its encoder's priming), in samples."""


@pytest.mark.skipif("aac" not in supported_formats(), reason="no AAC encoder in this FFmpeg")
@pytest.mark.parametrize("sized", [False, True], ids=["streamed", "sized"])
@pytest.mark.parametrize("edge", ["silent lead", "quiet lead", "quiet tail", "loud"])
def test_aac_decodes_within_a_frame_of_the_audio_where_its_first_or_last_frame_is_quiet(edge, sized):
    """FFmpeg decodes every ADTS packet, the encoder's priming too: 1024 samples more than the audio, plus the last
    frame's padding. With a quiet first frame the priming packet is left out and the audio is decoded from its
    first sample; else with a quiet end, the last packet; either way within a frame of the audio. Loud at both
    ends: every packet (the priming stays, over a frame)."""
    x = tone(1.0)[:-77].copy()  # the last frame partial
    rng = np.random.default_rng(0)
    if edge == "silent lead":
        x[:AAC + 100] = 0
    elif edge == "quiet lead":  # noise just under QUIET_PEAK: not digital silence
        x[:AAC + 100] = rng.integers(-QUIET_PEAK, QUIET_PEAK + 1, AAC + 100) / 32767
    elif edge == "quiet tail":
        x[-AAC:] = rng.integers(-QUIET_PEAK, QUIET_PEAK + 1, AAC) / 32767
    _, data = encode("aac", x, piece=1600, sized=sized)
    got, _ = av_decoded(data)
    every, _ = av_decoded(every_packet_aac(x))
    padded = -(-len(x) // AAC) * AAC  # the audio and the last frame's padding
    assert len(every) == padded + AAC  # what a decoder made of every packet: the priming first
    if edge == "loud":
        assert np.array_equal(got, every)
        return
    assert len(x) <= len(got) == padded < len(x) + AAC  # within a frame
    if edge == "quiet tail":  # the stream ends a frame early: all before it decodes exactly the same
        assert np.array_equal(got, every[:padded])
        return
    # from its first sample: the priming's frame rebuilt from one packet (exactly, for silence), the rest the same
    first = np.abs(got[:AAC].astype(int) - every[AAC:2 * AAC].astype(int)).max()
    assert first == 0 if edge == "silent lead" else first <= 2 * QUIET_PEAK, first
    assert np.array_equal(got[AAC:], every[2 * AAC:])


def test_retry_after_is_the_soonest_planned_end_at_each_streams_own_pace():
    # (elapsed, audio sent, audio expected): 10 s left at twice real time is 5 s; 6 s left at real time is 6 s
    assert retry_after_s([(2.0, 4.0, 14.0), (1.0, 1.0, 7.0)]) == 5
    # before its first audio a stream is taken at real time; fractions round up
    assert retry_after_s([(0.5, 0.0, 3.2)]) == 4
    # a stream past what its text should make, an empty set, and a long wait are clamped
    assert retry_after_s([(9.0, 12.0, 10.0)]) == 1
    assert retry_after_s([]) == 1
    assert retry_after_s([(1.0, 0.1, 1000.0)]) == RETRY_AFTER_MAX_S


def test_expected_audio_follows_the_text_and_the_speed():
    text = "x" * int(SPEECH_CHARS_PER_S * 10)
    assert expected_audio_s(text) == pytest.approx(10.0)
    assert expected_audio_s(text, speed=2.0) == pytest.approx(5.0)


def test_an_error_carries_its_headers():
    err = ApiError(429, "busy", "too_many_requests", "rate_limit_error", headers={"Retry-After": "3"})
    assert err.headers == {"Retry-After": "3"} and ApiError(400, "x", "y").headers == {}
