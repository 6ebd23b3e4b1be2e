"""Provides the Spark-TTS family: a Qwen2 LLM writing BiCodec semantic codes (50 a second, 16 kHz), a voice being
32 speaker tokens computed once per checkpoint from a preset's gender, pitch, speed and seed (or extracted from a
reference recording).

Pure at import: the token table, prompts and checkpoint reader are pure modules (engine.tokens, engine.prompt,
engine.model); the decoder and the synthetic writer import torch when called.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import DECODER_DTYPES, SamplingOptions
from engine.errors import GenerationError
from engine.families.base import Encode, Sample
from engine.lane_scheduler import LaneSizing
from engine.prompt import Prompt, build_controllable_prompt, build_globals_prompt
from engine.text import normalize, sentence_token_cap
from engine.tokens import GLOBAL_CODEBOOK, GLOBAL_COUNT, SEMANTIC_CODEBOOK, TokenIds, TokenParser
from engine.voices import Voice, VoiceBank, stored_globals
from engine.windowing import WHOLE_CODES, WindowSchedule

VOICE_TEXT = "The quick brown fox jumps over the lazy dog."
"""Text of the controllable prompt used to compute a preset's speaker globals."""
CODES_PER_S = 50
"""BiCodec semantic codes per second of audio (320 samples each at 16 kHz)."""


@dataclass(frozen=True, slots=True)
class SparkGrammar:
    """A Spark checkpoint's grammar (engine.families.base.Grammar): globals-prefixed prompts, semantic codes out."""

    token_ids: TokenIds
    encode: Encode
    family: str = "spark"
    tokens_per_code: int = 1

    def prompt(self, text: str, voice: Voice, conditioning: tuple[int, ...]) -> Prompt:
        return build_globals_prompt(text, conditioning, self.token_ids, self.encode)

    def parser(self) -> TokenParser:
        return TokenParser(self.token_ids)

    def normalize(self, sentence: str) -> str:
        return normalize(sentence)

    def token_cap(self, sentence: str) -> int:
        return sentence_token_cap(sentence, CODES_PER_S)

    def sampling(self, opts: SamplingOptions) -> SamplingOptions:
        return opts  # the engine-wide defaults are Spark's

    def stored_conditioning(self, voice: Voice, checkpoint_hash: str | None) -> tuple[int, ...] | None:
        return None if voice.global_tokens is None else stored_globals(voice, checkpoint_hash)

    async def conditioning(self, voice: Voice, sample: Sample) -> tuple[int, ...]:
        """Run the controllable prompt, constrained to the output grammar
        `<start_acoustic><pitch_value><speed_value><end_acoustic><start_global>{32 globals}`, sampling each slot
        from the model restricted to its legal ids. A trained model puts ~all mass there anyway; a random one
        (synthetic checkpoints) would otherwise never produce a voice."""
        ids = self.token_ids
        base = build_controllable_prompt(VOICE_TEXT, voice.gender, voice.pitch, voice.speed, ids, self.encode)
        s = ids.structural
        prefix = list(base.ids) + [s["start_acoustic_token"]]
        slots = [("pitch_value", 1001), ("speed_value", 11)]
        for i, (family, count) in enumerate(slots):
            first = ids.families[family]
            prefix += await sample(Prompt(tuple(prefix), tuple(range(first, first + count))), 1, voice.seed + i,
                                   f"globals-{voice.name}-{family}")
        prefix += [s["end_acoustic_token"], s["start_global_token"]]
        allowed = tuple(range(ids.global_base, ids.global_base + GLOBAL_CODEBOOK))
        picked = await sample(Prompt(tuple(prefix), allowed), GLOBAL_COUNT, voice.seed + 7, f"globals-{voice.name}")
        codes = tuple(code for t in picked if (code := ids.global_index(t)) is not None)
        if len(picked) != GLOBAL_COUNT or len(codes) != len(picked):
            raise GenerationError(f"voice {voice.name!r}: the model produced {len(picked)} global tokens, "
                                  f"expected {GLOBAL_COUNT}")
        return codes


class SparkFamily:
    """Spark-TTS-0.5B checkpoints (engine.families.base.ModelFamily): `config.yaml`, `LLM/`, `BiCodec/`."""

    name = "spark"
    description = "Spark-TTS (Qwen2 LLM + BiCodec, 16 kHz)"
    llm_architecture = "Qwen2ForCausalLM"
    schedule = WindowSchedule()
    whole_codes = WHOLE_CODES
    default_sampling = SamplingOptions()  # the engine-wide defaults are Spark's: no repetition penalty
    lane = LaneSizing()  # 4,096 positions at 20% of the GPU: 512 rows on an H200, and export bytes as they were
    # bf16 breaks the seam bound; fp16 keeps within it at far less decoder time than fp32, which a crowd needs
    gpu_decoder_dtype = "fp16"
    sizes = ("tiny", "full")
    sample_rate = 16000
    languages = ("en", "zh")
    cached_voices = True
    downloads = (("SparkAudio/Spark-TTS-0.5B", ""),)

    def looks_like(self, root: Path) -> bool:
        return (root / "config.yaml").is_file() or (root / "BiCodec").is_dir()

    def read(self, root: Path) -> Any:
        from engine.model import load_model_info

        return load_model_info(root)

    def voices(self) -> VoiceBank:
        return VoiceBank()

    def grammar(self, checkpoint: Any, encode: Encode) -> SparkGrammar:
        return SparkGrammar(checkpoint.token_ids, encode)

    def decoder(self, checkpoint: Any, device: str, dtype: str, *, threads: int | None = None,
                deterministic: bool = False, autotune: str = "none") -> Any:
        import torch

        from engine.backends.bicodec import BiCodecDecoder

        torch_dtype = getattr(torch, DECODER_DTYPES[dtype])
        if device == "cpu":
            return BiCodecDecoder(checkpoint.bicodec_dir, device="cpu", dtype=torch_dtype, num_threads=threads)
        return BiCodecDecoder(checkpoint.bicodec_dir, device=device, dtype=torch_dtype, num_threads=threads,
                              deterministic=deterministic, autotune=autotune)

    def write_synthetic(self, out_dir: Path, size: str = "tiny", seed: int = 0, overwrite: bool = False) -> Path:
        from engine.synthetic import write_checkpoint

        return write_checkpoint(out_dir, size=size, seed=seed, overwrite=overwrite)

    def probe_item(self, length: int) -> Any:
        """A `length`-code window of valid codes and a voice's globals, to time or warm a decoder with."""
        from engine.backends.base import DecodeItem

        return DecodeItem(tuple((7 * k) % SEMANTIC_CODEBOOK for k in range(length)), tuple(range(GLOBAL_COUNT)))


SPARK = SparkFamily()
