"""Provides text preparation for speech: `SentenceSplitter` cuts raw text into sentences, `normalize()` speaks one.

Order: split first, then normalize each sentence (`[normalize(s) for s in split_sentences(raw)]`). The splitter sees
the raw text, so "Dr. Smith", "3.14", "e.g. this" and "example.com" are visible as what they are; `normalize` then
expands them inside the sentence. Both are pure str -> str (stdlib only) and never raise on odd input.
`sentence_token_cap` bounds how long the model may speak one normalized sentence; `text_pieces` cuts a long text
into the pieces it is fed in.

Rules chosen by `normalize` (documented here once; the tests hold one example of each):
- Markup, first: HTML entities are decoded ("&amp;" "&", "&#8217;" "'", "&nbsp;" a space); comments
  ("<!-- ... -->", an unclosed one to the end of the text) and declarations ("<!DOCTYPE html>", "<?xml ...?>")
  are dropped. A word in angle brackets is a tag, dropped with everything inside it, when it has attributes
  (`<a title="Dr. Who">`), a slash (`</b>`, `<br/>`), or is a known element name in lower or upper case (HTML's,
  SSML's, and the emotion tags some voices render such as `<laugh>`: `_MARKUP_NAMES`); any other lone word is
  text and keeps its word ("Press <Enter>" "Press Enter", and so "<Option>" though `option` is an HTML element).
  `SentenceSplitter` never ends a sentence inside a tag or a comment, so nothing inside one is split or spoken.
- Unicode: ANSI escapes, control/format/zero-width/bidi characters, unpaired surrogates, combining marks left over
  after NFKC, emoji and other pictographs are dropped; smart quotes, dashes and the ellipsis become ASCII; every
  newline, tab or Unicode space becomes one space (sentence breaks at newlines are the splitter's job).
- Numbers: cardinals in US style without "and" ("one hundred five"); "1,234" grouped -> cardinal; a bare 4-digit
  integer 1100..2099 is read as a year ("nineteen ninety-nine", "two thousand five", "twenty twenty-four");
  digit runs over 9 digits, or with a leading zero, are read digit by digit; "3.14" -> "three point one four";
  "1990s" -> "nineteen nineties"; "5-10" -> "five to ten"; "555-1234" and 3+ dashed groups -> digit groups;
  proper fractions over 2,3,4,5,6,8,10,16,32,100 ("1/2", "3 3/4"); other a/b read "a slash b".
- Money: "$1.50" -> "one dollar and fifty cents" (exactly two decimals are cents), "$3.2 million", "$5M";
  also € £ ¥ ₹ ₩ and the codes USD EUR GBP JPY INR after the amount.
- Dates: ISO "2024-03-15", month names ("March 15, 2024", "15 March 2024", "Sept. 1999") and slashed dates with
  a four-digit year: month first ("3/4/2025" is March fourth), day first only when the first number cannot be a
  month ("15/03/2024" is March fifteenth). A date is read as one only when it exists on the calendar; otherwise
  ("2/30/2024", "13/40/2024", "2/29/2023") each number is read with "slash" between, as any other a/b/c.
- Times: "3:30 pm" -> "three thirty p m", "14:05" -> "fourteen oh five", "9:00" -> "nine o'clock",
  "18:00" -> "eighteen hundred", "7am" -> "seven a m".
- Narration: "p. 5" "page five" ("pp." pages, "ch." chapter, "vol." volume, "fig." figure: only before a number);
  a Roman numeral after a title word, "Chapter IV" "Chapter four" (not "I" after a lowercase word: "the part I
  liked"), and after a regnal name, "Henry VIII" "Henry the Eighth" (names listed: "World War II" stays); a
  four-digit number after a year cue ("in 1066") or before an era ("1066 AD") is a year, "ten sixty-six".
- Abbreviations: "Dr." is Doctor, but Drive after a capitalized name and not before one ("Elm Dr."); "St." is
  Saint before a capitalized word, otherwise Street. A sentence-final "etc." keeps its period.
- Units only right after a number ("5 km", "20°C", "1 h"); single letters (m, s, g, h) only as whole words.
- Symbols: & and, @ at, + plus, = equals, # before a number "number", % percent, ° degrees; others that cannot be
  spoken (emoji, *, _, |, ^, brackets other than parentheses, stray currency signs) are dropped.
"""
from __future__ import annotations

import calendar
import html
import math
import re
import unicodedata
from re import Match
from typing import Iterator

# ---------------------------------------------------------------------------------------------------------------
# Number words

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ("", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion", "sextillion",
           "septillion", "octillion", "nonillion", "decillion")
_ORDINAL_WORDS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                  "nine": "ninth", "twelve": "twelfth"}
_MAX_PLAIN_DIGITS = 9
"""A plain digit run longer than this is an id or phone number, read digit by digit; commas make it a cardinal."""
_MAX_GROUPED_DIGITS = 3 * len(_SCALES)


def _cardinal(n: int) -> str:
    """US English cardinal: 123 -> "one hundred twenty-three"."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {_cardinal(rest)}" if rest else "")
    parts = []
    for scale in _SCALES:
        n, group = divmod(n, 1000)
        if group:
            parts.append(f"{_cardinal(group)} {scale}".rstrip())
        if not n:
            break
    return " ".join(reversed(parts))


def _ordinal(n: int) -> str:
    """22 -> "twenty-second"."""
    words = _cardinal(n)
    split = re.match(r"(.*?)([a-z]+)$", words)
    assert split is not None, words  # a cardinal ends in a word
    head, last = split.groups()
    if last in _ORDINAL_WORDS:
        return head + _ORDINAL_WORDS[last]
    return head + (last[:-1] + "ieth" if last.endswith("y") else last + "th")


def _year(n: int) -> str:
    """Year reading: 1999 "nineteen ninety-nine", 1905 "nineteen oh five", 1900 "nineteen hundred", 2005 cardinal."""
    if n % 1000 < 10 or not 1000 <= n <= 9999:
        return _cardinal(n)
    century, rest = divmod(n, 100)
    if rest == 0:
        return f"{_cardinal(century)} hundred"
    return f"{_cardinal(century)} " + (f"oh {_ONES[rest]}" if rest < 10 else _cardinal(rest))


def _digits(digits: str) -> str:
    return " ".join(_ONES[int(d)] for d in digits)


def _integer(digits: str, *, as_year: bool = False) -> str:
    """Digit string (may hold thousands commas) -> words, by the module's rules for ids, years and groups."""
    if "," in digits:
        digits = digits.replace(",", "")
        return _cardinal(int(digits)) if len(digits) <= _MAX_GROUPED_DIGITS else _digits(digits)
    if (len(digits) > 1 and digits[0] == "0") or len(digits) > _MAX_PLAIN_DIGITS:
        return _digits(digits)
    n = int(digits)
    if as_year and len(digits) == 4 and 1100 <= n <= 2099:
        return _year(n)
    return _cardinal(n)


def _number(text: str, *, as_year: bool = False) -> str:
    """Signed decimal string ("-1,234.56", "+3", ".5") -> words."""
    sign = ""
    if text[:1] in "+-":
        sign, text = ("minus " if text[0] == "-" else "plus "), text[1:]
    whole, _, frac = text.partition(".")
    words = _integer(whole, as_year=as_year and not sign and not frac) if whole else ""
    if frac:
        words = f"{words} point {_digits(frac)}".lstrip()
    return sign + words


