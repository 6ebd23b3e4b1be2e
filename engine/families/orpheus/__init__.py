"""Provides the Orpheus family: a Llama-3.2-3B LLM writing SNAC codes as 7 audio tokens a frame (24 kHz, 2,048
samples a frame), a voice being its name in the prompt (tara, leah, jess, leo, dan, mia, zac, zoe). It samples as
upstream does (DEFAULT_SAMPLING: temperature 0.6, top-p 0.8, repetition penalty 1.3 with vLLM's rule) on every
generator: vLLM, the torch generator (int8 on a CPU too) and a graph lane built with the penalty's ops.

The checkpoint is the LLM's Hugging Face folder with SNAC's in `snac/` (engine.families.orpheus.checkpoint). Pure
at import: the grammar and the checkpoint reader are pure; the SNAC decoder and the synthetic writer import torch
when called.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.config import DECODER_DTYPES, SamplingOptions
from engine.families.base import Encode, Sample
from engine.families.orpheus import grammar
from engine.lane_scheduler import LaneSizing, sentence_positions
from engine.prompt import Prompt
from engine.voices import PresetBank, Voice, VoiceBank
from engine.windowing import WindowSchedule

SAMPLE_RATE = grammar.SAMPLE_RATE
SAMPLES_PER_FRAME = grammar.SAMPLES_PER_FRAME
TOKENS_PER_FRAME = grammar.FRAME_TOKENS
FRAMES_PER_S = SAMPLE_RATE / SAMPLES_PER_FRAME
"""SNAC frames per second of audio (about 11.7; 82 LLM tokens a second for real time)."""
DEFAULT_SAMPLING = SamplingOptions(temperature=grammar.TEMPERATURE, top_k=50, top_p=grammar.TOP_P,
                                   repetition_penalty=grammar.REPETITION_PENALTY)
"""Upstream's temperature, top-p and repetition penalty (1.3, with vLLM's rule: every generator applies it, the graph
lane built for Orpheus included; docs/orpheus.md). Upstream has no top-k; 50 lets the graph lane's sampler (64
candidates) take every request, and at temperature 0.6 and top-p 0.8 a trained model's nucleus is far narrower than
50 ids."""
SAMPLED = ("temperature", "top_k", "top_p", "repetition_penalty")
"""The knobs DEFAULT_SAMPLING sets where a request kept the engine-wide default."""
SCHEDULE = WindowSchedule(first_new=1, new=2, growth=2.0, max_new=32, left=3, right=2,
                          busy_first_new=8, busy_new=8, busy_growth=1.25, crossfade=0)
"""Windows in SNAC frames (85 ms each). Three frames of left context and two of right put every seam far below
-40 dB and, with the decoder's noise keyed to the position, windows join without a crossfade. The first window is
one frame: first audio after 21 tokens. The second is two, 14 tokens later: a player starts once it holds more than
the first frame (its device takes more as it starts), so the second chunk is what a listener waits for, and with
the first frame's 85 ms in hand it should come well inside them. A crowd's streams get their tokens at 1.3-1.5x
real time, where windows growing by 2 run dry before the second chunk: the busy schedule starts with two windows of
8 frames and grows by 1.25, which keeps up from about 1.2x (engine.bench.playback `window_arrivals`)."""
WHOLE_FRAMES = 176
"""Frames of a whole-sentence decode (export): 15 s."""
LANE_MEMORY_SHARE = 0.75
"""Share of the GPU's memory the KV cache of Orpheus's crowd lane may take (LaneSizing): a 3B row holds 112 KiB a
position, eight times Spark's 0.5B, so Spark's 20% would give a 141 GB card 64 rows at most. A crowd lane runs with no
vLLM beside it (engine.factory.holds_a_crowd), so the card holds only the weights (6.4 GB), the SNAC decoder and its
graphs, the lane's own buffers and, should a request outgrow the lane, the torch generator behind it (another 6.4
GB): a quarter of the card is room for all of them. Rows are a power of two, so the cache takes at most this
share and often less (256 rows of 3,512 positions are 103 GB of a 141 GB card, 128 rows 52 GB of an 80 GB one)."""

EXPORT_LANES = ((1024, 256), (2048, 128))
"""Export's fixed-shape lanes (LaneSizing.fixed): Spark's spans (the ones the invariance probe passed),
with twice the long lane's rows. A sentence's token budget is 1.64 times Spark's (82 tokens a second of audio against
50), so one of more than ~67 letters (about 80 characters) outgrows the 1,024 positions: much of a book takes the long
lane. One of more than ~140 letters outgrows the long lane too, and runs there with its budget cut to fit
(LaneSizing.fit_budget): ~22 s, about 1.2 times the longest sentence the pipeline cuts read aloud, where the torch
generator behind the lanes would step it alone."""
EXPORT_LANE_SHARE = 0.20
"""Share of the GPU's memory each of those lanes' KV cache may take: a 3B row over 2,048 positions is 224 MiB, so
Spark's 10% would hold 64 rows of the long lane on a 141 GB card."""

