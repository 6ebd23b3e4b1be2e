"""Provides the Orpheus token grammar: fixed ids, prompt building, prompt text with emotion tags, frame parsing. Pure.

Orpheus is a Llama-3.2-3B whose vocabulary was extended with `<custom_token_N>` at id 128256 + N. A handful of
those mark the turn structure (start/end of human, AI and speech); 7 * 4096 of them, from `<custom_token_10>` on,
carry SNAC codes: every 7 generated audio tokens form one frame, and the k-th token of a frame owns its own block
of 4096 ids. Everything here is id arithmetic on ints; nothing imports torch or a tokenizer.

Per sentence: `prompt_text(sentence)` (instead of engine.text.normalize, which would drop the emotion tags), then
`build_prompt(text, voice, encode)`; generated ids go through one `FrameParser`, whose frames are the decoder's
codes (engine.families.orpheus.snac).

Decisions taken here (docs/orpheus.md has the reasoning):
- The prompt is what the reference implementation hands its model, leading `<|begin_of_text|>` included.
- Emotion tags from EMOTION_TAGS reach the prompt as written; any other `<...>` tag is dropped, never spoken and
  never encoded (a tag such as `<|eot_id|>` or `<custom_token_5>` would otherwise become a structural id).
- An audio id outside its frame position's block is wrapped into 0..4095 and counted (FrameParser.wrapped).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from engine.prompt import Encode, Prompt

# ------------------------------------------------------------------------------------------------------- ids

LLAMA_VOCAB = 128256
"""Llama 3's own ids (BPE entries + 256 reserved specials); `<custom_token_0>` comes right after."""
CUSTOM_BASE = LLAMA_VOCAB
"""Id of `<custom_token_0>`: `<custom_token_N>` is CUSTOM_BASE + N."""
VOCAB_SIZE = 156940
"""Embedding rows of the released checkpoints (`vocab_size` in config.json)."""

BEGIN_OF_TEXT = 128000
"""`<|begin_of_text|>`, Llama's BOS: its tokenizer puts it before any text it encodes with special tokens."""
END_OF_TEXT = 128009
"""`<|eot_id|>`: closes the human turn's text."""
START_OF_SPEECH = CUSTOM_BASE + 1
END_OF_SPEECH = CUSTOM_BASE + 2
"""The stop id: the model emits it after its last audio frame."""
START_OF_HUMAN = CUSTOM_BASE + 3
END_OF_HUMAN = CUSTOM_BASE + 4
START_OF_AI = CUSTOM_BASE + 5
END_OF_AI = CUSTOM_BASE + 6
PAD = CUSTOM_BASE + 7

CODEBOOK = 4096
"""Entries per SNAC codebook (every level)."""
FRAME_TOKENS = 7
"""Audio tokens per frame: 1 code of level 0, 2 of level 1, 4 of level 2."""
AUDIO_BASE = CUSTOM_BASE + 10
"""Id of the first audio token (`<custom_token_10>`): position k of a frame uses ids AUDIO_BASE + 4096k + code."""
AUDIO_END = AUDIO_BASE + FRAME_TOKENS * CODEBOOK
"""One past the last audio id (156938)."""

FRAME_LEVELS = (0, 1, 2, 2, 1, 2, 2)
"""SNAC level of each position in a frame; within a level, positions keep their order in time (the reference
decoder reads level 1 from positions 1, 4 and level 2 from positions 2, 3, 5, 6)."""

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 2048
"""Samples one frame decodes to: SNAC 24 kHz hops 512 samples per level-2 code, 4 of them per frame."""

VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
"""The English fine-tune's speakers, in the order the release lists them (by its own realism ranking)."""
EMOTION_TAGS = ("<laugh>", "<chuckle>", "<sigh>", "<cough>", "<sniffle>", "<groan>", "<yawn>", "<gasp>")
"""Tags the English fine-tune was trained to render as sounds; they go into the prompt text verbatim."""

TEMPERATURE = 0.6
TOP_P = 0.8
REPETITION_PENALTY = 1.3
"""The reference implementation's sampling defaults (no top-k). Repetition penalty matters here: without it the
model tends to loop on one frame."""