def _plural(word: str) -> str:
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


# ---------------------------------------------------------------------------------------------------------------
# Unicode cleanup

_CHAR_MAP = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u02bc": "'", "\u2039": "'",
    "\u203a": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "\u00ab": '"',
    "\u00bb": '"', "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2212": "-", "\u2014": " - ",
    "\u2015": " - ", "\u2026": "...", "\u2044": "/", "\u00b0": "\u00b0", "\u00d7": " times ",
    "\u00f7": " divided by ", "\u00b1": " plus or minus ", "\u2248": " approximately ", "\u2260": " not equal to ",
    "\u2264": " less than or equal to ", "\u2265": " greater than or equal to ", "\u221e": " infinity ",
    "\u00a7": " section ", "\u3002": ". ", "\uff61": ". ", "\u3001": ", ", "\u0085": " ",
}
"""Non-ASCII characters with a spoken or ASCII form, applied after NFKC."""

_BEFORE_NFKC = {ord("\u00b2"): " squared ", ord("\u00b3"): " cubed ", ord("\u00ba"): "\u00b0", ord("\u2122"): " ",
                ord("\u00ae"): " ", ord("\u00a9"): " ", ord("\u2120"): " "}
"""Characters whose NFKC form would be misread ("m²" -> "m2", "™" -> "TM"); vulgar fractions get a leading space."""
_BEFORE_NFKC.update({cp: " " + unicodedata.normalize("NFKC", chr(cp)).replace("\u2044", "/")
                     for cp in (*range(0x2150, 0x215F), 0xBC, 0xBD, 0xBE)})


def _map_char(ch: str) -> str:
    """What one character becomes after NFKC: itself, an ASCII/spoken replacement, a space, or nothing."""
    if ch in _CHAR_MAP:
        return _CHAR_MAP[ch]
    if ch in "\t\n\r\v\f":
        return " "
    category = unicodedata.category(ch)
    if category == "Cc":
        return " "  # the character goes, the word boundary it may have marked stays
    if ch.isascii():
        return ch
    if category == "Nd":
        return str(unicodedata.decimal(ch))
    if category[0] == "L" or category in ("Mc", "Sc"):
        return ch
    if category[0] in "ZP":
        return " "
    return ""  # Cf/Cs/Co/Cn (format, surrogate, private, unassigned), Mn/Me marks, So/Sk/Sm symbols, No/Nl


class _CharTable(dict):
    """str.translate table filled on first sight of each code point, so repeated text runs at C speed."""

    def __missing__(self, code: int) -> str:
        value = self[code] = _map_char(chr(code))
        return value


_CHAR_TABLE = _CharTable()
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean_unicode(text: str) -> str:
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if not text.isascii():
        if _SURROGATE.search(text):  # pairs become their character, lone halves U+FFFD (dropped below)
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        text = unicodedata.normalize("NFKC", text.translate(_BEFORE_NFKC))
    return text.translate(_CHAR_TABLE)


# ---------------------------------------------------------------------------------------------------------------
# Shared pattern pieces and helpers

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
"""An unsigned number: plain or comma-grouped integer, optional decimals."""
_SIGNED = rf"(?<![\w.])[-+]?{_NUM}"
_END_AFTER = re.compile(r"[\"')\]]*\s*$")


def _period_if_end(m: Match[str], dot: str | None) -> str:
    """A consumed abbreviation period that also ends the text (the splitter's sentence) is given back."""
    return "." if dot and _END_AFTER.match(m.string, m.end()) else ""


_NEXT_CAPITALIZED = re.compile(r"\s*[A-Z]")
_PREV_CAPITALIZED = re.compile(r"(?:^|\s)[A-Z]\w*\s*$")


def _next_capitalized(text: str, i: int) -> bool:
    return bool(_NEXT_CAPITALIZED.match(text, i))


def _prev_capitalized(text: str, i: int) -> bool:
    return bool(_PREV_CAPITALIZED.search(text[max(0, i - 40):i]))


# ---------------------------------------------------------------------------------------------------------------
# Addresses

_TLDS = ("com|org|net|edu|gov|mil|io|dev|ai|app|co|uk|de|fr|eu|nl|es|ca|au|jp|cn|ru|br|ch|se|info|biz|tv|ly|gg|"
         "xyz|tech|cloud|sh|fm")
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_URL = re.compile(r"(?<![\w@/.-])(?:(?:https?|ftp)://[^\s<>\"']+|www\.[^\s<>\"']+"
                  rf"|(?:[A-Za-z0-9-]+\.)+(?:{_TLDS})(?![\w-])(?:/[^\s<>\"']*)?)", re.I)
_ADDRESS_SYMBOL = re.compile(r"[./\-_?=&#%:~+@]")
_ADDRESS_WORDS = {".": "dot", "/": "slash", "-": "dash", "_": "underscore", "?": "question mark", "=": "equals",
                  "&": "and", "#": "hash", "%": "percent", ":": "colon", "~": "tilde", "+": "plus", "@": "at"}


def _say_address(m: Match[str]) -> str:
    """URL or e-mail -> "example dot com slash a"; the scheme and trailing sentence punctuation are not read."""
    address = m.group().rstrip(".,;:!?)]}'\"")
    tail = m.group()[len(address):]
    address = re.sub(r"^[a-z]+://", "", address, flags=re.I).rstrip("/")
    if address[:4].lower() == "www.":
        address = "w w w." + address[4:]
    spoken = _ADDRESS_SYMBOL.sub(lambda s: f" {_ADDRESS_WORDS[s.group()]} ", address)
    return f" {spoken} {tail}"


# ---------------------------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------------------------
# A narrator's readings: book references, Roman numerals, years with a cue

_REFERENCE_WORDS = {"p": "page", "pp": "pages", "ch": "chapter", "chap": "chapter", "vol": "volume",
                    "vols": "volumes", "fig": "figure", "figs": "figures"}
_ROMAN = r"M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})"
_REFERENCE = re.compile(r"(?<![\w.])([Pp][Pp]?|[Cc][Hh](?:[Aa][Pp])?|[Vv][Oo][Ll][Ss]?|[Ff][Ii][Gg][Ss]?)\.\s*"
                        r"(?=\d|(?=[IVXLCDM])(?:" + _ROMAN +
                        r")\b|[ivxl]{1,6}\b)")
_TITLE_WORDS = ("chapter|part|book|volume|vol|act|scene|canto|section|appendix|letter|psalm|page|chapters|parts|"
                "books|volumes|pages")
_TITLE_NUMERAL = re.compile(r"(?<![\w.])(?i:(" + _TITLE_WORDS + r"))\s+(?:(?=[IVXLCDM])(" + _ROMAN +
                            r")|([ivxl]{1,6}))\b(?!')")
