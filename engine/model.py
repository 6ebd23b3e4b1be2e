"""Provides checkpoint discovery and validation: where the model is, what it contains, and a stable hash. Pure.

`resolve_model_dir` picks the directory (`--model`, then `VOICEAPP_MODEL`, then the Hugging Face cache);
`load_model_info` checks the Spark-TTS-0.5B layout (format spec §1, §2) without loading any weights (it parses
YAML, JSON and safetensors headers only) and reads the token ids from the checkpoint's own tokenizer.
Every failure is one line naming the file and what was expected. Imports no torch/transformers/safetensors.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeGuard

from engine.config import MODEL_ENV
from engine.errors import ModelFormatError, ModelNotFound
from engine.tokens import GLOBAL_CODEBOOK, SEMANTIC_CODEBOOK, TokenIds, tok

DEFAULT_REPO = "SparkAudio/Spark-TTS-0.5B"
"""Hugging Face repo id of the released checkpoint (looked up in the local cache; fetched by `model download`)."""

ENV_VAR = MODEL_ENV

LLM_ARCHITECTURE = "Qwen2ForCausalLM"
EMBED_KEY = "model.embed_tokens.weight"
WAV2VEC2_DIR = "wav2vec2-large-xlsr-53"

FAMILY_SIZES = {
    "pitch_value": 1001, "pitch_var_value": 11, "pitch_label": 5, "pitch_var_label": 5, "speed_value": 11,
    "speed_label": 5, "loudness_value": 31, "loudness_label": 5, "age": 5, "gender": 3, "emotion": 101,
}
"""Attribute families `<|name_0|>..<|name_{n-1}|>` and their sizes, in Spark's append order (spec §2.2)."""

MAX_HEADER = 100 * 1024 * 1024
"""Largest safetensors header we accept (the format's own limit)."""

HASH_CACHE_ENTRIES = 4096
"""Most file digests kept in the user cache's `file-digests.json` (the oldest go first)."""


HINT = ("run `voicectl model download`, or `voicectl model synth --size tiny DIR` for a random test model, "
        f"then pass --model DIR or set {ENV_VAR}=DIR")
"""What to do when no model is found; part of every ModelNotFound message."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A validated Spark-TTS checkpoint: where its parts are and what the engine needs to know about them."""

    root: Path
    """The checkpoint directory (holds `config.yaml`, `LLM/`, `BiCodec/`)."""
    llm_dir: Path
    """`LLM/`: a Hugging Face Qwen2 model + tokenizer directory (what vLLM / transformers load)."""
    bicodec_dir: Path
    """`BiCodec/`: `config.yaml` + `model.safetensors`."""
    wav2vec2_dir: Path | None
    """`wav2vec2-large-xlsr-53/` if present (needed only to clone a voice from a reference clip)."""
    sample_rate: int
    """Output sample rate from the top-level config (16000 in the release)."""
    config: dict[str, Any]
    """The top-level `config.yaml`."""
    llm_config: dict[str, Any]
    """`LLM/config.json`."""
    bicodec_config: dict[str, Any]
    """The `audio_tokenizer` mapping of `BiCodec/config.yaml`."""
    token_ids: TokenIds
    """Token ids read from `LLM/tokenizer.json`."""
    vocab_size: int
    """LLM embedding rows (`vocab_size` in `LLM/config.json`; 166000 in the release)."""
    tokenizer_size: int
    """Number of ids the tokenizer knows (165158 in the release); always <= vocab_size."""
    hidden_size: int
    """LLM hidden size (896 in the release)."""
    llm_weights: tuple[Path, ...]
    """LLM safetensors file(s)."""
    llm_dtype: str
    """Storage dtype of the LLM embedding in its safetensors file (F32 in the release)."""
    bicodec_weights: Path
    """`BiCodec/model.safetensors`."""
    checkpoint_hash: str
    """`checkpoint_hash(root)`: keys on-disk caches (e.g. computed voice globals)."""
    family: str = "spark"
    """Its model family (engine.families.base.Checkpoint)."""

    def summary(self) -> list[str]:
        """`voicectl model info`'s lines."""
        ids, cfg = self.token_ids, self.llm_config
        return [f"sample rate  {self.sample_rate} Hz",
                f"LLM          {cfg.get('architectures', ['?'])[0]}, {cfg.get('num_hidden_layers')} layers, "
                f"hidden {self.hidden_size}, vocab {self.vocab_size} (tokenizer {self.tokenizer_size}), "
                f"{self.llm_dtype}",
                f"tokens       global {ids.global_base}..{ids.global_base + 4095}, "
                f"semantic {ids.semantic_base}..{ids.semantic_base + 8191}, im_end {ids.im_end}, "
                f"endoftext {ids.endoftext}, end_semantic {ids.structural['end_semantic_token']}",
                f"wav2vec2     {'present' if self.wav2vec2_dir else 'absent (cloning from a reference clip unavailable)'}"]


