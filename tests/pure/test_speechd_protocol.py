"""The speech-dispatcher module's side of speechd's module protocol, fed scripted stdin (voiceapp.speechd.module
`run_module` and `ModuleProtocol`), and what it makes of a message's SSML (voiceapp.speechd.ssml). The real daemon
and real playback: tests/audio/test_speechd.py."""
from __future__ import annotations

import io
import random
import threading

import pytest

from engine.voices import Voice, VoiceBank
from voiceapp.speechd.module import (ModuleConfig, ModuleProtocol, Output, Settings, Speaker, choose_voice,
                                     config_text, read_config, run_module, sentence_count)
from voiceapp.speechd.ssml import Segment, segments


class RecordingSpeaker:
    """Stands in for the engine side: records what the protocol asks of it."""

    def __init__(self, busy: bool = False) -> None:
        self.calls: list[tuple] = []
        self.busy = busy

    def prepare(self) -> None:
        self.calls.append(("prepare",))

    def speak(self, kind, text, settings) -> bool:
        self.calls.append(("speak", kind, text, settings))
        return not self.busy

    def stop(self) -> None:
        self.calls.append(("stop",))

    def pause(self) -> None:
        self.calls.append(("pause",))

    def voices(self):
        return [("ava", "en"), ("leo", "en"), ("ava", "zh")]

    def close(self) -> None:
        self.calls.append(("close",))


def converse(script: str, speaker=None) -> tuple[list[str], RecordingSpeaker]:
    """Feed `script`'s lines; the reply lines and the speaker."""
    speaker = speaker or RecordingSpeaker()
    out = io.StringIO()
    protocol = ModuleProtocol(Output(out), speaker)
    for line in script.split("\n"):
        protocol.feed(line)
    return out.getvalue().splitlines(), speaker


def test_a_session_init_set_speak_stop_list_quit():
    replies, speaker = converse("INIT\nAUDIO\naudio_output_method=pulse\n.\nSET\nvoice=female1\nrate=-20\n"
                                "synthesis_voice=NULL\nlanguage=en\n.\nSPEAK\n<speak>Hello.\n..dots\n</speak>\n.\n"
                                "STOP\nPAUSE\nLIST VOICES zh\nQUIT")
    assert replies == ["299-voiceapp: the engine server speaks (started when needed)", "299 OK LOADED SUCCESSFULLY",
                       "207 OK RECEIVING AUDIO SETTINGS", "203 OK AUDIO INITIALIZED",
                       "203 OK RECEIVING SETTINGS", "203 OK SETTINGS RECEIVED",
                       "202 OK RECEIVING MESSAGE", "200 OK SPEAKING",
                       "200-ava\tzh\tnone", "200 OK VOICE LIST SENT", "210 OK QUIT"]
    assert speaker.calls[0] == ("prepare",)
    _, kind, text, settings = speaker.calls[1]
    assert kind == "text" and text == "<speak>Hello.\n.dots\n</speak>"  # a body line's extra leading dot goes
    assert settings == Settings(voice_type="female1", synthesis_voice="NULL", language="en", rate="-20", pitch="0")
    assert [c[0] for c in speaker.calls[2:]] == ["stop", "pause", "close"]


@pytest.mark.parametrize("script, reply", [
    ("INIT\nBOGUS", "300 ERR UNKNOWN COMMAND"),
    ("INIT\nSET\nno equals sign\n.", "302 ERROR BAD SYNTAX"),
    ("INIT\nSPEAK\n   \n.", "301 ERROR CANT SPEAK"),
    ("INIT\nCHAR\na\nb\n.", "305 DATA MORE THAN ONE LINE"),
    ("INIT\nLIST VOICES fr", "304 CANT LIST VOICES"),
    ("SPEAK", "399 ERR CANT INIT MODULE"),
])
def test_bad_commands_get_speechds_error_replies(script, reply):
    replies, _ = converse(script)
    assert replies[-1] == reply


def test_a_message_while_one_plays_is_refused():
    replies, _ = converse("INIT\nSPEAK\nHi.\n.", RecordingSpeaker(busy=True))
    assert replies[-1] == "301 ERROR CANT SPEAK"


def test_random_garbage_never_breaks_the_parser():
    rng = random.Random(5)
    words = ["INIT", "SPEAK", "SET", ".", "..", "STOP", "LIST VOICES", "x=1", "=", "\x00", "ü", "AUDIO", "KEY", ""]
    for _ in range(200):
        replies, _ = converse("\n".join(rng.choice(words) for _ in range(rng.randrange(1, 30))))
        assert all(line[:3].isdigit() for line in replies if line), replies


def test_the_module_process_loop_answers_and_quits(tmp_path):
    """`run_module` on scripted stdin, with a configuration as install writes it (fake backend: no engine is
    started, since no message is spoken)."""
    conf = tmp_path / "voiceapp.conf"
    conf.write_text(config_text(["--backend", "fake", "--seed", "0"], {"MALE1": "leo"}, "ava", tmp_path / "log"))
    out = io.StringIO()
    code = run_module(str(conf), io.StringIO("INIT\nLIST VOICES\nQUIT\n"), out)
    lines = out.getvalue().splitlines()
    assert code == 0 and lines[1] == "299 OK LOADED SUCCESSFULLY" and lines[-1] == "210 OK QUIT"
    assert "200-leo\ten\tnone" in lines and "200-leo\tzh\tnone" in lines
    assert "] started (" in (tmp_path / "log").read_text()