_REGNAL_NAMES = ("Alexander|Alfonso|Alfred|Anne|Benedict|Boniface|Carlos|Catherine|Charles|Christian|Clement|Constantine|"
                 "Cyrus|David|Edward|Elizabeth|Ferdinand|Francis|Frederick|George|Gregory|Gustav|Gustavus|Harold|"
                 "Henry|Innocent|Isabella|James|Joanna|John|Juan|Leo|Leopold|Louis|Ludwig|Malcolm|Mary|Napoleon|"
                 "Nicholas|Otto|Paul|Peter|Philip|Pius|Ptolemy|Ramesses|Richard|Robert|Rudolf|Sixtus|Stephen|Umberto|"
                 "Urban|Victor|Wilhelm|William")
_REGNAL = re.compile(r"\b(" + _REGNAL_NAMES + r")\s+(?=[IVXLC])(" + _ROMAN + r")\b(?!['\w])")
_YEAR_CUE = re.compile(r"\b(in|of|since|until|till|by|from|before|after|around|circa|year|c\.)\s+(\d{4})\b(?![.,:]\d|\w)",
                       re.I)
_ERA = re.compile(r"(?<![\w.,])(\d{1,4})\s*(A\.D\.|B\.C\.|AD|BC|BCE|CE)(?![\w])")
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def _roman(numeral: str) -> int:
    """A well-formed Roman numeral's value (the patterns above only match well-formed ones)."""
    values = [_ROMAN_VALUES[c] for c in numeral.upper()]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


def _say_title_numeral(m: Match[str]) -> str:
    """"Chapter IV" -> "Chapter four", "page iv" -> "page four". Not "I" after a lowercase word: "the part I
    liked" is a pronoun; nor a lowercase run that is no numeral."""
    word, upper, lower = m.groups()
    numeral = upper or lower
    if (upper == "I" and word.islower()) or not re.fullmatch(_ROMAN, numeral.upper()):
        return m.group()
    return f"{word} {_cardinal(_roman(numeral))}"


def _say_reference(m: Match[str]) -> str:
    word = _REFERENCE_WORDS[m.group(1).lower()]
    return (word.capitalize() if m.group(1)[0].isupper() else word) + " "


def _say_narration(text: str) -> str:
    """A narrator's readings, before numbers are read: "p. 5" "page 5", "pp." "pages", "ch." "chapter", "vol."
    "volume", "fig." "figure" (only before a number); a Roman numeral after a title word, "Chapter IV" "Chapter
    four"; after a regnal name, "Henry VIII" "Henry the Eighth"; a four-digit year after a cue ("in 1066") or
    with an era ("1066 AD") as a year, "ten sixty-six"."""
    if "." in text:
        text = _REFERENCE.sub(_say_reference, text)
    if _may_hold_roman(text):
        text = _TITLE_NUMERAL.sub(_say_title_numeral, text)
        text = _REGNAL.sub(lambda m: f"{m.group(1)} the {_ordinal(_roman(m.group(2))).capitalize()}", text)
    if _HAS_DIGIT.search(text):
        text = _YEAR_CUE.sub(lambda m: f"{m.group(1)} {_year(int(m.group(2)))}", text)
        text = _ERA.sub(lambda m: f"{_year(int(m.group(1)))} {' '.join(m.group(2).replace('.', ''))}", text)
    return text


_ROMAN_WORD = re.compile(r"\b(?:[IVXLCDM]{2,}|[VXLCDM]|[ivxl]{2,}|[vxl])\b")
"""A word that may be a Roman numeral other than a lone "I" (mostly the pronoun: see _may_hold_roman)."""
_TITLE_SET = frozenset(_TITLE_WORDS.split("|"))
_REGNAL_SET = frozenset(_REGNAL_NAMES.split("|"))


def _may_hold_roman(text: str) -> bool:
    """A cheap test before the passes that read Roman numerals: a word that may be one, or a lone "I" after a
    title word or a regnal name."""
    if _ROMAN_WORD.search(text):
        return True
    at = text.find(" I")
    while at != -1:
        if at + 2 == len(text) or not text[at + 2].isalnum():
            before = text[:at].rsplit(None, 1)
            if before and (before[-1].lower() in _TITLE_SET or before[-1] in _REGNAL_SET):
                return True
        at = text.find(" I", at + 2)
    return False


# Abbreviations

_ABBREVIATIONS = {
    "Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Mx": "Mix", "Prof": "Professor", "Jr": "Junior",
    "Sr": "Senior", "Mt": "Mount", "Capt": "Captain", "Sgt": "Sergeant", "Lt": "Lieutenant", "Gen": "General",
    "Col": "Colonel", "Rev": "Reverend", "Gov": "Governor", "Sen": "Senator", "Inc": "Incorporated",
    "Ltd": "Limited", "Corp": "Corporation", "Co": "Company", "Bros": "Brothers", "Ave": "Avenue",
    "Blvd": "Boulevard", "Rd": "Road", "Dept": "Department", "Fig": "Figure", "Vol": "Volume", "Ph.D": "P h D",
    "Dr": "Doctor", "St": "Street", "Messrs": "Messieurs",
    "etc": "et cetera", "vs": "versus", "approx": "approximately", "cf": "compare", "aka": "also known as",
    "a.k.a": "also known as", "e.g": "for example", "i.e": "that is", "esp": "especially", "incl": "including",
}
_CASE_FREE = {"etc", "vs", "approx", "cf", "aka", "a.k.a", "e.g", "i.e", "esp", "incl"}
"""Matched in any case; the rest only as written (or all capitals), so "co", "ms", "st" stay words or units."""
_NEEDS_DOT = {"Co", "Rd", "Ave", "Fig", "Vol", "Col", "Gen", "Sen", "Rev", "Gov", "Capt", "Sgt", "Lt", "cf", "esp",
              "incl"}
"""Also ordinary words: expanded only with their period."""
_BEFORE_NAME = {"Col", "Gen", "Sen", "Rev", "Gov", "Capt", "Sgt", "Lt"}
"""Titles that are only expanded before a capitalized name."""
_MID_SENTENCE = _BEFORE_NAME | {"Mr", "Mrs", "Ms", "Mx", "Messrs", "Prof", "Mt", "e.g", "i.e", "vs", "cf", "approx",
                                "aka", "a.k.a", "esp", "incl"}
"""Never sentence-final, so their period is dropped; the others keep a period that ends the sentence."""
_ABBREVIATION = re.compile(
    r"(?<![\w.])(" + "|".join(re.escape(k) for k in sorted(_ABBREVIATIONS, key=len, reverse=True)) + r")(\.)?(?!\w)",
    re.I)
_ACRONYM = re.compile(r"(?<![\w.])([A-Za-z](?:\.[A-Za-z])+)(\.)?(?!\w)")


def _abbreviation_key(word: str, dot: str | None) -> str | None:
    if word in _ABBREVIATIONS:
        return word
    if word.lower() in _CASE_FREE:
        return word.lower()
    title = word.capitalize()  # "DR." is a title, "MS Word" is not
    return title if word.isupper() and dot and title in _ABBREVIATIONS else None


def _expand_abbreviation(m: Match[str]) -> str:
    dot = m.group(2)
    key = _abbreviation_key(m.group(1), dot)
    if key is None or (key in _NEEDS_DOT and not dot):
        return m.group()
    text, start, end = m.string, m.start(), m.end()
    if key in _BEFORE_NAME and not _next_capitalized(text, end):
        return m.group()
    if key == "Dr":
        if _next_capitalized(text, end) or not _prev_capitalized(text, start):
            return "Doctor"
        return "Drive" + _period_if_end(m, dot)
    if key == "St" and _next_capitalized(text, end):
        return "Saint"
    if key in _MID_SENTENCE:
        return _ABBREVIATIONS[key]
    return _ABBREVIATIONS[key] + _period_if_end(m, dot)


