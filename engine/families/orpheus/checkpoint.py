"""Provides Orpheus checkpoint detection and validation: the LLM folder, its tokenizer, and its `snac/`. Pure.

Layout (docs/orpheus.md): the folder is the Orpheus LLM as its hub repo ships it (`config.json` for
LlamaForCausalLM, safetensors weights, single or sharded with an index, `tokenizer.json` and friends) with a
`snac/` subfolder holding the SNAC 24 kHz decoder's `config.json` + `pytorch_model.bin`. `read_orpheus` reads
configs, safetensors headers and the tokenizer JSON only (no weights, no torch) and fails with one line naming
the file and what was expected.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelFormatError, ModelNotFound
from engine.families.orpheus import grammar as g
from engine.model import EMBED_KEY, read_llm_weights

LLM_ARCHITECTURE = "LlamaForCausalLM"
SNAC_DIR = "snac"
SNAC_CONFIG = "config.json"
SNAC_WEIGHTS = "pytorch_model.bin"
LLM_FILES = ("config.json", "tokenizer.json")

_SNAC_KEYS = ("sampling_rate", "encoder_dim", "encoder_rates", "decoder_dim", "decoder_rates", "codebook_size",
              "codebook_dim", "vq_strides", "noise", "depthwise")
"""Keys every SNAC config.json has (they are SNAC's constructor arguments); `latent_dim` and
`attn_window_size` may be absent."""


@dataclass(frozen=True, slots=True)
class SnacConfig:
    """The decode-side facts of a SNAC `config.json`."""

    sample_rate: int
    """Output rate (24000 for the 24 kHz model Orpheus uses)."""
    latent_dim: int
    """Channels of the quantizer's latent: `latent_dim`, else encoder_dim * 2**len(encoder_rates)."""
    decoder_dim: int
    """Channels after the decoder's input convolution; each upsampling block halves them."""
    decoder_rates: tuple[int, ...]
    """Upsampling factor of each decoder block; their product is the latent hop in samples."""
    vq_strides: tuple[int, ...]
    """Latent steps per code of each level (coarsest first): (4, 2, 1) for Orpheus' 7-code frame."""
    codebook_size: int
    """Entries per level's codebook (4096)."""
    codebook_dim: int
    """Width of a codebook entry before the output projection lifts it to latent_dim (8)."""
    noise: bool
    """The decoder blocks add run-time noise (NoiseBlock) after each upsampling."""
    depthwise: bool
    """Depthwise (grouped) convolutions in the input and residual layers."""
    encoder_dim: int
    """Encoder width: read to size the encoder tensors the decoder leaves unread."""
    encoder_rates: tuple[int, ...]
    """Encoder downsampling factors (the decoder's in reverse)."""

    @property
    def hop(self) -> int:
        """Samples per latent step."""
        return math.prod(self.decoder_rates)

    @property
    def samples_per_frame(self) -> int:
        """Samples one 7-token frame decodes to (2048 at 24 kHz)."""
        return self.hop * self.vq_strides[0]


@dataclass(frozen=True, slots=True)
class LlamaSummary:
    """The LLM config facts the engine sizes caches and checks ids with."""

    hidden_size: int
    num_layers: int
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention: 8 in the release, 3 query heads each)."""
    head_dim: int
    """`head_dim`, else hidden_size / num_heads."""
    intermediate_size: int
    vocab_size: int
    """Embedding rows (156 940 in the release; the tokenizer knows fewer)."""
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    """Llama-3 frequency scaling (`rope_type: llama3`, factor 32 in the release), or None."""
    max_position_embeddings: int
    tie_word_embeddings: bool
    """The output head reuses the embedding (no lm_head tensor in the weights)."""
    torch_dtype: str | None
    """The dtype the config names (bfloat16 in the release), if any."""


@dataclass(frozen=True, slots=True)
class OrpheusInfo:
    """A validated Orpheus checkpoint."""

    root: Path
    """The LLM folder (what vLLM / transformers load), holding `snac/`."""
    snac_dir: Path
    """`snac/`: what SnacDecoder loads."""
    snac_weights: Path
    """`snac/pytorch_model.bin` (checked to exist; read only by the decoder, weights-only)."""
    sample_rate: int
    """24000: SNAC's rate, which is the family's output rate."""
    llm: LlamaSummary
    """The LLM config facts, checked."""
    llm_config: dict[str, Any]
    """`config.json` as read."""
    snac: SnacConfig
    """`snac/config.json`, checked to decode Orpheus frames."""
    llm_weights: tuple[Path, ...]
    """Safetensors file(s) of the LLM."""
    llm_dtype: str
    """Storage dtype of the embedding (BF16 in the release)."""
    tokenizer_file: Path
    """`tokenizer.json`, checked for Llama's BOS/EOT and every custom token the grammar uses."""


