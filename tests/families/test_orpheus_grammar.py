"""The Orpheus grammar: frame parsing on hand-made id sequences, prompt ids, prompt text with tags. Pure, fast."""
import subprocess
import sys

import pytest

from engine.families.orpheus import grammar as g
from engine.families.orpheus.grammar import FrameParser, audio_id, build_prompt, keep_tags, prompt_text


def ids_of(*frames):
    """The token ids of frames of codes (the inverse of what FrameParser does)."""
    return [audio_id(k, c) for frame in frames for k, c in enumerate(frame)]


F1 = (0, 4095, 17, 1, 2048, 3, 4094)
F2 = (5, 6, 7, 8, 9, 10, 11)


def test_the_constants_match_the_release():
    assert g.AUDIO_BASE == 128266 and g.AUDIO_END == 128266 + 7 * 4096 == 156938
    assert (g.START_OF_SPEECH, g.END_OF_SPEECH, g.START_OF_HUMAN, g.END_OF_HUMAN, g.START_OF_AI) == (
        128257, 128258, 128259, 128260, 128261)
    assert g.AUDIO_END <= g.VOCAB_SIZE == 156940
    assert audio_id(0, 0) == 128266 and audio_id(3, 5) == 128266 + 3 * 4096 + 5 and audio_id(6, 4095) == 156937


def test_whole_frames_come_out_with_position_offsets_removed():
    frames, p = g.parse_all([*ids_of(F1, F2), g.END_OF_SPEECH])
    assert frames == [F1, F2]
    assert (p.done, p.stop_id, p.semantic_count, p.ignored, p.wrapped, p.dropped) == (True, 128258, 2, 0, 0, 0)


def test_frames_span_deltas_of_any_size():
    ids = ids_of(F1, F2)
    p = FrameParser()
    out = [p.feed(ids[:3]), p.feed(ids[3:6]), p.feed(ids[6:7]), p.feed([]), p.feed(ids[7:13]), p.feed(ids[13:])]
    assert out == [[], [], [F1], [], [], [F2]]
    assert p.pending == 0 and not p.done


def test_a_partial_frame_waits_until_it_is_whole():
    p = FrameParser()
    assert p.feed(ids_of(F1)[:5]) == [] and p.pending == 5 and p.semantic_count == 0
    assert p.feed(ids_of(F1)[5:]) == [F1] and p.pending == 0


def test_a_stop_mid_frame_drops_the_partial_frame_and_ends_the_stream():
    p = FrameParser()
    frames = p.feed([*ids_of(F1), *ids_of(F2)[:4], g.END_OF_SPEECH, *ids_of(F2)])
    assert frames == [F1]
    assert (p.done, p.dropped, p.pending, p.semantic_count) == (True, 4, 0, 1)
    assert p.feed(ids_of(F2)) == [] and p.ignored == 0  # after the stop nothing is read or counted


def test_non_audio_ids_are_counted_and_do_not_advance_the_position():
    ids = ids_of(F1)
    noisy = [g.BEGIN_OF_TEXT, *ids[:2], 42, g.START_OF_SPEECH, *ids[2:], g.AUDIO_END, g.AUDIO_END + 1,
             g.AUDIO_BASE - 1]
    frames, p = g.parse_all(noisy)
    assert frames == [F1] and p.ignored == 6 and p.wrapped == 0 and not p.done


def test_an_id_from_another_positions_block_is_wrapped_and_counted():
    ids = ids_of(F1)
    ids[2] = audio_id(0, 123)  # position 2 holds a position-0 id: code 123 - 2*4096 wraps to 123
    ids[5] = audio_id(6, 7)    # position 5 holds a position-6 id: wraps to 7
    frames, p = g.parse_all(ids)
    assert frames == [(F1[0], F1[1], 123, F1[3], F1[4], 7, F1[6])]
    assert p.wrapped == 2 and p.ignored == 0


def test_the_stop_set_can_be_widened():
    p = FrameParser(stop_ids=(g.END_OF_SPEECH, g.END_OF_AI))
    assert p.feed([*ids_of(F1), g.END_OF_AI]) == [F1] and p.stop_id == g.END_OF_AI


def test_levels_split_in_the_reference_decoders_order():
    assert g.split_levels([F1, F2]) == ([0, 5], [4095, 2048, 6, 9], [17, 1, 3, 4094, 7, 8, 10, 11])


# --------------------------------------------------------------------------------------------------- prompts

def fake_encode(text):
    """A stand-in tokenizer: one id per byte, offset so no id collides with a special."""
    return [1000 + b for b in text.encode()]


@pytest.mark.parametrize("voice", g.VOICES)
def test_prompt_ids_for_every_voice(voice):
    prompt = build_prompt("Hi there.", voice, fake_encode)
    body = [1000 + b for b in f"{voice}: Hi there.".encode()]
    assert list(prompt.ids) == [128000, 128259, 128000, *body, 128009, 128260, 128261, 128257]


def test_allowed_ids_are_the_audio_ids_and_the_stop_built_once():
    a = build_prompt("Hi.", "tara", fake_encode).allowed_ids
    b = build_prompt("Bye.", "zoe", fake_encode).allowed_ids
    assert a is b and list(a) == sorted(a)
    assert set(a) == {128258, *range(128266, 156938)} and len(a) == 7 * 4096 + 1


def test_emotion_tags_reach_the_prompt_and_other_tags_do_not():
    prompt = build_prompt("So <laugh> funny <whisper> really <|eot_id|> <custom_token_5>", "leo", fake_encode)
    assert bytes(i - 1000 for i in prompt.ids[3:-4]).decode() == "leo: So <laugh> funny really"


def test_unknown_voice_empty_text_and_special_ids_are_refused():
    with pytest.raises(ValueError, match="unknown voice"):
        build_prompt("Hi.", "julia", fake_encode)
    assert build_prompt("Hi.", "julia", fake_encode, voices=("julia",)).ids[3] == 1000 + ord("j")
    with pytest.raises(ValueError, match="non-empty"):
        build_prompt("  <whisper> ", "tara", fake_encode)
    with pytest.raises(ValueError, match="special or audio token id 128000"):
        build_prompt("Hi.", "tara", lambda s: [128000, *fake_encode(s)])


@pytest.mark.parametrize("raw, spoken", [
    ("Hello <laugh>, it cost $5.", "Hello <laugh>, it cost five dollars."),
    ("<SIGH> Dr. Smith <yawn>", "<sigh> Doctor Smith <yawn>"),
    ("Psst <whisper> it is 3 <|eot_id|> now <custom_token_12>.", "Psst it is three now."),
    ("a < b > c", "a less than b greater than c"),
    ("<gasp><cough>", "<gasp> <cough>"),
])
def test_prompt_text_normalizes_around_kept_tags(raw, spoken):
    assert prompt_text(raw) == spoken


def test_keep_tags_knows_every_emotion_tag():
    text = " ".join(g.EMOTION_TAGS)
    assert keep_tags(text) == text and keep_tags("<foo> <bar/> </laugh>") == ""


@pytest.mark.parametrize("module", ["engine.families.orpheus.grammar", "engine.families.orpheus.checkpoint"])
def test_pure_orpheus_modules_import_no_torch(module):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert not {"torch", "transformers", "tokenizers", "safetensors", "snac"} & loaded