def test_a_broken_configuration_fails_init_with_a_reason(tmp_path):
    conf = tmp_path / "voiceapp.conf"
    conf.write_text("Nonsense here\n")
    out = io.StringIO()
    assert run_module(str(conf), io.StringIO("INIT\n"), out) == 1
    assert out.getvalue().splitlines()[-1] == "399 ERR CANT INIT MODULE"


def test_configuration_round_trip(tmp_path):
    path = tmp_path / "c.conf"
    path.write_text(config_text(["--model", "/a b/m's", "--seed", "3"], {"FEMALE1": "ava"}, "mia", tmp_path / "l"))
    config = read_config(path)
    assert config == ModuleConfig(["--model", "/a b/m's", "--seed", "3"], {"FEMALE1": "ava"}, "mia", tmp_path / "l")


def test_the_default_voice_is_the_familys_own_and_it_lists_the_familys_languages(orpheus_tiny):
    from engine.families import family

    voices = family("orpheus").voices().all()
    config = ModuleConfig(["--model", str(orpheus_tiny)], {"FEMALE1": "tara"}, "default")
    assert choose_voice(Settings(voice_type="male3"), config, voices, "tara") == "tara"
    assert choose_voice(Settings(voice_type="female1"), config, voices, "tara") == "tara"
    speaker = Speaker(config, Output(io.StringIO()), lambda line: None)
    try:
        assert speaker.choose_voice(Settings()) == "tara"
        assert {language for _, language in speaker.voices()} == {"en"}
        assert {name for name, _ in speaker.voices()} == set(voices)
    finally:
        speaker.close()


def test_voice_types_whatever_the_users_voices_and_language():
    voices = {**VoiceBank().all(), "mine": Voice(name="mine", gender="female", global_tokens=(1,) * 32)}
    config = ModuleConfig([], {"MALE1": "ava", "FEMALE1": "ava", "FEMALE2": "mia", "MALE2": "max"}, "ava")
    assert choose_voice(Settings(voice_type="female1"), config, voices, "ava") == "ava"
    assert choose_voice(Settings(voice_type="FEMALE2", language="NULL"), config, voices, "ava") == "mia"
    assert choose_voice(Settings(voice_type="male2", language="C"), config, voices, "ava") == "max"
    assert choose_voice(Settings(synthesis_voice="mine", voice_type="male2"), config, voices, "ava") == "mine"
    assert choose_voice(Settings(synthesis_voice="nobody", voice_type="child_male"), config, voices, "ava") == "ava"
    assert choose_voice(Settings(voice_type="female1", pitch="-60"), config, voices, "ava") == "mia"  # lower: mia


# ---- SSML ----------------------------------------------------------------------------------------------------------

def test_marks_cut_the_text_in_order():
    got = segments('<speak><mark name="a"/>One. <mark name="b"/>Two &amp; <emphasis>three</emphasis>.'
                   '<mark name="c"/><mark name="d"/></speak>')
    assert got == [Segment(("a",), "One."), Segment(("b",), "Two & three."), Segment(("c", "d"), "")]


@pytest.mark.parametrize("data, text", [
    ("plain text, no tags", "plain text, no tags"),
    ("1 < 2 and 3 > 2", "1 < 2 and 3 > 2"),
    ("<speak>unclosed <s>nesting</p> here", "unclosed nesting here"),
    ("<speak><s>a</s><s>b</s></speak>", "a b"),
    ("<speak>bad & amp; <b", "bad & amp; <b"),  # a tag cut off at the end stays text
    ("<speak>&lt;tag&gt; &#65; &bogus;</speak>", "<tag> A &bogus;"),
    ("<<<>>>", "<<<>>>"),
])
def test_odd_ssml_is_spoken_as_its_text(data, text):
    assert " ".join(s.text for s in segments(data) if s.text) == text


def test_any_bytes_give_segments_without_error():
    rng = random.Random(1)
    alphabet = '<>/="&;#x mark name speak \n.abcé'
    for _ in range(500):
        segments("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))))


def test_sentence_counts_add_up_across_lines():
    parts = ["It's ok. Bye!", "Dr. Smith came.", "...", "Last one"]
    assert [sentence_count(p) for p in parts] == [2, 1, 0, 1]
    assert sum(sentence_count(p) for p in parts) == sentence_count("\n".join(parts))


def test_output_sends_whole_replies_from_threads():
    out = io.StringIO()
    o = Output(out)
    threads = [threading.Thread(target=lambda i=i: [o.send(f"700-{i}", "700 INDEX MARK") for _ in range(50)])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert all(lines[k].startswith("700-") and lines[k + 1] == "700 INDEX MARK" for k in range(0, len(lines), 2))