def read_orpheus(model_dir: str | os.PathLike[str]) -> OrpheusInfo:
    """Validate the Orpheus checkpoint at `model_dir` and describe it (configs and headers only).

    Raises ModelNotFound for a missing directory and ModelFormatError (one line naming the file) when the
    layout is not Orpheus': no `snac/` beside the Llama, a `snac/` beside a Spark-TTS (Qwen2) LLM, a vocabulary
    without the audio ids, a SNAC that is not the 24 kHz 3-level model.
    """
    root = Path(model_dir).expanduser()
    if not root.is_dir():
        raise ModelNotFound(f"{root}: no such directory (expected an Orpheus model folder)")
    snac_dir = root / SNAC_DIR
    config_path = root / "config.json"
    _refuse_spark_mix(root, snac_dir, config_path)
    config = _read_json(config_path, "an Orpheus (LlamaForCausalLM) config")
    arch = config.get("architectures") or []
    if LLM_ARCHITECTURE not in arch:
        mix = " beside snac/: a mix" if snac_dir.is_dir() else ""
        raise ModelFormatError(f"{config_path}: expected architectures [{LLM_ARCHITECTURE}], found {arch!r}{mix}")
    if not snac_dir.is_dir():
        raise ModelFormatError(f"{snac_dir}: missing (an Orpheus folder holds the SNAC 24 kHz decoder there: "
                               f"{SNAC_CONFIG} + {SNAC_WEIGHTS})")
    llm = llama_summary(config, config_path)
    weights, embed_file, embed = read_llm_weights(root)
    if embed["shape"] != [llm.vocab_size, llm.hidden_size]:
        raise ModelFormatError(f"{embed_file}: expected {EMBED_KEY} of shape [{llm.vocab_size}, {llm.hidden_size}]"
                               f", found {embed['shape']}")
    tokenizer_file = root / "tokenizer.json"
    check_tokenizer(tokenizer_file)
    snac = read_snac_config(snac_dir / SNAC_CONFIG)
    snac_weights = snac_dir / SNAC_WEIGHTS
    if not snac_weights.is_file():
        raise ModelFormatError(f"{snac_weights}: missing (expected the SNAC weights)")
    return OrpheusInfo(root=root, snac_dir=snac_dir, snac_weights=snac_weights, sample_rate=snac.sample_rate,
                       llm=llm, llm_config=config, snac=snac, llm_weights=weights, llm_dtype=embed["dtype"],
                       tokenizer_file=tokenizer_file)


def _refuse_spark_mix(root: Path, snac_dir: Path, config_path: Path) -> None:
    """A Spark-TTS folder (Qwen2 under LLM/, or a Qwen2 config here) with a `snac/` added is neither family."""
    if not snac_dir.is_dir():
        return
    for path in (config_path, root / "LLM" / "config.json"):
        try:
            with open(path, encoding="utf-8") as f:
                arch = json.load(f).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            continue
        if "Qwen2ForCausalLM" in arch:
            raise ModelFormatError(f"{path}: a Qwen2ForCausalLM (Spark-TTS) LLM beside {snac_dir.name}/: a mix of "
                                   f"two families; Orpheus needs its LlamaForCausalLM folder")