def _spell_acronym(m: Match[str]) -> str:
    """"U.S." -> "U S", "a.m." -> "a m"."""
    return " ".join(m.group(1).split(".")) + _period_if_end(m, m.group(2))


# ---------------------------------------------------------------------------------------------------------------
# Dates and times

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_MONTH_NAMES = {m.lower(): m for m in _MONTHS} | {m[:3].lower(): m for m in _MONTHS} | {"sept": "September"}
_MONTH = (r"(?P<month>" + "|".join(_MONTHS) + r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)"
          r"(?:\.(?=\s+\d))?)(?![\w])")
_ISO_DATE = re.compile(r"(?<![\w.-])(\d{4})-(\d{2})-(\d{2})(?![\w-])")
_SLASH_DATE = re.compile(r"(?<![\w./])(\d{1,2})/(\d{1,2})/(\d{4})(?![\w/]|\.\d)")
"""3/4/2025: month first (as in the US) unless the first number cannot be a month (31/12/2025)."""
_MONTH_DAY = re.compile(r"(?<![\w.])" + _MONTH + r"\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?(?![\w:.,]\d|\w)"
                        r"(?:,?\s+(?P<year>\d{4})(?![\w:]))?")
_MONTH_YEAR = re.compile(r"(?<![\w.])" + _MONTH + r",?\s+(?P<year>\d{4})(?![\w:])")
_DAY_MONTH = re.compile(r"(?:\b[Tt]he\s+)?(?<![\w.])(?P<day>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH
                        + r"(?:,?\s+(?P<year>\d{4})(?![\w:]))?")
_AMPM = r"(?P<ampm>[ap])(?:\.\s?m\.|\.?\s?m(?!\w))"
_CLOCK = re.compile(r"(?<![\w:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])(?:\s*" + _AMPM + ")?", re.I)
_HOUR_AMPM = re.compile(r"(?<![\w:.])(\d{1,2})\s?" + _AMPM, re.I)


def _month(name: str) -> str:
    return _MONTH_NAMES[name.rstrip(".").lower()]


def _say_iso_date(m: Match[str]) -> str:
    year, month, day = (int(g) for g in m.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return _say_digit_groups(m)
    return f"{_MONTHS[month - 1]} {_ordinal(day)}, {_year(year)}"


def _say_slash_date(m: Match[str]) -> str:
    """Month first, or day first when the first number cannot be a month; a day the calendar does not have
    ("2/30/2024") is no date, left to the slash rule."""
    first, second, year = (int(g) for g in m.groups())
    month, day = (first, second) if first <= 12 else (second, first)
    if year < 1 or not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return m.group()
    return f"{_MONTHS[month - 1]} {_ordinal(day)}, {_year(year)}"


def _say_month_day(m: Match[str]) -> str:
    day, year = int(m.group("day")), m.group("year")
    if not 1 <= day <= 31:
        return m.group()
    return f"{_month(m.group('month'))} {_ordinal(day)}" + (f", {_year(int(year))}" if year else "")


def _say_day_month(m: Match[str]) -> str:
    day, year = int(m.group("day")), m.group("year")
    if not 1 <= day <= 31:
        return m.group()
    return f"the {_ordinal(day)} of {_month(m.group('month'))}" + (f", {_year(int(year))}" if year else "")


def _say_ampm(m: Match[str]) -> str:
    ampm = m.group("ampm")
    return f" {ampm.lower()} m" + _period_if_end(m, m.group()[-1] if m.group().endswith(".") else None)


def _say_clock(m: Match[str]) -> str:
    hour, minutes, seconds = int(m.group(1)), m.group(2), m.group(3)
    ampm = m.group("ampm")
    if hour > 23 or int(minutes) > 59 or (ampm and not 1 <= hour <= 12):
        return m.group()
    words = _cardinal(hour)
    if minutes == "00":
        words += "" if ampm else (" o'clock" if 1 <= hour <= 12 else " hundred")
    else:
        words += f" oh {_ONES[int(minutes)]}" if minutes[0] == "0" else f" {_cardinal(int(minutes))}"
    if seconds and int(seconds):
        words += f" and {_cardinal(int(seconds))} second" + ("" if int(seconds) == 1 else "s")
    return words + (_say_ampm(m) if ampm else "")


def _say_hour_ampm(m: Match[str]) -> str:
    hour = int(m.group(1))
    return _cardinal(hour) + _say_ampm(m) if 1 <= hour <= 12 else m.group()


# ---------------------------------------------------------------------------------------------------------------
# Numbers with context: digit groups, ranges, money, percent, units, fractions, ordinals

_DIGIT_GROUPS = re.compile(r"(?<![\w.-])(?:\d+(?:-\d+){2,}|\d{3}-\d{4})(?![\w-])")
_RANGE = re.compile(r"(?<=\d)-(?=[$\u20ac\u00a3\u00a5]?\d)")
_SPACED_DASH = re.compile(r"(?<=\d) - (?=[$\u20ac\u00a3\u00a5]?\d)")
"""Between numbers: a range ("10 - 20"), or subtraction when the text has an "=" ("5 - 3 = 2")."""
_DECADE = re.compile(r"(?<![\w.])'?(\d\d)?(\d)0'?s(?!\w)")
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"), "\u20ac": ("euro", "euros", "cent", "cents"),
    "\u00a3": ("pound", "pounds", "penny", "pence"), "\u00a5": ("yen", "yen", "", ""),
    "\u20b9": ("rupee", "rupees", "paisa", "paise"), "\u20a9": ("won", "won", "", ""),
}
_CURRENCY_CODES = {"USD": "$", "EUR": "\u20ac", "GBP": "\u00a3", "JPY": "\u00a5", "INR": "\u20b9"}
_SCALE_WORDS = {"k": "thousand", "m": "million", "mm": "million", "b": "billion", "bn": "billion",
                "t": "trillion", "tn": "trillion"}
_MONEY = re.compile(r"(?P<sign>(?<![\w.])-)?(?P<sym>[$\u20ac\u00a3\u00a5\u20b9\u20a9])\s?(?P<num>" + _NUM + ")"
                    r"(?:\s?(?P<scale>thousand|million|billion|trillion)(?!\w)"
                    r"|(?P<abbr>[kKmMbBtT]|bn|mm|MM|tn)(?!\w))?")
_MONEY_CODE = re.compile(r"(?<![\w.])(?P<sign>-)?(?P<num>" + _NUM + r")\s?(?P<code>USD|EUR|GBP|JPY|INR)(?!\w)")
_PERCENT = re.compile(r"(" + _SIGNED + r")\s?%")

