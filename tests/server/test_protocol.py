"""The wire format on its own: frames round-trip, and every malformed frame is a ProtocolError, never a crash."""
import asyncio
import json

import numpy as np
import pytest

from engine.events import FirstAudio, Notice, RequestFinished, SentenceFinished
from engine.protocol import (AUDIO_PREFIX, HEADER, MAX_AUDIO_SAMPLES, MAX_FRAME_BYTES, AudioFrame, ProtocolError,
                             encode_audio, encode_message, event_message, parse_event, read_frame)


async def frames_of(data: bytes):
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out = []
    while (frame := await read_frame(reader)) is not None:
        out.append(frame)
    return out


async def test_json_and_audio_frames_round_trip():
    samples = np.linspace(-1, 1, 1000, dtype=np.float32)
    data = encode_message({"type": "say", "text": "h\u00e9llo"}) + b"".join(encode_audio(3, samples, True, False, 1.5))
    msg, audio = await frames_of(data)
    assert msg == {"type": "say", "text": "h\u00e9llo"}
    assert isinstance(audio, AudioFrame) and audio.sentence_index == 3 and audio.sentence_end and not audio.pause
    assert audio.age_s == 1.5
    assert audio.samples.dtype == np.float32 and audio.samples.tobytes() == samples.tobytes()


async def test_long_audio_is_split_and_flags_go_on_the_last_piece():
    samples = np.arange(MAX_AUDIO_SAMPLES + 10, dtype=np.float32)
    frames = await frames_of(b"".join(encode_audio(0, samples, sentence_end=True, pause=False)))
    assert len(frames) == 2 and [f.sentence_end for f in frames] == [False, True]
    assert np.concatenate([f.samples for f in frames]).tobytes() == samples.tobytes()


async def test_clean_end_between_frames_is_none_and_mid_frame_is_incomplete():
    assert await frames_of(b"") == []
    with pytest.raises(asyncio.IncompleteReadError):
        await frames_of(encode_message({"type": "x"})[:-2])


@pytest.mark.parametrize("data,code", [
    (HEADER.pack(b"J", MAX_FRAME_BYTES + 1), "too-big"),
    (HEADER.pack(b"J", 0xFFFFFFFF), "too-big"),
    (HEADER.pack(b"Z", 2) + b"{}", "bad-frame"),
    (HEADER.pack(b"J", 9) + b"{not json", "bad-json"),
    (HEADER.pack(b"J", 4) + b"\xff\xfe{}", "bad-json"),
    (HEADER.pack(b"J", 5) + b"[1,2]", "bad-json"),
    (HEADER.pack(b"J", 12) + b'{"type": 42}', "bad-json"),
    (HEADER.pack(b"A", 7) + b"\0" * 7, "bad-frame"),
    (HEADER.pack(b"A", 3) + b"\0" * 3, "bad-frame"),
    (HEADER.pack(b"A", 9) + AUDIO_PREFIX.pack(0, 0, float("nan")), "bad-frame"),
    (HEADER.pack(b"A", 9) + AUDIO_PREFIX.pack(0, 0, -1.0), "bad-frame"),
])
async def test_malformed_frames_raise_protocol_errors(data, code):
    with pytest.raises(ProtocolError) as err:
        await frames_of(data)
    assert err.value.code == code


def test_deep_nesting_is_refused_before_the_json_parser_recurses(monkeypatch):
    """A hostile frame of deep nesting never reaches json.loads (whose recursion would take the server's thread to
    the interpreter's limit, where any finalizer that runs then fails); a message as deep as MAX_JSON_DEPTH, and
    brackets inside strings, still parse."""
    from engine import protocol
    from engine.protocol import MAX_JSON_DEPTH, parse_payload

    deep_enough = {"type": "say", "x": json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)),
                   "text": '"[[{' * 100}
    assert parse_payload(b"J", json.dumps(deep_enough).encode()) == deep_enough
    parsed = []
    monkeypatch.setattr(protocol.json, "loads", lambda text: parsed.append(text))
    for hostile in (b"[" * 200_000, b'{"type": "say", "x": ' + b"[" * (MAX_JSON_DEPTH + 1)):
        with pytest.raises(ProtocolError, match="too deeply"):
            parse_payload(b"J", hostile)
    assert parsed == []


def test_oversized_messages_are_refused_when_encoding():
    with pytest.raises(ValueError):
        encode_message({"type": "text", "text": "x" * MAX_FRAME_BYTES})


def test_events_are_relayed_with_the_clients_request_id_and_infinite_rtf_survives_json():
    msg = event_message(RequestFinished("server-id", audio_s=0.0, wall_s=1.0, rtf=float("inf"), tokens=0,
                                        cancelled=True))
    msg = json.loads(json.dumps(msg, allow_nan=False))
    event = parse_event(msg, "client-id")
    assert isinstance(event, RequestFinished) and event.request_id == "client-id" and event.rtf == float("inf")
    assert isinstance(parse_event(event_message(SentenceFinished("s", 2, 40, False)), "c"), SentenceFinished)
    assert isinstance(parse_event(event_message(Notice("hi")), "c"), Notice)
    assert event_message(FirstAudio("s", 0.1)) is None  # measured by the client itself
    assert parse_event({"type": "event", "event": "os.system", "data": {}}, "c") is None
    assert parse_event({"type": "event", "event": "SentenceFinished", "data": {"bogus": 1}}, "c") is None