def llama_summary(config: dict[str, Any], path: Path) -> LlamaSummary:
    """The LlamaSummary of a config dict; ModelFormatError names `path` and the first bad key."""
    def need(key: str, kind: type = int) -> Any:
        value = config.get(key)
        ok = isinstance(value, (int, float)) if kind is float else _positive_int(value)
        if not ok:
            raise ModelFormatError(f"{path}: expected a positive {kind.__name__} `{key}`, found {value!r}")
        return value

    heads = need("num_attention_heads")
    summary = LlamaSummary(
        hidden_size=need("hidden_size"), num_layers=need("num_hidden_layers"), num_heads=heads,
        num_kv_heads=need("num_key_value_heads"),
        head_dim=config.get("head_dim") or need("hidden_size") // heads, intermediate_size=need("intermediate_size"),
        vocab_size=need("vocab_size"), rope_theta=float(need("rope_theta", float)),
        rope_scaling=config.get("rope_scaling"), max_position_embeddings=need("max_position_embeddings"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), torch_dtype=config.get("torch_dtype"))
    if summary.vocab_size < g.AUDIO_END:
        raise ModelFormatError(f"{path}: vocab_size {summary.vocab_size} has no room for the audio ids (needs at "
                               f"least {g.AUDIO_END}): not an Orpheus LLM")
    return summary


def check_tokenizer(path: Path) -> None:
    """The tokenizer has Llama's BOS/EOT and every `<custom_token_N>` the grammar uses at 128256 + N."""
    data = _read_json(path, "a Hugging Face fast tokenizer")
    added = {e.get("content"): e.get("id") for e in data.get("added_tokens") or [] if isinstance(e, dict)}
    for text, want in (("<|begin_of_text|>", g.BEGIN_OF_TEXT), ("<|eot_id|>", g.END_OF_TEXT)):
        if added.get(text) != want:
            raise ModelFormatError(f"{path}: expected {text} at id {want}, found {added.get(text)!r}")
    for n in range(g.AUDIO_END - g.CUSTOM_BASE):
        text = f"<custom_token_{n}>"
        if added.get(text) != g.CUSTOM_BASE + n:
            raise ModelFormatError(f"{path}: expected {text} at id {g.CUSTOM_BASE + n}, found {added.get(text)!r} "
                                   f"(not an Orpheus tokenizer)")


def read_snac_config(path: Path) -> SnacConfig:
    """A SNAC `config.json` that Orpheus frames decode with: 24 kHz, three levels at strides (4, 2, 1), 4096-entry
    codebooks, no local attention (the 24 kHz model has none, and our decoder does not implement it)."""
    raw = _read_json(path, "the SNAC config")
    for key in _SNAC_KEYS:
        if key not in raw:
            raise ModelFormatError(f"{path}: missing key {key} (expected a SNAC config)")
    if raw.get("attn_window_size") is not None:
        raise ModelFormatError(f"{path}: attn_window_size {raw['attn_window_size']!r}: a SNAC with local attention "
                               f"(32/44 kHz); Orpheus uses the 24 kHz model, which has none")
    try:
        latent = raw.get("latent_dim") or int(raw["encoder_dim"]) * 2 ** len(raw["encoder_rates"])
        cfg = SnacConfig(
            sample_rate=int(raw["sampling_rate"]), latent_dim=int(latent), decoder_dim=int(raw["decoder_dim"]),
            decoder_rates=tuple(int(r) for r in raw["decoder_rates"]),
            vq_strides=tuple(int(s) for s in raw["vq_strides"]), codebook_size=int(raw["codebook_size"]),
            codebook_dim=int(raw["codebook_dim"]), noise=bool(raw["noise"]), depthwise=bool(raw["depthwise"]),
            encoder_dim=int(raw["encoder_dim"]), encoder_rates=tuple(int(r) for r in raw["encoder_rates"]))
    except (TypeError, ValueError) as err:
        raise ModelFormatError(f"{path}: unusable SNAC config ({' '.join(str(err).split())})") from None
    want = (g.SAMPLE_RATE, (4, 2, 1), g.CODEBOOK, g.SAMPLES_PER_FRAME)
    found = (cfg.sample_rate, cfg.vq_strides, cfg.codebook_size, cfg.samples_per_frame)
    if found != want:
        raise ModelFormatError(f"{path}: expected sampling_rate, vq_strides, codebook_size, samples per frame "
                               f"{want}, found {found} (Orpheus frames need SNAC 24 kHz)")
    if cfg.decoder_dim % 2 ** len(cfg.decoder_rates):
        raise ModelFormatError(f"{path}: decoder_dim {cfg.decoder_dim} cannot halve {len(cfg.decoder_rates)} times")
    return cfg


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing (expected {what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFormatError(f"{path}: cannot parse (expected {what}): {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: expected a JSON object ({what}), found {type(data).__name__}")
    return data


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