_UNITS = {
    "km": "kilometer", "m": "meter", "cm": "centimeter", "mm": "millimeter", "\u03bcm": "micrometer", "mi": "mile",
    "ft": "foot", "yd": "yard", "kg": "kilogram", "g": "gram", "mg": "milligram", "lb": "pound", "lbs": "pound",
    "oz": "ounce", "L": "liter", "ml": "milliliter", "mL": "milliliter", "mph": "mile per hour",
    "km/h": "kilometer per hour", "kph": "kilometer per hour", "m/s": "meter per second",
    "\u00b0C": "degree Celsius", "\u00b0F": "degree Fahrenheit", "\u00b0": "degree", "KB": "kilobyte",
    "kB": "kilobyte", "MB": "megabyte", "GB": "gigabyte", "TB": "terabyte", "PB": "petabyte", "Mb": "megabit",
    "Gb": "gigabit", "Kbps": "kilobit per second", "Mbps": "megabit per second", "Gbps": "gigabit per second",
    "Hz": "hertz", "kHz": "kilohertz", "MHz": "megahertz", "GHz": "gigahertz", "ms": "millisecond",
    "\u03bcs": "microsecond", "ns": "nanosecond", "s": "second", "sec": "second", "secs": "second",
    "min": "minute", "mins": "minute", "h": "hour", "hr": "hour", "hrs": "hour", "kW": "kilowatt",
    "kWh": "kilowatt hour", "mAh": "milliamp hour", "dB": "decibel", "px": "pixel", "fps": "frame per second",
    "rpm": "revolution per minute", "kcal": "kilocalorie",
}
"""Unit symbol (case-sensitive) -> singular name; read only right after a number. Plural: "s" on the first word."""
_UNIT_PLURALS = {"foot": "feet", "hertz": "hertz", "kilohertz": "kilohertz", "megahertz": "megahertz",
                 "gigahertz": "gigahertz", "kilowatt hour": "kilowatt hours", "milliamp hour": "milliamp hours"}
_UNIT = re.compile(r"(" + _SIGNED + r")\s?("
                   + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True)) + r")(?![\w/\u00b0'])")
_FRACTION = re.compile(r"(?<![\w./])(?:(\d+)\s+)?(\d+)/(\d+)(?![\w/])")
_FRACTION_DENOMINATORS = {2, 3, 4, 5, 6, 8, 10, 16, 32, 100}
_NUMBER_SIGN = re.compile(r"#\s*(?=\d)|(?<![\w.])[Nn]o\.\s*(?=\d)|~\s*(?=[-+$\u20ac\u00a3\u00a5]?\d)")
_ORDINAL = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(?:st|nd|rd|th|ST|ND|RD|TH)(?!\w)")
_VERSION = re.compile(r"(?<![\w.])(v)?(\d+(?:\.\d+){2,})(?![\w]|\.\d)", re.I)
_NUMBER = re.compile(r"(?<![\w.])([-+]?(?:" + _NUM + r"|\.\d+))(?!\w|\.\d)")
_DIGIT_RUN = re.compile(r"\d+(?:\.\d+)*")
_HAS_DIGIT = re.compile(r"\d")
_MONTH_HINT = re.compile(r"Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec")
_CURRENCY_HINT = re.compile(r"[$\u20ac\u00a3\u00a5\u20b9\u20a9]|USD|EUR|GBP|JPY|INR")


def _say_digit_groups(m: Match[str]) -> str:
    """Phone numbers and other dashed digit groups: "555-1234" -> "five five five, one two three four"."""
    return ", ".join(_digits(group) for group in m.group().split("-"))


def _say_decade(m: Match[str]) -> str:
    century, decade = m.group(1), m.group(2)
    if century is None and decade == "0":
        return m.group()
    words = _year(int(f"{century}{decade}0")) if century else _cardinal(int(decade) * 10)
    return _plural(words)