@dataclass(frozen=True, slots=True)
class OrpheusGrammar:
    """An Orpheus checkpoint's grammar (engine.families.base.Grammar): `voice: text` prompts, 7-token frames out."""

    token_ids: Any
    """engine.families.orpheus.grammar.OrpheusIds: the stop id and the audio ids."""
    encode: Encode
    family: str = "orpheus"
    tokens_per_code: int = TOKENS_PER_FRAME

    def prompt(self, text: str, voice: Voice, conditioning: tuple[int, ...]) -> Prompt:
        return grammar.build_prompt(text, voice.name, self.encode)

    def parser(self) -> Any:
        return grammar.FrameParser()

    def normalize(self, sentence: str) -> str:
        return grammar.prompt_text(sentence)

    def token_cap(self, sentence: str) -> int:
        from engine.text import sentence_token_cap

        return sentence_token_cap(sentence, FRAMES_PER_S * TOKENS_PER_FRAME)

    def stored_conditioning(self, voice: Voice, checkpoint_hash: str | None) -> tuple[int, ...] | None:
        return ()  # the voice is its name in the prompt

    async def conditioning(self, voice: Voice, sample: Sample) -> tuple[int, ...]:
        return ()

    def sampling(self, opts: SamplingOptions) -> SamplingOptions:
        """A request's sampling with the engine-wide defaults it left as they are replaced by Orpheus's."""
        base = SamplingOptions()
        return replace(opts, **{name: getattr(DEFAULT_SAMPLING, name) for name in SAMPLED
                               if getattr(opts, name) == getattr(base, name)})