# ---------------------------------------------------------------------------------------------------- discovery

def resolve_model_dir(arg: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The checkpoint directory: `arg` (--model), else $VOICEAPP_MODEL, else the Hugging Face cache snapshot.

    Raises ModelNotFound saying what to run when none is found. Does not validate the contents.
    """
    env = os.environ if env is None else env
    if arg is not None and str(arg) != "":
        return _existing_dir(Path(arg).expanduser(), f"--model {arg}")
    if env.get(ENV_VAR):
        return _existing_dir(Path(env[ENV_VAR]).expanduser(), f"{ENV_VAR}={env[ENV_VAR]}")
    cache = hf_hub_cache(env)
    snapshot = cached_snapshot(DEFAULT_REPO, cache)
    if snapshot is not None:
        return snapshot
    if (cache / _repo_folder(DEFAULT_REPO) / "snapshots").is_dir():
        raise ModelNotFound(f"the download of {DEFAULT_REPO} in {cache} is incomplete: run `voicectl model download` "
                            f"again, or pass --model DIR or set {ENV_VAR}=DIR")
    raise ModelNotFound(f"no Spark-TTS model found (no --model, no {ENV_VAR}, not in the Hugging Face cache "
                        f"{cache}): {HINT}")


def _existing_dir(path: Path, source: str) -> Path:
    if not path.exists():
        raise ModelNotFound(f"{source}: no such directory; {HINT}")
    if not path.is_dir():
        raise ModelNotFound(f"{source}: not a directory (expected a Spark-TTS checkpoint folder); {HINT}")
    return path


def hf_hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache directory, resolved from the environment as huggingface_hub does."""
    env = os.environ if env is None else env
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "huggingface" / "hub"


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def cached_snapshot(repo_id: str = DEFAULT_REPO, cache: Path | None = None) -> Path | None:
    """The cache snapshot of `repo_id` that has a top-level config.yaml: `refs/main` first, else the newest."""
    repo = (hf_hub_cache() if cache is None else cache) / _repo_folder(repo_id)
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    try:
        ref = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        ref = ""
    if ref and (snapshots / ref / "config.yaml").is_file():
        return snapshots / ref
    complete = [p for p in snapshots.iterdir() if (p / "config.yaml").is_file()]
    if not complete:
        return None
    return max(complete, key=lambda p: (p.stat().st_mtime, p.name))


# --------------------------------------------------------------------------------------------------- validation

def load_model_info(model_dir: str | os.PathLike[str]) -> ModelInfo:
    """Validate the checkpoint at `model_dir` and describe it. Reads configs and headers only (fast).

    Raises ModelNotFound if the directory does not exist, ModelFormatError (one line naming the file and what was
    expected) if anything in it is missing or does not fit the Spark-TTS layout.
    """
    root = Path(model_dir).expanduser()
    if not root.is_dir():
        raise ModelNotFound(f"{root}: no such directory; {HINT}")

    config_path = root / "config.yaml"
    config = _read_yaml(config_path, "the Spark-TTS top-level config")
    sample_rate = _positive_int_field(config, "sample_rate", config_path)

    llm_dir = root / "LLM"
    llm_config_path = llm_dir / "config.json"
    llm_config = _read_json(llm_config_path, "a Qwen2 model config")
    if LLM_ARCHITECTURE not in (llm_config.get("architectures") or []):
        raise ModelFormatError(f"{llm_config_path}: expected architectures [{LLM_ARCHITECTURE}], "
                               f"found {llm_config.get('architectures')!r}")
    vocab_size = _positive_int_field(llm_config, "vocab_size", llm_config_path)
    hidden_size = _positive_int_field(llm_config, "hidden_size", llm_config_path)

    llm_weights, embed_file, embed = read_llm_weights(llm_dir)
    if embed["shape"] != [vocab_size, hidden_size]:
        raise ModelFormatError(f"{embed_file}: expected {EMBED_KEY} of shape [{vocab_size}, {hidden_size}] "
                               f"(vocab_size, hidden_size from {llm_config_path}), found {embed['shape']}")

    token_ids, tokenizer_size = _read_tokenizer(llm_dir / "tokenizer.json")
    if tokenizer_size > vocab_size:
        raise ModelFormatError(f"{llm_dir / 'tokenizer.json'}: expected at most {vocab_size} ids (vocab_size in "
                               f"{llm_config_path}), found {tokenizer_size}")

    bicodec_dir = root / "BiCodec"
    bicodec_config_path = bicodec_dir / "config.yaml"
    bicodec_config = _read_yaml(bicodec_config_path, "the BiCodec config").get("audio_tokenizer")
    if not isinstance(bicodec_config, dict):
        raise ModelFormatError(f"{bicodec_config_path}: expected a top-level `audio_tokenizer:` mapping")
    bicodec_weights = bicodec_dir / "model.safetensors"
    if not bicodec_weights.is_file():
        raise ModelFormatError(f"{bicodec_weights}: missing (expected the BiCodec weights)")
    read_safetensors_header(bicodec_weights)

    wav2vec2 = root / WAV2VEC2_DIR
    return ModelInfo(
        root=root, llm_dir=llm_dir, bicodec_dir=bicodec_dir, wav2vec2_dir=wav2vec2 if wav2vec2.is_dir() else None,
        sample_rate=sample_rate, config=config, llm_config=llm_config, bicodec_config=bicodec_config,
        token_ids=token_ids, vocab_size=vocab_size, tokenizer_size=tokenizer_size, hidden_size=hidden_size,
        llm_weights=llm_weights, llm_dtype=embed["dtype"], bicodec_weights=bicodec_weights,
        checkpoint_hash=checkpoint_hash(root),
    )


def _positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_int_field(mapping: Mapping[str, Any], key: str, path: Path) -> int:
    """`mapping[key]`, a positive integer, else the ModelFormatError that names `path`."""
    value = mapping.get(key)
    if not _positive_int(value):
        raise ModelFormatError(f"{path}: expected a positive integer `{key}`, found {value!r}")
    return value


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    import yaml  # here, not above: a `say` through a warm server hashes the checkpoint but parses no YAML

    return _read_mapping(path, what, yaml.safe_load, yaml.YAMLError, "YAML mapping")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    return _read_mapping(path, what, json.load, json.JSONDecodeError, "JSON object")


def _read_mapping(path: Path, what: str, load: Any, parse_error: type[Exception], kind: str) -> dict[str, Any]:
    """A config file that must hold a mapping; every failure is one ModelFormatError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = load(f)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing (expected {what})") from None
    except RecursionError:  # the parsers recurse once a level: Python's own limit (about 1000) is the depth limit
        raise ModelFormatError(f"{path}: nested too deeply to be {what}") from None
    except (OSError, UnicodeDecodeError, parse_error) as err:
        raise ModelFormatError(f"{path}: cannot parse (expected {what} in {kind.split()[0]}): "
                               f"{_one_line(err)}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: expected a {kind} ({what}), found {type(data).__name__}")
    return data


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype/shape/data_offsets, plus `__metadata__`).

    Checks the framing (8-byte little-endian length, JSON object, offsets inside a file of exactly the right
    size, so truncated downloads are caught) and raises ModelFormatError naming the file otherwise.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n <= 1 or n > min(MAX_HEADER, size - 8):
                raise ModelFormatError(f"{path}: not a safetensors file (bad header length)")
            raw = f.read(n)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing (expected a safetensors weights file)") from None
    except OSError as err:
        raise ModelFormatError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ModelFormatError(f"{path}: not a safetensors file (header nested too deeply)") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelFormatError(f"{path}: not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path}: not a safetensors file (header is not a JSON object)")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
              and isinstance(entry.get("shape"), list) and all(_int_ge0(d) for d in entry["shape"])
              and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
              and all(_int_ge0(o) for o in entry["data_offsets"])
              and entry["data_offsets"][0] <= entry["data_offsets"][1])
        if not ok:
            raise ModelFormatError(f"{path}: not a safetensors file (bad header entry for {name!r})")
        end = max(end, entry["data_offsets"][1])
    if 8 + n + end != size:
        raise ModelFormatError(f"{path}: expected {8 + n + end} bytes as its header says, found {size} "
                               f"(truncated or corrupt download?)")
    return header


def _int_ge0(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_llm_weights(llm_dir: Path) -> tuple[tuple[Path, ...], Path, dict[str, Any]]:
    """(weight files, file holding the embedding, embedding header entry); single file or sharded index."""
    single = llm_dir / "model.safetensors"
    index_path = llm_dir / "model.safetensors.index.json"
    if single.is_file():
        header = read_safetensors_header(single)
        if not isinstance(header.get(EMBED_KEY), dict):
            raise ModelFormatError(f"{single}: expected a tensor named {EMBED_KEY}")
        return (single,), single, header[EMBED_KEY]
    if not index_path.is_file():
        raise ModelFormatError(f"{single}: missing (expected the LLM weights, or a sharded "
                               f"model.safetensors.index.json)")
    weight_map = _read_json(index_path, "a safetensors shard index").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelFormatError(f"{index_path}: expected a `weight_map` of tensor name -> shard file")
    if EMBED_KEY not in weight_map:
        raise ModelFormatError(f"{index_path}: expected {EMBED_KEY} in weight_map")
    shards = tuple(llm_dir / name for name in sorted(set(weight_map.values())))
    headers = {shard: read_safetensors_header(shard) for shard in shards}
    embed_file = llm_dir / weight_map[EMBED_KEY]
    embed = headers[embed_file].get(EMBED_KEY)
    if not isinstance(embed, dict):
        raise ModelFormatError(f"{embed_file}: expected a tensor named {EMBED_KEY} (as {index_path.name} says)")
    return shards, embed_file, embed


def _read_tokenizer(path: Path) -> tuple[TokenIds, int]:
    """Token ids from a fast-tokenizer JSON, and the number of ids it knows; checks Spark's id layout."""
    data = _read_json(path, "a Hugging Face fast tokenizer")
    added: dict[str, int] = {}
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and _int_ge0(entry.get("id")):
            added[entry["content"]] = entry["id"]
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    vocab = vocab if isinstance(vocab, dict) else {}

    def lookup(text: str) -> int | None:
        found = added.get(text, vocab.get(text))
        return found if _int_ge0(found) else None

    families = (("bicodec_global", GLOBAL_CODEBOOK), ("bicodec_semantic", SEMANTIC_CODEBOOK), *FAMILY_SIZES.items())
    for family in ("bicodec_semantic", "bicodec_global"):
        if lookup(tok(f"{family}_0")) is None:
            raise ModelFormatError(f"{path}: expected added token {tok(f'{family}_0')} (not a Spark-TTS tokenizer)")
    for family, count in families:
        base = lookup(tok(f"{family}_0"))
        if base is None:
            raise ModelFormatError(f"{path}: expected added token {tok(f'{family}_0')}")
        for i in range(1, count):
            found = lookup(tok(f"{family}_{i}"))
            if found != base + i:
                raise ModelFormatError(f"{path}: expected {tok(f'{family}_{i}')} at id {base + i} ({count} "
                                       f"consecutive {family} ids from {base}), found {found}")
    try:
        token_ids = TokenIds.from_lookup(lookup)
    except KeyError as err:
        raise ModelFormatError(f"{path}: expected added token {err.args[0]}") from None
    ids = [v for v in (*added.values(), *vocab.values()) if _int_ge0(v)]
    return token_ids, (max(ids) + 1 if ids else 0)


# --------------------------------------------------------------------------------------------------------- hash

def checkpoint_hash(model_dir: str | os.PathLike[str]) -> str:
    """A short stable hash of a checkpoint's contents (16 hex digits), for keying caches.

    Covers the top-level config.yaml and every non-hidden file under LLM/, BiCodec/ and wav2vec2-large-xlsr-53/:
    relative path, size and every byte, so two checkpoints that differ anywhere never share a cache; independent
    of where the directory lives or its timestamps. Each file is read once: its digest is kept in the user cache
    (`file_digest`), so later starts only stat the files.
    """
    root = Path(model_dir)
    files = [root / "config.yaml"] if (root / "config.yaml").is_file() else []
    for sub in ("LLM", "BiCodec", WAV2VEC2_DIR):
        if (root / sub).is_dir():
            files += [p for p in (root / sub).rglob("*")
                      if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    h = hashlib.sha256(b"voiceapp-checkpoint-v2\0")
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        h.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
        h.update(bytes.fromhex(cached_file_digest(path)))
    return h.hexdigest()[:16]


def _digest_key(path: Path) -> str:
    """What identifies one version of a file: its real path, size, inode, modification and change times (a
    rewrite that keeps the size and resets the modification time still moves the change time)."""
    st = path.stat()
    return f"{path.resolve()}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"


def _digests_file() -> Path:
    from engine.voices import user_cache_dir

    return user_cache_dir() / "file-digests.json"


def cached_file_digest(path: Path) -> str:
    """`file_digest(path)`, from the user cache while the file is unchanged (`_digest_key`): the file is read
    once per version. Also what checks the int8 LLM's file against the digest written with it."""
    key, store = _digest_key(path), _digests_file()
    known = dict(_known_digests(store))
    digest = known.get(key)
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    digest = file_digest(path)
    known[key] = digest
    try:  # another process may write it too: the last complete file wins, and a lost entry costs one read
        from engine.atomic import replacing

        store.parent.mkdir(parents=True, exist_ok=True)
        with replacing(store, suffix=f".{os.getpid()}.tmp") as tmp:
            tmp.write_text(json.dumps(dict(list(known.items())[-HASH_CACHE_ENTRIES:])), encoding="utf-8")
    except OSError:
        pass  # a read-only cache only costs reading the file again next time
    return digest


def _known_digests(store: Path) -> dict[str, str]:
    """The digests kept in `store`, read once per version of it (a checkpoint's files look it up one by one)."""
    try:
        st = store.stat()
    except OSError:
        return {}
    return _read_digests(store, st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=4)
def _read_digests(store: Path, mtime_ns: int, size: int, ino: int) -> dict[str, str]:
    """`store`'s digests (its version keys the cache); {} where it cannot be read or is not a JSON object."""
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return known if isinstance(known, dict) else {}


def file_digest(path: Path) -> str:
    """SHA-256 of every byte of the file, in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