def _say_money(m: Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCIES[m.group("sym")]
    sign, num = ("minus " if m.group("sign") else ""), m.group("num")
    scale = m.group("scale") or _SCALE_WORDS.get((m.group("abbr") or "").lower())
    if scale:
        return f"{sign}{_number(num)} {scale} {many}"
    whole, _, frac = num.partition(".")
    if len(frac) == 2 and sub_one:
        value, cents = int(whole.replace(",", "")), int(frac)
        parts = [f"{_integer(whole)} {one if value == 1 else many}"] if value or not cents else []
        parts += [f"{_cardinal(cents)} {sub_one if cents == 1 else sub_many}"] if cents else []
        return sign + " and ".join(parts)
    return f"{sign}{_number(num)} {one if num == '1' else many}"


def _say_money_code(m: Match[str]) -> str:
    one, many = _CURRENCIES[_CURRENCY_CODES[m.group("code")]][:2]
    num = m.group("num")
    return ("minus " if m.group("sign") else "") + f"{_number(num)} {one if num == '1' else many}"


def _say_unit(m: Match[str]) -> str:
    num, name = m.group(1), _UNITS[m.group(2)]
    if num.lstrip("+-") != "1":
        first, _, rest = name.partition(" ")
        name = _UNIT_PLURALS.get(name) or f"{first}s {rest}".rstrip()
    return f"{_number(num)} {name}"


def _say_fraction(m: Match[str]) -> str:
    whole, num, den = m.group(1), int(m.group(2)), int(m.group(3))
    if not (den in _FRACTION_DENOMINATORS and 1 <= num < den):
        return m.group()
    if den == 2:
        part = "half" if num == 1 else "halves"
    elif den == 4:
        part = "quarter" if num == 1 else "quarters"
    else:
        part = _ordinal(den) + ("" if num == 1 else "s")
    if whole:
        return f"{_number(whole)} and {'a' if num == 1 else _cardinal(num)} {part}"
    return f"{_cardinal(num)} {part}"


def _say_version_parts(parts: list[str]) -> str:
    """"1.2.3" -> "one point two point three"; four or more parts (an IP address) are joined by "dot"."""
    return (" point " if len(parts) <= 3 else " dot ").join(_integer(p) for p in parts)


def _say_version(m: Match[str]) -> str:
    return ("version " if m.group(1) else "") + _say_version_parts(m.group(2).split("."))


def _say_leftover(m: Match[str]) -> str:
    """Digits glued to letters ("MP3", "python3.11", "4K"): read on their own."""
    digits = m.group()
    return f" {_number(digits) if digits.count('.') == 1 else _say_version_parts(digits.split('.'))} "


def _say_numbers(text: str) -> str:
    """Every digit in `text` becomes words; the most specific reading is tried first.

    The substring tests only skip passes that cannot match (they halve the cost on ordinary prose).
    """
    if "#" in text or "~" in text or "o." in text:
        text = _NUMBER_SIGN.sub(lambda m: "about " if m.group()[0] == "~" else "number ", text)
    if "-" in text:
        text = _ISO_DATE.sub(_say_iso_date, text)
    if "/" in text:
        text = _SLASH_DATE.sub(_say_slash_date, text)
    if _MONTH_HINT.search(text):
        text = _MONTH_DAY.sub(_say_month_day, text)
        text = _DAY_MONTH.sub(_say_day_month, text)
        text = _MONTH_YEAR.sub(lambda m: f"{_month(m.group('month'))} {_year(int(m.group('year')))}", text)
    if "-" in text:
        text = _DIGIT_GROUPS.sub(_say_digit_groups, text)
        text = _RANGE.sub(" to ", text)
        text = _SPACED_DASH.sub(" minus " if "=" in text else " to ", text)
    if ":" in text:
        text = _CLOCK.sub(_say_clock, text)
    text = _HOUR_AMPM.sub(_say_hour_ampm, text)
    text = _DECADE.sub(_say_decade, text)
    if _CURRENCY_HINT.search(text):
        text = _MONEY.sub(_say_money, text)
        text = _MONEY_CODE.sub(_say_money_code, text)
    if "%" in text:
        text = _PERCENT.sub(lambda m: f"{_number(m.group(1))} percent", text)
    text = _UNIT.sub(_say_unit, text)
    if "/" in text:
        text = _FRACTION.sub(_say_fraction, text.replace("24/7", "twenty-four seven"))
    text = _ORDINAL.sub(lambda m: _ordinal(int(m.group(1).replace(",", ""))), text)
    if text.count(".") >= 2:
        text = _VERSION.sub(_say_version, text)
    text = _NUMBER.sub(lambda m: _number(m.group(1), as_year=True), text)
    return _DIGIT_RUN.sub(_say_leftover, text)


# ---------------------------------------------------------------------------------------------------------------
# Markup: entities, comments, tags (the module docstring's rule)

_ATTRIBUTE = r"""\s+[\w:-]+(?:\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s"'<>/=]+))?"""
_TAG = re.compile(rf"<(/?)([A-Za-z][\w:-]*)((?:{_ATTRIBUTE})*)\s*(/?)>")
"""A word in angle brackets, with any attributes and slashes: markup or text by `_is_markup`."""
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_DECLARATION = re.compile(r"<[!?][A-Za-z][^<>]*>")
"""`<!DOCTYPE html>`, `<?xml version="1.0"?>`, `<![CDATA[` openers and the like."""
_MARKUP_NAMES = frozenset((
    # HTML's elements, current and obsolete
    "a abbr acronym address area article aside audio b base bdi bdo big blink blockquote body br button canvas "
    "caption center cite code col colgroup data datalist dd del details dfn dialog dir div dl dt em embed fieldset "
    "figcaption figure font footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html i iframe img "
    "input ins kbd label legend li link main map mark marquee menu meta meter nav nobr noframes noscript object ol "
    "optgroup option output p param picture plaintext pre progress q rb rp rt rtc ruby s samp script search "
    "section select slot small source span strike strong style sub summary sup svg table tbody td template "
    "textarea tfoot th thead time title tr track tt u ul var video wbr xmp "
    # SSML's
    "speak break prosody emphasis say-as phoneme voice lang lexicon mark paragraph sentence w token "
    # emotion tags that TTS voices render as sounds (engine/families/orpheus keeps its own before this runs)
    "laugh laughs laughing chuckle sigh cough sniffle groan yawn gasp whisper giggle cry sob breath breathe "
    "clears_throat").split())
"""Element names that are markup even alone in angle brackets (`<b>`, `<speak>`, `<laugh>`)."""


def _is_markup(m: Match[str]) -> bool:
    closing, name, attributes, self_closing = m.groups()
    return bool(closing or self_closing or attributes) or (
        name.lower() in _MARKUP_NAMES and (name.islower() or name.isupper()))


def _strip_markup(text: str) -> str:
    """Entities decoded, comments, declarations and tags dropped, a lone word in angle brackets kept as text."""
    if "&" in text:
        text = html.unescape(text)
    if "<" not in text:
        return text
    if "<!--" in text:
        text = _COMMENT.sub(" ", text)
    if "<!" in text or "<?" in text:
        text = _DECLARATION.sub(" ", text)
    return _TAG.sub(lambda m: " " if _is_markup(m) else f" {m.group(2)} ", text)


def _markup_around(text: str, start: int, p: int, stop: int) -> int | None:
    """Is `text[p]` inside a tag or comment that opens at or after `start`? The index just past its end; None when
    it is not; -1 when that is not known before `stop` (the tag or comment opens but does not close before it)."""
    opened = text.rfind("<!--", start, p)
    if opened != -1 and text.find("-->", opened + 4, p) == -1:
        closed = text.find("-->", max(p - 2, opened + 4), stop)
        return -1 if closed == -1 else closed + 3
    lt = text.rfind("<", start, p)
    if lt == -1 or text.find(">", lt, p) != -1 or not re.match(r"</?[A-Za-z]", text[lt:lt + 2]):
        return None
    gt = text.find(">", p, stop)
    if gt == -1:
        return -1
    m = _TAG.fullmatch(text, lt, gt + 1)
    return gt + 1 if m is not None and _is_markup(m) else None


# ---------------------------------------------------------------------------------------------------------------
# Symbols and final tidy-up

_SYMBOL_WORDS = {"&": "and", "@": "at", "+": "plus", "=": "equals", "<": "less than", ">": "greater than",
                 "%": "percent", "\u00b0": "degrees", "/": "slash", ".": "dot"}
_SYMBOL = re.compile(r"(?<!\s)\s*[&@+%\u00b0]\s*|(?<=[\w)])\s*[=<>]\s*(?=[\w(-])|(?<=\w)/(?=\w)|(?<=\w)\.(?=[A-Za-z])")
r"""A symbol to say as a word, with the spaces around it. The spaces before one are matched only from the start
of their run (`(?<!\s)`): tried from every place inside a long run, `\s*` read the rest of the run each time, so a
run of n spaces cost n * n steps (a megabyte of them blocked the HTTP API's loop)."""
_JUNK = re.compile(r"[^\w\s.,;:!?'\"()-]|_")
_DASH_GAP = re.compile(r"(?:(?<=\s)|^)-+(?=\s|$)|-{2,}")
_EMPTY_PARENS = re.compile(r"\(\s*\)")
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r" (?=[.,;:!?)])|(?<=\() ")
_WEAK_BESIDE_STRONG = re.compile(r"[,;:]+ ?(?=[,;:.!?])|(?<=[.!?])[,;:]+")
"""A comma, semicolon or colon next to stronger punctuation goes: "one, ." and "Literature.--Nil" (whose dash
became a comma) would otherwise read "Literature., Nil"."""
_REPEATED = re.compile(r"([!?,;:])\1+|\.{4,}")
_LEADING_PUNCT = re.compile(r"^[\s.,;:!?)]+")
_WORD_CHAR = re.compile(r"[^\W_]")


def _say_symbol(m: Match[str]) -> str:
    return f" {_SYMBOL_WORDS[m.group().strip()]} "


def _tidy(text: str) -> str:
    text = _JUNK.sub(" ", text)
    text = _DASH_GAP.sub(", ", text)
    text = _EMPTY_PARENS.sub(" ", text)
    text = _SPACES.sub(" ", text).strip()
    text = _SPACE_BEFORE_PUNCT.sub("", text)
    text = _WEAK_BESIDE_STRONG.sub("", text)
    text = _REPEATED.sub(lambda m: "..." if m.group()[0] == "." else m.group(1), text)
    return _LEADING_PUNCT.sub("", text)