def audio_id(position: int, code: int) -> int:
    """Token id that carries `code` at frame `position` (0..6)."""
    if not 0 <= position < FRAME_TOKENS or not 0 <= code < CODEBOOK:
        raise ValueError(f"position must be in 0..6 and code in 0..4095, got {position}, {code}")
    return AUDIO_BASE + position * CODEBOOK + code


def split_levels(frames: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int]]:
    """Frames -> SNAC's three code rows (lengths n, 2n, 4n), in time order within each row."""
    rows: tuple[list[int], list[int], list[int]] = ([], [], [])
    for frame in frames:
        for level, code in zip(FRAME_LEVELS, frame):
            rows[level].append(code)
    return rows


# ---------------------------------------------------------------------------------------------------- prompt

_TAG = re.compile(r"<[^<>\s]*>")
"""Anything that looks like markup or an added token: `<` then no blanks or brackets, then `>`. Emotion tags and
every added token of the tokenizer (`<|eot_id|>`, `<custom_token_5>`) match; `a < b > c` does not."""
_CANONICAL_TAGS = {tag.lower(): tag for tag in EMOTION_TAGS}


def keep_tags(text: str) -> str:
    """`text` with every emotion tag kept (case-folded to its canonical form) and every other tag removed."""
    def one(m: re.Match[str]) -> str:
        return _CANONICAL_TAGS.get(m.group(0).lower(), " ")
    return " ".join(_TAG.sub(one, text).split())


def prompt_text(text: str, normalize: Callable[[str], str] | None = None) -> str:
    """The text a sentence contributes to the prompt: normalized for speech, emotion tags kept in place.

    `normalize` defaults to engine.text.normalize, which would drop the tags; so each kept tag is swapped for a
    letters-only placeholder word that normalization leaves alone, and swapped back afterwards.
    """
    if normalize is None:
        from engine.text import normalize as speech_normalize

        normalize = speech_normalize
    text = keep_tags(text)
    parts = _TAG.split(text)
    tags = _TAG.findall(text)
    marked = parts[0] + "".join(f" {_placeholder(i)} {part}" for i, part in enumerate(parts[1:]))
    out = normalize(marked)
    for i, tag in enumerate(tags):
        out = out.replace(_placeholder(i), tag, 1)
    return keep_tags(out)


def _placeholder(i: int) -> str:
    """A lowercase word no text contains and normalization keeps as is: the index in letters, no digits."""
    letters = ""
    while True:
        i, r = divmod(i, 26)
        letters += chr(ord("a") + r)
        if i == 0:
            return f"zqxtag{letters}zqx"


def build_prompt(text: str, voice: str, encode: Encode, voices: Sequence[str] = VOICES) -> Prompt:
    """The fine-tune's prompt for `text` spoken by `voice`.

    `<|begin_of_text|><start_of_human><|begin_of_text|>{voice}: {text}<|eot_id|><end_of_human><start_of_ai>
    <start_of_speech>`. The reference encodes `{voice}: {text}` with the tokenizer's default special tokens (so a
    BOS comes first), wraps it in the turn markers, decodes that to a string and hands the string to vLLM, which
    encodes it again with special tokens and so puts a second BOS in front of everything; these ids are that
    sequence. `encode` must add no special tokens. Unknown tags in `text` are dropped (keep_tags); sampling is
    restricted to audio ids and the stop id.
    """
    if voice not in voices:
        raise ValueError(f"unknown voice {voice!r}; choose one of {', '.join(voices)}")
    text = keep_tags(text) if isinstance(text, str) else ""
    if not text:
        raise ValueError("text must be a non-empty string")
    body = encode(f"{voice}: {text}")
    stray = [i for i in body if i >= BEGIN_OF_TEXT]
    if stray:  # encode added specials, or the tokenizer matched an added token inside ordinary text
        raise ValueError(f"the text encoded to special or audio token id {stray[0]}; encode must add none")
    ids = (BEGIN_OF_TEXT, START_OF_HUMAN, BEGIN_OF_TEXT, *body, END_OF_TEXT, END_OF_HUMAN, START_OF_AI,
           START_OF_SPEECH)
    return Prompt(ids=ids, allowed_ids=audio_allowed_ids())