class OrpheusFamily:
    """Orpheus TTS checkpoints (engine.families.base.ModelFamily): a Llama folder plus `snac/`."""

    name = "orpheus"
    description = "Orpheus TTS (Llama LLM + SNAC, 24 kHz): a Llama config.json beside snac/"
    llm_architecture = "LlamaForCausalLM"
    schedule = SCHEDULE
    whole_codes = WHOLE_FRAMES
    default_sampling = DEFAULT_SAMPLING
    gpu_decoder_dtype = "fp32"  # fp16 keeps within the seam bound on the CPU; whether it pays on a GPU is unmeasured
    sizes = ("tiny", "full")
    sample_rate = SAMPLE_RATE
    languages = ("en",)  # the released fine-tune is English
    cached_voices = False
    downloads = (("canopylabs/orpheus-3b-0.1-ft", ""), ("hubertsiuzdak/snac_24khz", "snac"))

    @property
    def lane(self) -> LaneSizing:
        """Positions for the longest sentence the pipeline cuts (JoinConfig.max_sentence_chars, none of them
        spaces) at its token cap, at most the engine-wide max_tokens (the bound that binds: 82 tokens a second of
        audio allows such a sentence more than 3,000), after the longest prompt a lane prefills; at
        LANE_MEMORY_SHARE. Export's lanes: EXPORT_LANES at EXPORT_LANE_SHARE, the longest fitting every budget."""
        from engine.config import JoinConfig
        from engine.text import sentence_token_cap

        longest = sentence_token_cap("x" * JoinConfig().max_sentence_chars, FRAMES_PER_S * TOKENS_PER_FRAME)
        return LaneSizing(sentence_positions(min(longest, SamplingOptions().max_tokens)), LANE_MEMORY_SHARE,
                          fixed=EXPORT_LANES, fixed_share=EXPORT_LANE_SHARE,
                          fit_budget=True)

    def looks_like(self, root: Path) -> bool:
        if (root / "snac").is_dir():
            return True
        try:
            config = json.loads((root / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(config, dict) and self.llm_architecture in (config.get("architectures") or [])

    def read(self, root: Path) -> Any:
        from engine.families.orpheus.checkpoint import read_orpheus
        from engine.model import checkpoint_hash

        info = read_orpheus(root)
        return OrpheusCheckpoint(info, grammar.OrpheusIds(), checkpoint_hash(info.root))

    def voices(self) -> VoiceBank:
        return PresetBank({name: Voice(name, f"Orpheus voice {name}", VOICE_GENDERS[name]) for name in grammar.VOICES})

    def grammar(self, checkpoint: Any, encode: Encode) -> OrpheusGrammar:
        return OrpheusGrammar(checkpoint.token_ids, encode)

    def decoder(self, checkpoint: Any, device: str, dtype: str, *, threads: int | None = None,
                deterministic: bool = False, autotune: str = "none") -> Any:
        import torch

        from engine.families.orpheus.snac import SnacDecoder

        if device == "cpu" and threads:
            torch.set_num_threads(threads)
        torch_dtype = getattr(torch, DECODER_DTYPES[dtype])
        return SnacDecoder(checkpoint.snac_dir, device=device, dtype=torch_dtype)

    def write_synthetic(self, out_dir: Path, size: str = "tiny", seed: int = 0, overwrite: bool = False) -> Path:
        import shutil

        from engine.errors import OutputError
        from engine.families.orpheus.synthetic import write_checkpoint

        out = Path(out_dir)
        if overwrite and out.is_dir() and any(out.iterdir()):
            if not self.looks_like(out):
                raise OutputError(f"refusing to overwrite {out}: it is not empty and does not look like a checkpoint")
            shutil.rmtree(out)
        return write_checkpoint(out, size=size, seed=seed)

    def probe_item(self, length: int) -> Any:
        from engine.backends.base import DecodeItem

        frames = tuple(tuple((97 * (f * TOKENS_PER_FRAME + k)) % 4096 for k in range(TOKENS_PER_FRAME))
                       for f in range(length))
        return DecodeItem(frames, ())


VOICE_GENDERS = {"tara": "female", "leah": "female", "jess": "female", "leo": "male", "dan": "male", "mia": "female",
                 "zac": "male", "zoe": "female"}
"""The released voices' genders (what speech-dispatcher's voice types and the voice lists show)."""


@dataclass(frozen=True)
class OrpheusCheckpoint:
    """A read Orpheus checkpoint (engine.families.base.Checkpoint) around engine.families.orpheus.checkpoint's
    OrpheusInfo."""

    info: Any
    token_ids: Any
    checkpoint_hash: str
    family: str = "orpheus"

    @property
    def root(self) -> Path:
        return self.info.root

    @property
    def llm_dir(self) -> Path:
        return self.info.root  # the LLM folder is the checkpoint

    @property
    def llm_config(self) -> dict[str, Any]:
        return self.info.llm_config

    @property
    def sample_rate(self) -> int:
        return self.info.sample_rate

    @property
    def snac_dir(self) -> Path:
        return self.info.snac_dir

    def summary(self) -> list[str]:
        """`voicectl model info`'s lines."""
        llm = self.info.llm
        return [f"sample rate  {self.sample_rate} Hz",
                f"LLM          LlamaForCausalLM, {llm.num_layers} layers, hidden {llm.hidden_size}, "
                f"vocab {llm.vocab_size}, {self.info.llm_dtype}",
                f"codec        SNAC {self.info.snac.sample_rate} Hz in {self.snac_dir}",
                f"tokens       audio {grammar.AUDIO_BASE}..{grammar.AUDIO_END - 1}, stop {grammar.END_OF_SPEECH}",
                f"voices       {', '.join(grammar.VOICES)}"]


ORPHEUS = OrpheusFamily()