def normalize(text: str) -> str:
    """Raw text (one sentence, ideally) -> speakable English: words and plain ASCII punctuation, no digits.

    Never raises; text with nothing speakable comes back as "" or bare punctuation (see `is_speakable`).
    """
    if "<" in text or "&" in text:
        text = _strip_markup(text)
    text = _clean_unicode(text)
    if "@" in text:
        text = _EMAIL.sub(_say_address, text)
    if "." in text or "://" in text:
        text = _URL.sub(_say_address, text)
    text = _say_narration(text)
    text = _ABBREVIATION.sub(_expand_abbreviation, text)
    if _HAS_DIGIT.search(text):
        text = _say_numbers(text)
    if "." in text:
        text = _ACRONYM.sub(_spell_acronym, text)
    text = text.replace("and/or", "and or")
    text = _SYMBOL.sub(_say_symbol, text)
    return _tidy(text)


def is_speakable(text: str) -> bool:
    """True if `normalize(text)` holds a letter or digit; False for only punctuation, emoji, symbols or space.

    Works on raw or already normalized text. Fast path: no rule removes a letter or digit except markup's (tags,
    comments, entities), so a cleaned text with one and no markup is speakable without the whole normalizer.
    """
    cleaned = _clean_unicode(text)
    if "<" not in cleaned and "&" not in cleaned and _WORD_CHAR.search(cleaned):
        return True
    return bool(_WORD_CHAR.search(normalize(text)))


# ---------------------------------------------------------------------------------------------------------------
# Sentence splitting

_CANDIDATE = re.compile(r"[.!?\u2026\u3002\uff01\uff1f\n\r]")
_TERMINAL_RUN = re.compile(r"[.!?\u2026\u3002\uff01\uff1f]+")
_CJK_TERMINALS = frozenset("\u3002\uff01\uff1f")
_CLOSERS = frozenset("\"')]}\u201d\u2019\u00bb")
_OPENERS = "\"'([{\u201c\u2018\u00ab"
_LEADING_SPACE = re.compile(r"\s*")
_LAST_WORD = re.compile(r"\S*\Z")
_LOOKAHEAD = 64
"""Closers + whitespace looked at after terminal punctuation; a longer gap ends the sentence. Bounds the wait."""
_LOOKBEHIND = 24
"""Characters looked back for the word before a period (abbreviations are shorter)."""
_NOT_END, _UNDECIDED = -1, -2
_LOOKBEHIND_MARKUP = 1024
"""Characters looked back for the tag or comment a candidate end may be inside (longer ones are not seen)."""

_NEVER_END = frozenset({
    "mr", "mrs", "ms", "mx", "messrs", "dr", "prof", "st", "mt", "capt", "sgt", "lt", "gen", "col", "rev", "gov", "sen",
    "vs", "e.g", "i.e", "cf", "approx", "ca", "viz", "esp", "incl", "a.k.a"})
"""Abbreviations always followed by more of the sentence (titles before names, "e.g.", "vs.")."""
_BEFORE_NUMBER = frozenset({"no", "nos", "fig", "figs", "vol", "p", "pp", "ch", "sec", "art", "eq", "ref", "op"})
"""Abbreviations that do not end a sentence when a number follows ("No. 5", "Fig. 3")."""
_MAYBE_END = frozenset({
    "etc", "inc", "ltd", "corp", "co", "jr", "sr", "bros", "al", "ave", "blvd", "rd", "dept", "est", "jan", "feb",
    "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"})
"""Abbreviations that end a sentence only before a capitalized word ("Apple Inc. The ...")."""


def _word_before(buf: str, start: int, p: int) -> str:
    """The whitespace-delimited word ending at `p`, without opening quotes/brackets; never looks before `start`."""
    word = _LAST_WORD.search(buf, max(start, p - _LOOKBEHIND), p)
    assert word is not None  # \S*\Z matches the empty string too
    return word.group().lstrip(_OPENERS)


def _clause_cut(window: str, max_chars: int) -> int:
    """Where to cut a sentence longer than max_chars: length of the first piece, 1..max_chars.

    `window` holds the next max_chars + 1 characters. Prefer the last ; : or dash, then the last comma, in the
    part after max_chars // 3 (no tiny first pieces); then the last whitespace; a single longer word is cut hard.
    """
    low = max_chars // 3
    for tier in (r"[;:](?=\s)|\s-+(?=\s)|[\u2013\u2014]\s?", r",(?=\s)"):
        cut = 0
        for m in re.finditer(tier, window[:max_chars + 1]):
            if low <= m.end() <= max_chars:
                cut = m.end()
        if cut:
            return cut
    for i in range(min(max_chars, len(window) - 1), 0, -1):
        if window[i].isspace():
            return i
    return max_chars