@dataclass(frozen=True, slots=True)
class OrpheusIds:
    """What a token generator must know of the vocabulary (engine.families.base.TokenTable)."""

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset({END_OF_SPEECH})

    @property
    def audio_ids(self) -> tuple[int, ...]:
        return audio_allowed_ids()


@functools.lru_cache(maxsize=1)
def audio_allowed_ids() -> tuple[int, ...]:
    """Every audio id plus the stop id, sorted; one tuple for every prompt (generators may key on its identity)."""
    return (END_OF_SPEECH, *range(AUDIO_BASE, AUDIO_END))


# ----------------------------------------------------------------------------------------------- frame parse

@dataclass(frozen=True, slots=True)
class FrameStats:
    """What a finished FrameParser saw besides whole frames (for logs and tests)."""

    frames: int
    """Whole frames returned."""
    ignored: int
    """Non-audio, non-stop ids before the stop (they do not advance the frame position)."""
    wrapped: int
    """Audio ids outside their position's block, wrapped into 0..4095."""
    dropped: int
    """Codes of a partial frame cut off by the stop id."""


class FrameParser:
    """Streaming state machine over generated ids: id deltas in, whole 7-code frames out.

    The same shape as engine.tokens.TokenParser (`feed`, `done`, `stop_id`, `semantic_count`, `ignored`), with
    frames instead of single codes. One per utterance. Position k of a frame is the k-th audio id since the last
    whole frame: only audio ids advance it. An audio id from another position's block (the sampler may pick any
    audio id) is wrapped, `(id - AUDIO_BASE) % 4096`, and counted in `wrapped`: dropping it would shift every later
    frame by one position against the model's own count, which the model keeps by the number of tokens it emitted.
    The stop id ends the stream; a partial frame before it is discarded (`dropped`), everything after it unread.
    """

    def __init__(self, stop_ids: Iterable[int] = (END_OF_SPEECH,)) -> None:
        self._stop = frozenset(stop_ids)
        self._pending: list[int] = []
        self.done = False
        """A stop id has been seen; further ids are dropped uncounted."""
        self.stop_id: int | None = None
        """The stop id that ended the stream, once `done`."""
        self.semantic_count = 0
        """Whole frames returned so far."""
        self.ignored = 0
        """Ids that were neither audio nor stop (they carry no audio and do not advance the position)."""
        self.wrapped = 0
        """Audio ids that belonged to another position's block, wrapped into 0..4095."""
        self.dropped = 0
        """Codes of the partial frame that the stop id cut off."""

    def feed(self, token_ids: Iterable[int]) -> list[tuple[int, ...]]:
        """Consume a delta of generated ids; return the whole frames it completed, in order."""
        frames: list[tuple[int, ...]] = []
        for token_id in token_ids:
            if self.done:
                break
            if AUDIO_BASE <= token_id < AUDIO_END:
                offset = token_id - AUDIO_BASE - len(self._pending) * CODEBOOK
                if not 0 <= offset < CODEBOOK:
                    self.wrapped += 1
                self._pending.append(offset % CODEBOOK)
                if len(self._pending) == FRAME_TOKENS:
                    frames.append(tuple(self._pending))
                    self._pending.clear()
            elif token_id in self._stop:
                self.done, self.stop_id = True, token_id
                self.dropped, self._pending = len(self._pending), []
            else:
                self.ignored += 1
        self.semantic_count += len(frames)
        return frames

    @property
    def code_count(self) -> int:
        """Whole frames returned so far (engine.families.base.CodeParser)."""
        return self.semantic_count

    @property
    def pending(self) -> int:
        """Codes of the frame being assembled (0..6); 0 once done."""
        return len(self._pending)

    def stats(self) -> FrameStats:
        return FrameStats(self.semantic_count, self.ignored, self.wrapped, self.dropped)


def parse_all(ids: Sequence[int]) -> tuple[list[tuple[int, ...]], FrameParser]:
    """Parse a whole generated sequence at once: (frames, the parser for done/counts)."""
    parser = FrameParser()
    return parser.feed(ids), parser
