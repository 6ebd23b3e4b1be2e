"""Provides the Spark-TTS token-id table and the streaming token parser: id arithmetic, no regex over text."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from engine.errors import GenerationError

GLOBAL_COUNT = 32
"""Speaker global tokens per utterance (fixed by BiCodec's speaker encoder)."""
GLOBAL_CODEBOOK = 4096
SEMANTIC_CODEBOOK = 8192

STRUCTURAL = (
    "task_vc", "task_tts", "task_asr", "task_s2s", "task_t2s", "task_cap", "task_understand",
    "task_controllable_tts", "task_prompt_tts", "task_edit", "start_content", "start_style_label",
    "start_style_prompt", "start_acoustic_token", "start_global_token", "start_semantic_token", "end_content",
    "end_style_label", "end_style_prompt", "end_acoustic_token", "end_global_token", "end_semantic_token",
)
"""Structural added tokens, in the order Spark appended them (ids 165136..165157 in the release)."""

LEVELS = {"very_low": 0, "low": 1, "moderate": 2, "high": 3, "very_high": 4}
GENDERS = {"female": 0, "male": 1}


def tok(name: str) -> str:
    """Text form of an added token: `tok("gender_1") == "<|gender_1|>"`."""
    return f"<|{name}|>"


@dataclass(frozen=True, slots=True)
class TokenIds:
    """Ids of every token the engine uses, read from the checkpoint's tokenizer (fine-tunes may differ).

    Defaults are the Spark-TTS-0.5B release's ids.
    """

    global_base: int = 151665
    """Id of `<|bicodec_global_0|>`; global index = id - global_base."""
    semantic_base: int = 155761
    """Id of `<|bicodec_semantic_0|>`; semantic index = id - semantic_base."""
    im_end: int = 151645
    endoftext: int = 151643
    structural: dict[str, int] = field(default_factory=lambda: {n: 165136 + i for i, n in enumerate(STRUCTURAL)})
    """Structural token name (without `<|`/`|>`) -> id."""
    families: dict[str, int] = field(default_factory=lambda: {
        "pitch_value": 163953, "pitch_var_value": 164954, "pitch_label": 164965, "pitch_var_label": 164970,
        "speed_value": 164975, "speed_label": 164986, "loudness_value": 164991, "loudness_label": 165022,
        "age": 165027, "gender": 165032, "emotion": 165035})
    """Attribute family name -> id of its `_0` member; members are contiguous."""

    @property
    def stop_ids(self) -> frozenset[int]:
        """Generation ends on any of these: `<|im_end|>`, `<|endoftext|>`, `<|end_semantic_token|>`."""
        return frozenset({self.im_end, self.endoftext, self.structural["end_semantic_token"]})

    @property
    def audio_ids(self) -> tuple[int, ...]:
        """Sorted semantic ids + stop ids: what a prompt ending in `<|start_semantic_token|>` may generate. The same
        tuple for every sentence (built once, not per sentence, and generators recognise it by identity)."""
        return _audio_ids(self.semantic_base, self.stop_ids)

    def semantic_index(self, token_id: int) -> int | None:
        """Codec index of a semantic token id, or None if the id is not one."""
        i = token_id - self.semantic_base
        return i if 0 <= i < SEMANTIC_CODEBOOK else None

    def global_index(self, token_id: int) -> int | None:
        """Codec index of a global token id, or None if the id is not one."""
        i = token_id - self.global_base
        return i if 0 <= i < GLOBAL_CODEBOOK else None

    def attribute(self, family: str, value: int) -> int:
        """Id of `<|{family}_{value}|>`."""
        return self.families[family] + value

    @classmethod
    def from_lookup(cls, lookup: Callable[[str], int | None]) -> "TokenIds":
        """Build the table from a token-text -> id lookup (e.g. the tokenizer's added-token map).

        Raises KeyError naming the first token the lookup does not know.
        """
        def need(text: str) -> int:
            token_id = lookup(text)
            if token_id is None:
                raise KeyError(text)
            return token_id

        families = {f: need(tok(f"{f}_0")) for f in cls().families}
        return cls(
            global_base=need(tok("bicodec_global_0")),
            semantic_base=need(tok("bicodec_semantic_0")),
            im_end=need("<|im_end|>"),
            endoftext=need("<|endoftext|>"),
            structural={n: need(tok(n)) for n in STRUCTURAL},
            families=families,
        )


@functools.lru_cache(maxsize=4)
def _audio_ids(base: int, stops: frozenset[int]) -> tuple[int, ...]:
    return tuple(sorted({*range(base, base + SEMANTIC_CODEBOOK), *stops}))


class TokenParser:
    """Streaming state machine over generated token ids: id deltas in, new semantic codes out.

    One per utterance. Feed it every delta the generator yields; it stops at the first stop id (`done`) and
    ignores everything after it. In controllable-mode output it also collects the 32 speaker globals emitted
    between `<|start_global_token|>` and `<|end_global_token|>`. Acoustic (pitch/speed value), structural and
    unknown ids carry no audio and are only counted in `ignored`.
    """

    def __init__(self, token_ids: TokenIds) -> None:
        self.ids = token_ids
        self._stop = token_ids.stop_ids
        self._start_global = token_ids.structural["start_global_token"]
        self._end_global = token_ids.structural["end_global_token"]
        self.done = False
        """A stop id has been seen; further ids are dropped uncounted."""
        self.stop_id: int | None = None
        """The stop id that ended the stream, once `done`."""
        self.semantic_count = 0
        """Semantic codes returned so far."""
        self.ignored = 0
        """Ids that were neither semantic, stop, nor part of a global block."""
        self._globals: list[int] = []
        self._global_state = "none"  # none -> open (after start_global) -> closed (after end_global)

    def feed(self, token_ids: Iterable[int]) -> list[int]:
        """Consume a delta of generated ids; return the semantic codes (0..8191) it contained, in order."""
        codes: list[int] = []
        for token_id in token_ids:
            if self.done:
                break
            code = self.ids.semantic_index(token_id)
            if code is not None:
                codes.append(code)
            elif token_id in self._stop:
                self.done, self.stop_id = True, token_id
            elif not self._track_globals(token_id):
                self.ignored += 1
        self.semantic_count += len(codes)
        return codes

    def _track_globals(self, token_id: int) -> bool:
        """Advance the global-block state; True if the id belonged to it."""
        if token_id == self._start_global and self._global_state == "none":
            self._global_state = "open"
            return True
        if self._global_state != "open":
            return False
        if token_id == self._end_global:
            self._global_state = "closed"
            return True
        code = self.ids.global_index(token_id)
        if code is not None:
            self._globals.append(code)
        return code is not None

    @property
    def code_count(self) -> int:
        """Semantic codes returned so far (engine.families.base.CodeParser)."""
        return self.semantic_count

    @property
    def has_globals(self) -> bool:
        """A complete `<|start_global_token|>…<|end_global_token|>` block was seen (its size unchecked)."""
        return self._global_state == "closed"

    @property
    def global_codes(self) -> tuple[int, ...]:
        """The 32 speaker globals the model emitted (controllable mode).

        Raises GenerationError if no complete global block was emitted or it did not hold exactly 32 codes
        (upstream silently decodes whatever it got; a wrong count would garble the voice).
        """
        if self._global_state != "closed":
            raise GenerationError("the model emitted no complete speaker (global token) block; try another seed")
        if len(self._globals) != GLOBAL_COUNT:
            raise GenerationError(f"the model emitted {len(self._globals)} speaker global tokens, "
                                  f"expected {GLOBAL_COUNT}; try another seed")
        return tuple(self._globals)


def parse_all(ids: Sequence[int], token_ids: TokenIds) -> tuple[list[int], TokenParser]:
    """Parse a whole generated sequence at once: (semantic codes, the parser for done/globals/counts)."""
    parser = TokenParser(token_ids)
    return parser.feed(ids), parser