class SentenceSplitter:
    """Incremental sentence splitter over raw text: feed chunks as they arrive, get back finished sentences.

    A sentence ends at:
    - terminal punctuation (. ! ? … and CJK 。！？) plus any closing quotes/brackets, followed by whitespace; for
      "! ?" that is all, unless a closer came before a lowercase word ('"Help!" she cried'); for "." and "…" the
      next word must look like a sentence start: not lowercase; after known abbreviations only a capitalized word
      ("Inc.", "etc.") or never ("Dr.", "e.g.", "vs."); never after initials ("J. R. R.") and dotted acronyms
      ("U.S."), nor after a list number at the start of a sentence ("1. Buy milk");
    - every newline when `newline_breaks` (default; `tail -f` logs and typed lines are line-oriented), otherwise
      only a blank line;
    - a gap of more than 64 closers/whitespace characters after terminal punctuation.
    A sentence longer than `max_chars` is cut at the last ; : or dash, else comma, else whitespace within the limit,
    and only a single word longer than the limit is cut mid-word.

    Guarantees: emitted sentences are stripped and non-empty; joined, they equal the input up to whitespace; any
    chunking of the same text gives the same sentences (a sentence is emitted once its end is certain: that may
    need the first character of the next sentence); the buffer never holds more than about max_chars + 64
    characters of unfinished text beyond the current chunk.
    """

    def __init__(self, max_chars: int = 300, *, newline_breaks: bool = True) -> None:
        if max_chars < 16:
            raise ValueError(f"max_chars must be at least 16, got {max_chars}")
        self.max_chars = max_chars
        """Longest sentence emitted, in raw characters (normalization may lengthen it)."""
        self.newline_breaks = newline_breaks
        """Every newline ends a sentence; if False only a blank line does and single newlines are spaces."""
        self._buf = ""
        self._scan = 0  # candidates in _buf before this index are known not to end the current sentence

    @property
    def pending(self) -> str:
        """Text received but not yet emitted."""
        return self._buf

    def feed(self, text: str) -> list[str]:
        """Add a chunk; return the sentences it completed, in order."""
        if not text:
            return []
        self._buf += text
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End of input: return everything still buffered as sentences, and reset."""
        sentences = self._drain(final=True)
        self.reset()
        return sentences

    def reset(self) -> None:
        """Drop buffered text (e.g. on cancel)."""
        self._buf, self._scan = "", 0

    def _drain(self, final: bool) -> list[str]:
        buf, start, scan, out = self._buf, 0, self._scan, []
        while True:
            space = _LEADING_SPACE.match(buf, start)
            assert space is not None  # \s* matches the empty string too
            start = space.end()
            if start >= len(buf):
                break
            limit = start + self.max_chars
            end, scan = self._find_end(buf, start, max(scan, start), limit, final)
            if end == _UNDECIDED or (end == _NOT_END and len(buf) <= limit and not final):
                break
            if end == _NOT_END and len(buf) <= limit:
                end = len(buf)
            elif end == _NOT_END or end > limit:
                end = start + _clause_cut(buf[start:limit + 1], self.max_chars)
            out.append(buf[start:end].rstrip())
            start = scan = end
        self._buf, self._scan = buf[start:], max(scan - start, 0)
        return out

    def _find_end(self, buf: str, start: int, scan: int, limit: int, final: bool) -> tuple[int, int]:
        """First sentence end after `scan` among candidates up to `limit`: (end, where to resume scanning).

        end is an index, _NOT_END (none up to limit, or up to the end of the buffer) or _UNDECIDED (more text needed).
        """
        stop = min(len(buf), limit + 1)
        while True:
            m = _CANDIDATE.search(buf, scan, stop)
            if m is None:
                return _NOT_END, max(scan, stop)
            p = m.start()
            lookback = max(start, p - _LOOKBEHIND_MARKUP)
            if buf.rfind("<", lookback, p) != -1:
                past = _markup_around(buf, lookback, p, stop)
                if past == -1:  # a tag or comment still open: its end decides, unless the sentence is too long
                    if len(buf) > limit or final:
                        past = None
                    else:
                        return _UNDECIDED, p
                if past is not None:
                    scan = past
                    continue
            if buf[p] in "\r\n":
                end, after = self._newline_end(buf, p, final), p + 1
            else:
                run = _TERMINAL_RUN.match(buf, p, p + _LOOKAHEAD)  # capped: "!!!…" cannot grow the buffer
                assert run is not None  # buf[p] is a terminal
                after = run.end()
                end = self._terminal_end(buf, start, p, after, final)
            if end != _NOT_END:
                return end, p
            scan = after

    def _newline_end(self, buf: str, p: int, final: bool) -> int:
        if self.newline_breaks:
            return p
        breaks, k = 0, p
        while k < len(buf) and k - p <= _LOOKAHEAD:
            c = buf[k]
            if c == "\r" and k + 1 == len(buf) and not final:
                return _UNDECIDED
            if c == "\n" or (c == "\r" and buf[k + 1:k + 2] != "\n"):
                breaks += 1
                if breaks == 2:
                    return p
            elif not c.isspace():
                return _NOT_END
            k += 1
        return p if final or k - p > _LOOKAHEAD else _UNDECIDED

    def _terminal_end(self, buf: str, start: int, p: int, run_end: int, final: bool) -> int:
        """Does the run of terminal punctuation buf[p:run_end] end the sentence? Returns the end index or a flag."""
        n, q = len(buf), run_end
        while q < n and buf[q] in _CLOSERS and q - run_end < _LOOKAHEAD:
            q += 1
        if q == n:
            return q if final else _UNDECIDED
        run = buf[p:run_end]
        if not _CJK_TERMINALS.isdisjoint(run):
            return q
        if not buf[q].isspace():
            return _NOT_END
        exclaims = "!" in run or "?" in run
        if exclaims and q == run_end:  # "what? no way" ends; '"Help!" she cried' and "(yes!) it" go on
            return q
        next_char = self._next_visible(buf, q, final)
        if next_char is None:
            return _UNDECIDED
        if not next_char or (not next_char.islower() if exclaims else self._period_ends(buf, start, p, run, next_char)):
            return q
        return _NOT_END

    def _next_visible(self, buf: str, q: int, final: bool) -> str | None:
        """First non-space character after the whitespace at q; "" if the gap itself ends the sentence
        (a newline under the newline rule, a blank line, too long a gap, or end of input); None if not known yet."""
        breaks, k, n = 0, q, len(buf)
        while k < n and buf[k].isspace():
            c = buf[k]
            if c == "\r" and k + 1 == n and not final:
                return None
            if c == "\n" or (c == "\r" and buf[k + 1:k + 2] != "\n"):
                breaks += 1
                if self.newline_breaks or breaks == 2:
                    return ""
            k += 1
            if k - q > _LOOKAHEAD:
                return ""
        if k == n:
            return "" if final else None
        return buf[k]

    def _period_ends(self, buf: str, start: int, p: int, run: str, next_char: str) -> bool:
        if run != ".":  # ellipsis: trailing off mid-sentence unless a new sentence visibly starts
            return not next_char.islower()
        word = _word_before(buf, start, p)
        low = word.lower()
        if low in _NEVER_END:
            return False
        if low in _BEFORE_NUMBER and next_char.isdigit():
            return False
        if next_char.islower():
            return False
        if len(word) == 1 and word.isupper():  # an initial: "J. R. R. Tolkien"
            return False
        if buf[start:p] == word and (word.isdigit() and len(word) <= 3 or len(word) == 1):  # "1. Buy milk"
            return False
        if "." in word and all(len(part) == 1 and part.isupper() for part in word.split(".")):  # "U.S."
            return False
        if low in _MAYBE_END or "." in word:
            return not next_char.isdigit()
        return True


def split_sentences(text: str, max_chars: int = 300, *, newline_breaks: bool = True) -> list[str]:
    """All sentences of a complete text: `SentenceSplitter.feed(text)` then `flush()`."""
    splitter = SentenceSplitter(max_chars, newline_breaks=newline_breaks)
    return splitter.feed(text) + splitter.flush()


def text_pieces(text: str, size: int) -> Iterator[str]:
    """`text` in consecutive pieces of `size` characters (the last one shorter), made as they are asked for: how a
    long text is handed on a piece at a time. `SentenceSplitter` gives the same sentences however a text is cut."""
    for start in range(0, len(text), size):
        yield text[start:start + size]


# ---- how long a sentence may run -------------------------------------------------------------------------------

CAP_TOKENS_PER_S = 50
"""The unit of the CAP_ constants: tokens of a model that speaks 50 tokens a second (Spark's semantic codes); a
family whose LLM writes audio faster or slower scales them (`sentence_token_cap`'s `tokens_per_s`)."""
CAP_BASE_TOKENS = 50
"""Every sentence may run 1 s (50 semantic tokens) beyond what its characters allow: short words, pauses."""
CAP_TOKENS_PER_CHAR = 8
"""0.16 s per non-space character: over twice the time ordinary English speech takes (~15 characters/s with
spaces), so a slow voice is never cut, while a model that fails to stop (a known failure of LLM TTS: minutes
of babble or silence after a short sentence) is stopped after about twice the sentence's natural length
instead of at the 60 s hard cap."""
CAP_TOKENS_PER_WIDE_CHAR = 24
"""A CJK character is a syllable (~0.2-0.25 s spoken): 0.48 s allowed, three times a Latin letter's allowance."""


def sentence_token_cap(sentence: str, tokens_per_s: float = CAP_TOKENS_PER_S) -> int:
    """Most tokens a sentence of this (normalized) text should need, for a model writing `tokens_per_s` tokens per
    second of audio; the pipeline stops it there."""
    wide = sum(1 for ch in sentence if unicodedata.east_asian_width(ch) in "WF")
    narrow = sum(1 for ch in sentence if not ch.isspace()) - wide
    tokens = CAP_BASE_TOKENS + CAP_TOKENS_PER_CHAR * narrow + CAP_TOKENS_PER_WIDE_CHAR * wide
    return tokens if tokens_per_s == CAP_TOKENS_PER_S else math.ceil(tokens * tokens_per_s / CAP_TOKENS_PER_S)
