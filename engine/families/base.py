"""Provides the model-family seam: the Protocols a family implements so the engine can run its checkpoints. Pure.

A family is one object (`ModelFamily`) that knows a kind of checkpoint: how to recognise and read its layout, its
voices, its codec decoder and that decoder's window geometry, its default sampling and how to write a synthetic
checkpoint for tests. Reading a checkpoint gives a `Checkpoint`; with the checkpoint's tokenizer it gives a
`Grammar`, the pure part the pipeline runs: the prompt for a sentence, the parser from generated ids to codec
frames and the stop rule, how a voice conditions generation, and how long a sentence may speak. The pipeline,
the servers, the front ends and export see only these Protocols.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Hashable, Iterable, Protocol, Sequence, runtime_checkable

from engine.config import SamplingOptions
from engine.lane_scheduler import LaneSizing
from engine.prompt import Prompt
from engine.voices import Voice, VoiceBank
from engine.windowing import WindowSchedule

if TYPE_CHECKING:  # numpy comes with it: what only asks which family a folder is (say's lean road) needs none
    from engine.backends.base import DecodeItem

Encode = Callable[[str], list[int]]
"""Plain text -> token ids with no special tokens added (the checkpoint's tokenizer)."""
Sample = Callable[[Prompt, int, int, str], Awaitable[list[int]]]
"""(prompt, how many tokens, seed, request id) -> the sampled ids: the engine's LLM, for conditioning that is
generated (Spark's speaker tokens)."""


@runtime_checkable
class TokenTable(Protocol):
    """The ids a token generator must know of a family's vocabulary."""

    @property
    def stop_ids(self) -> frozenset[int]:
        """Generation ends on any of these (the stop id is yielded, then the stream ends)."""
        ...

    @property
    def audio_ids(self) -> tuple[int, ...]:
        """Sorted ids sampling may choose from after a speech prompt: the codec's ids and the stop ids. The same
        tuple object every time, so generators can recognise it by identity and precompute a restricted head."""
        ...


@runtime_checkable
class CodeParser(Protocol):
    """Streaming state machine over one sentence's generated ids: id deltas in, codec frames out."""

    done: bool
    """A stop id has been seen; later ids are dropped."""
    stop_id: int | None
    """The id that ended the stream, once `done`."""
    ignored: int
    """Ids that carried no audio (structural, misplaced or unknown)."""

    def feed(self, token_ids: Iterable[int]) -> Sequence[Hashable]:
        """Consume a delta of generated ids; return the complete codec frames it finished, in order. A frame is
        whatever the family's decoder takes per step (Spark: one semantic code; Orpheus: a 7-code SNAC frame)."""
        ...

    @property
    def code_count(self) -> int:
        """Frames returned so far."""
        ...


@runtime_checkable
class Grammar(Protocol):
    """One checkpoint's prompt format and token grammar, bound to its tokenizer. Pure; what the Synthesizer runs."""

    # read-only properties: a family's grammar is a frozen dataclass
    @property
    def family(self) -> str:
        """The family's name ("spark", "orpheus")."""
        ...

    @property
    def token_ids(self) -> TokenTable:
        ...

    @property
    def tokens_per_code(self) -> int:
        """LLM tokens per codec frame (Spark 1, Orpheus 7): a sentence's token budget becomes audio through it."""
        ...

    def prompt(self, text: str, voice: Voice, conditioning: tuple[int, ...]) -> Prompt:
        """The LLM prompt for one normalized sentence in `voice`, with `allowed_ids` set to what may follow it."""
        ...

    def parser(self) -> CodeParser:
        """A fresh parser for one sentence's generated ids."""
        ...

    def normalize(self, sentence: str) -> str:
        """A sentence as the model should read it (numbers spelt out; the family's own markup kept)."""
        ...

    def token_cap(self, sentence: str) -> int:
        """Most tokens a normalized sentence may generate (how long the model may speak it)."""
        ...

    def sampling(self, opts: SamplingOptions) -> SamplingOptions:
        """A request's sampling with the family's defaults where it kept the engine-wide ones."""
        ...

    def stored_conditioning(self, voice: Voice, checkpoint_hash: str | None) -> tuple[int, ...] | None:
        """The voice's conditioning where it needs no computing (stored, or none needed), else None; stored
        conditioning made with another checkpoint (`checkpoint_hash`: the engine's) is an InputError."""
        ...

    async def conditioning(self, voice: Voice, sample: Sample) -> tuple[int, ...]:
        """Compute the voice's conditioning with the engine's LLM (cached per checkpoint by the caller)."""
        ...


@runtime_checkable
class Checkpoint(Protocol):
    """A validated checkpoint of some family: what the factory and the generators read of it."""

    family: str
    root: Path
    """The checkpoint directory."""
    llm_dir: Path
    """The Hugging Face LLM folder (config.json, weights, tokenizer) that vLLM and our generators load."""
    llm_config: dict[str, Any]
    sample_rate: int
    token_ids: TokenTable
    checkpoint_hash: str
    """Keys on-disk caches (voice conditioning, the int8 LLM, export manifests)."""

    def summary(self) -> list[str]:
        """`voicectl model info`'s lines about it."""
        ...


@runtime_checkable
class ModelFamily(Protocol):
    """Everything the engine needs to know about one family of checkpoints."""

    name: str
    description: str
    """One line for `voicectl model info` and errors."""
    llm_architecture: str
    """The Hugging Face architecture of its LLM (`LlamaForCausalLM`, `Qwen2ForCausalLM`)."""
    schedule: WindowSchedule
    """Streaming windows in the decoder's frames: the decoder's context and the first window's size."""
    whole_codes: int
    """Frames of one whole-sentence decode (export): about 15 s of audio."""
    default_sampling: SamplingOptions
    """Its sampling defaults (its grammar's `sampling` puts them where a request kept the engine-wide ones). A
    repetition penalty here (not 1.0) gives the graph lane built for it the penalty's ops."""
    lane: LaneSizing
    """How its graph lane on a GPU is sized: positions a row holds (the longest sentence it speaks), and the share of
    the GPU's memory their KV cache may take."""
    gpu_decoder_dtype: str
    """Its codec decoder's precision on a GPU where the engine streams (an engine.config.DECODER_DTYPES name): the
    lowest whose streamed seams stay within the seam bound against a full-precision one-shot decode. A deterministic
    engine (export) decodes in fp32 whatever the family."""
    sizes: tuple[str, ...]
    """Sizes `write_synthetic` knows ("tiny", "full")."""
    downloads: tuple[tuple[str, str], ...]
    """(Hugging Face repo, folder inside the checkpoint) of each part of the released checkpoint, first the LLM."""
    cached_voices: bool
    """A voice's conditioning is computed once per checkpoint and cached on disk (Spark's speaker tokens), and the
    user's own voices (cloned from a recording) are the family's too."""
    sample_rate: int
    """The codec's output rate (what a player opens before the engine is loaded; the engine's is authoritative)."""
    languages: tuple[str, ...]
    """Languages its models speak (ISO 639-1), as clients that list voices by language show them (speechd)."""

    def looks_like(self, root: Path) -> bool:
        """The directory has this family's layout (a cheap check on file names and configs, no weights read)."""
        ...

    def read(self, root: Path) -> Checkpoint:
        """Validate and describe the checkpoint; one-line ModelFormatError naming what is wrong."""
        ...

    def voices(self) -> VoiceBank:
        """The family's voices: presets, and the user's own where the family can use them."""
        ...

    def grammar(self, checkpoint: Any, encode: Encode) -> Grammar:
        """The checkpoint's grammar, with its tokenizer."""
        ...

    def decoder(self, checkpoint: Any, device: str, dtype: str, *, threads: int | None = None,
                deterministic: bool = False, autotune: str = "none") -> Any:
        """The codec decoder (engine.backends.base.CodecDecoder) on `device` in `dtype` (an
        engine.config.DECODER_DTYPES name)."""
        ...

    def write_synthetic(self, out_dir: Path, size: str = "tiny", seed: int = 0, overwrite: bool = False) -> Path:
        """A random-weight checkpoint in the exact layout, for tests and benchmarks."""
        ...

    def probe_item(self, length: int) -> DecodeItem:
        """A window of `length` valid frames (and a voice's conditioning) to time or warm a decoder with."""
        ...
