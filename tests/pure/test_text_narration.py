"""engine.text's narrator readings: book references, Roman numerals in titles and regnal names, years with a cue;
and the look-alikes they must leave alone."""
import pytest

from engine.text import normalize


@pytest.mark.parametrize("raw,spoken", [
    ("See p. 5 and pp. 10-12.", "See page five and pages ten to twelve."),
    ("Ch. 3, vol. 2, fig. 4.", "Chapter three, volume two, figure four."),
    ("See vol. II and p. iv.", "See volume two and page four."),
    ("CHAPTER IV. THE STORM.", "CHAPTER four. THE STORM."),
    ("PART II, CHAPTER I.", "PART two, CHAPTER one."),
    ("Chapter XLII", "Chapter forty-two"),
    ("in chapter vi we read", "in chapter six we read"),
    ("Henry VIII had six wives.", "Henry the Eighth had six wives."),
    ("Elizabeth I and Louis XIV met.", "Elizabeth the First and Louis the Fourteenth met."),
    ("In 1066 the Normans came.", "In ten sixty-six the Normans came."),
    ("It was 1066 AD.", "It was ten sixty-six A D."),
    ("By 55 BC Caesar had come.", "By fifty-five B C Caesar had come."),
    ("since 1999", "since nineteen ninety-nine"),
])
def test_narration(raw, spoken):
    assert normalize(raw) == spoken


@pytest.mark.parametrize("raw,spoken", [
    ("Then I went home.", "Then I went home."),  # the pronoun
    ("the part I liked", "the part I liked"),
    ("World War II ended.", "World War II ended."),  # not a regnal name
    ("We left at 7 p.m.", "We left at seven p m."),
    ("the book mix", "the book mix"),
    ("She paid 1066 dollars.", "She paid one thousand sixty-six dollars."),  # no year cue
])
def test_look_alikes_are_left_alone(raw, spoken):
    assert normalize(raw) == spoken
