"""Model discovery and validation: resolve order, one-line errors naming the file, stable hash, offline download."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import ModelFormatError, ModelNotFound
from engine.model import (
    DEFAULT_REPO, ModelInfo, checkpoint_hash, load_model_info, read_safetensors_header, resolve_model_dir,
)
from engine.tokens import TokenIds

REPO_ROOT = Path(__file__).resolve().parents[2]
TOP_CONFIG = "sample_rate: 16000\nlatent_hop_length: 320\nref_segment_duration: 6\nvolume_normalize: true\n"


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A minimal valid F32 safetensors file of zeros (written by hand: the loader must not need the library)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + bytes(offset))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A valid tiny checkpoint: the synthetic LLM plus a stand-in BiCodec (independent of the BiCodec writer)."""
    pytest.importorskip("torch")
    from engine.synthetic.llm import write_llm

    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    root.mkdir()
    (root / "config.yaml").write_text(TOP_CONFIG)
    write_llm(root, "tiny", seed=0)
    (root / "BiCodec").mkdir()
    (root / "BiCodec" / "config.yaml").write_text("audio_tokenizer:\n  mel_params: {sample_rate: 16000}\n")
    write_safetensors(root / "BiCodec" / "model.safetensors", {"quantizer.codebook.weight": [8192, 8]})
    return root


@pytest.fixture
def ckpt(pristine, tmp_path) -> Path:
    """A private copy (hard links: replace files with `put`, never edit them in place)."""
    dst = tmp_path / "ckpt"
    shutil.copytree(pristine, dst, copy_function=os.link)
    return dst


def put(path: Path, data: str | bytes) -> None:
    """Replace a (possibly hard-linked) file without touching the original."""
    if path.exists():
        path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    put(path, json.dumps(data))


# ---------------------------------------------------------------------------------------------------- valid

def test_valid_checkpoint(ckpt):
    info = load_model_info(ckpt)
    assert isinstance(info, ModelInfo)
    assert info.token_ids == TokenIds()  # the synthetic tokenizer has the release's ids
    assert (info.sample_rate, info.vocab_size, info.tokenizer_size, info.hidden_size) == (16000, 166000, 165158, 64)
    assert info.llm_dtype == "F32" and info.llm_weights == (ckpt / "LLM" / "model.safetensors",)
    assert info.llm_dir == ckpt / "LLM" and info.bicodec_weights == ckpt / "BiCodec" / "model.safetensors"
    assert info.wav2vec2_dir is None and info.bicodec_config["mel_params"]["sample_rate"] == 16000
    assert len(info.checkpoint_hash) == 16 and info.checkpoint_hash == checkpoint_hash(ckpt)


def test_sharded_llm_weights(ckpt):
    llm = ckpt / "LLM"
    shard = "model-00001-of-00001.safetensors"
    (llm / "model.safetensors").rename(llm / shard)
    names = read_safetensors_header(llm / shard).keys() - {"__metadata__"}
    put(llm / "model.safetensors.index.json", json.dumps({"weight_map": {n: shard for n in names}}))
    assert load_model_info(ckpt).llm_weights == (llm / shard,)


def test_checkpoint_hash_is_stable_and_content_keyed(ckpt, pristine, tmp_path):
    base = checkpoint_hash(pristine)
    assert checkpoint_hash(ckpt) == base  # same contents elsewhere
    put(ckpt / "LLM" / ".cache-note", "ignored")  # hidden files and README do not count
    put(ckpt / "README.md", "ignored")
    assert checkpoint_hash(ckpt) == base
    edit_json(ckpt / "LLM" / "config.json", lambda c: c.update(rope_theta=10000.0))
    assert checkpoint_hash(ckpt) != base


def test_model_module_is_pure():
    code = ("import sys, engine.model; heavy = {'torch', 'transformers', 'safetensors', 'huggingface_hub'}; "
            "sys.exit(sorted(heavy & set(sys.modules)) or 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------------- invalid

def _drop_spark_tokens(ckpt: Path) -> None:
    edit_json(ckpt / "LLM" / "tokenizer.json",
              lambda t: t.update(added_tokens=[a for a in t["added_tokens"] if a["id"] < 151665]))


def _swap_semantic(ckpt: Path) -> None:
    def swap(t):
        by_name = {a["content"]: a for a in t["added_tokens"]}
        a, b = by_name["<|bicodec_semantic_10|>"], by_name["<|bicodec_semantic_11|>"]
        a["id"], b["id"] = b["id"], a["id"]
    edit_json(ckpt / "LLM" / "tokenizer.json", swap)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    put(path, data[:-4])


DEEP = 50_000
"""Nesting that no parser of ours survives on Python's stack: a RecursionError traceback until it was caught."""


def _deep_header(path: Path) -> None:
    blob = ("[" * DEEP + "]" * DEEP).encode()
    put(path, len(blob).to_bytes(8, "little") + blob)


BREAKAGES = {
    "top config nested 50,000 deep": (lambda c: put(c / "config.yaml", "a: " + "[" * DEEP + "]" * DEEP),
                                      "config.yaml", "nested too deeply"),
    "LLM config nested 50,000 deep": (lambda c: put(c / "LLM" / "config.json", "[" * DEEP + "]" * DEEP),
                                      "LLM/config.json", "nested too deeply"),
    "tokenizer nested 50,000 deep": (lambda c: put(c / "LLM" / "tokenizer.json", '{"a": ' + "[" * DEEP + "]" * DEEP
                                                   + "}"), "LLM/tokenizer.json", "nested too deeply"),
    "BiCodec config nested 50,000 deep": (lambda c: put(c / "BiCodec" / "config.yaml", "{" * DEEP + "}" * DEEP),
                                          "BiCodec/config.yaml", "nested too deeply"),
    "LLM header nested 50,000 deep": (lambda c: _deep_header(c / "LLM" / "model.safetensors"),
                                      "LLM/model.safetensors", "nested too deeply"),
    "missing top config": (lambda c: (c / "config.yaml").unlink(), "config.yaml", "missing"),
    "no sample_rate": (lambda c: put(c / "config.yaml", "volume_normalize: true\n"), "config.yaml", "sample_rate"),
    "missing LLM config": (lambda c: (c / "LLM" / "config.json").unlink(), "LLM/config.json", "missing"),
    "LLM config not JSON": (lambda c: put(c / "LLM" / "config.json", "{nope"), "LLM/config.json", "JSON"),
    "wrong architecture": (lambda c: edit_json(c / "LLM" / "config.json",
                                               lambda d: d.update(architectures=["LlamaForCausalLM"])),
                           "LLM/config.json", "Qwen2ForCausalLM"),
    "foreign tokenizer": (_drop_spark_tokens, "LLM/tokenizer.json", "<|bicodec_semantic_0|>"),
    "semantic ids not contiguous": (_swap_semantic, "LLM/tokenizer.json", "<|bicodec_semantic_10|>"),
    "missing tokenizer": (lambda c: (c / "LLM" / "tokenizer.json").unlink(), "LLM/tokenizer.json", "missing"),
    "embed shape mismatch": (lambda c: edit_json(c / "LLM" / "config.json", lambda d: d.update(vocab_size=151936)),
                             "LLM/model.safetensors", "[151936, 64]"),
    "missing LLM weights": (lambda c: (c / "LLM" / "model.safetensors").unlink(), "LLM/model.safetensors",
                            "missing"),
    "garbage LLM header": (lambda c: put(c / "LLM" / "model.safetensors", b"\xff" * 64 + b"garbage"),
                           "LLM/model.safetensors", "not a safetensors file"),
    "header not JSON": (lambda c: put(c / "LLM" / "model.safetensors", (16).to_bytes(8, "little") + b"x" * 32),
                        "LLM/model.safetensors", "not JSON"),
    "truncated LLM weights": (lambda c: _truncate(c / "LLM" / "model.safetensors"), "LLM/model.safetensors",
                              "truncated"),
    "tokenizer bigger than embedding": (lambda c: edit_json(c / "LLM" / "tokenizer.json", lambda t: t[
        "added_tokens"].append({"id": 166000, "content": "<|extra|>"})), "LLM/tokenizer.json", "at most 166000"),
    "missing BiCodec config": (lambda c: (c / "BiCodec" / "config.yaml").unlink(), "BiCodec/config.yaml",
                               "missing"),
    "BiCodec config without audio_tokenizer": (lambda c: put(c / "BiCodec" / "config.yaml", "encoder: {}\n"),
                                               "BiCodec/config.yaml", "audio_tokenizer"),
    "missing BiCodec weights": (lambda c: (c / "BiCodec" / "model.safetensors").unlink(),
                                "BiCodec/model.safetensors", "missing"),
    "garbage BiCodec weights": (lambda c: put(c / "BiCodec" / "model.safetensors", b"\x00" * 3),
                                "BiCodec/model.safetensors", "not a safetensors file"),
}


@pytest.mark.parametrize("case", list(BREAKAGES))
def test_broken_checkpoint_names_the_file(ckpt, case):
    breakage, file, expected = BREAKAGES[case]
    breakage(ckpt)
    with pytest.raises(ModelFormatError) as exc:
        load_model_info(ckpt)
    message = str(exc.value)
    assert "\n" not in message
    assert str(ckpt / file) in message and expected in message, message


# ---------------------------------------------------------------------------------------------------- resolve

def fake_hf_cache(cache: Path, snapshots: dict[str, bool], ref: str | None = None) -> Path:
    """A hub cache holding the default repo; snapshots: name -> complete (has config.yaml)."""
    repo = cache / ("models--" + DEFAULT_REPO.replace("/", "--"))
    for name, complete in snapshots.items():
        (repo / "snapshots" / name / "LLM").mkdir(parents=True)
        if complete:
            (repo / "snapshots" / name / "config.yaml").write_text(TOP_CONFIG)
    if ref is not None:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(ref)
    return repo / "snapshots"


def test_resolve_order(tmp_path, monkeypatch):
    arg_dir, env_dir, cache = tmp_path / "arg", tmp_path / "env", tmp_path / "hub"
    arg_dir.mkdir()
    env_dir.mkdir()
    snaps = fake_hf_cache(cache, {"abc123": True})
    for var in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("VOICEAPP_MODEL", str(env_dir))
    assert resolve_model_dir(str(arg_dir)) == arg_dir
    assert resolve_model_dir(None) == env_dir
    monkeypatch.delenv("VOICEAPP_MODEL")
    assert resolve_model_dir(None) == snaps / "abc123"
    shutil.rmtree(cache)
    with pytest.raises(ModelNotFound) as exc:
        resolve_model_dir(None)
    message = str(exc.value)
    assert "voicectl model download" in message and "--model DIR" in message and "VOICEAPP_MODEL" in message
    assert "voicectl model synth --size tiny DIR" in message and "\n" not in message


def test_hf_cache_prefers_refs_main_then_newest(tmp_path):
    cache = tmp_path / "hub"
    snaps = fake_hf_cache(cache, {"old": True, "new": True, "partial": False}, ref="old")
    env = {"HF_HUB_CACHE": str(cache)}
    assert resolve_model_dir(None, env) == snaps / "old"
    (cache / ("models--" + DEFAULT_REPO.replace("/", "--")) / "refs" / "main").write_text("gone")
    os.utime(snaps / "old", (1, 1))
    assert resolve_model_dir(None, env) == snaps / "new"


def test_hf_home_and_xdg_layouts(tmp_path):
    snaps = fake_hf_cache(tmp_path / "home" / "hub", {"s1": True})
    assert resolve_model_dir(None, {"HF_HOME": str(tmp_path / "home")}) == snaps / "s1"
    snaps = fake_hf_cache(tmp_path / "xdg" / "huggingface" / "hub", {"s2": True})
    assert resolve_model_dir(None, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == snaps / "s2"


def test_incomplete_cache_download_says_so(tmp_path):
    fake_hf_cache(tmp_path / "hub", {"partial": False})
    with pytest.raises(ModelNotFound, match="incomplete.*voicectl model download"):
        resolve_model_dir(None, {"HF_HUB_CACHE": str(tmp_path / "hub")})


def test_explicit_dir_must_exist(tmp_path):
    with pytest.raises(ModelNotFound, match="--model .*no such directory.*voicectl model download"):
        resolve_model_dir(str(tmp_path / "nope"), {})
    with pytest.raises(ModelNotFound, match="VOICEAPP_MODEL=.*no such directory"):
        resolve_model_dir(None, {"VOICEAPP_MODEL": str(tmp_path / "nope")})
    with pytest.raises(ModelNotFound):
        load_model_info(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------------- download

@pytest.mark.parametrize("offline", [False, True])
def test_download_failure_is_one_line_model_not_found(monkeypatch, offline):
    hub = pytest.importorskip("huggingface_hub")
    from engine.download import download_model

    def fail(*args, **kwargs):
        raise hub.errors.LocalEntryNotFoundError("Got: ConnectError\nAn error happened while trying to locate ...")

    monkeypatch.setattr(hub, "snapshot_download", fail)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    with pytest.raises(ModelNotFound) as exc:
        download_model()
    message = str(exc.value)
    assert "\n" not in message and "--model DIR" in message and DEFAULT_REPO in message
    assert ("offline" in message) == offline


def test_synthetic_checkpoint_is_valid(tiny_model):
    pytest.importorskip("engine.synthetic.bicodec")
    info = load_model_info(tiny_model)
    assert info.token_ids == TokenIds() and info.sample_rate == 16000
    assert info.bicodec_config["mel_params"]["hop_length"] == 320


def test_checkpoint_hash_covers_every_byte_and_is_computed_once(tmp_path, monkeypatch):
    """Two checkpoints that differ only in the middle of a weight file must not share caches (the hash read 1 MiB
    at each end of a weight file); each file is read once, then its digest is kept under the user cache, keyed by
    its path, size, times and inode."""
    import engine.model as model

    root = tmp_path / "ckpt"
    for sub in ("LLM", "BiCodec"):
        (root / sub).mkdir(parents=True)
    put(root / "config.yaml", TOP_CONFIG)
    weights = root / "LLM" / "model.safetensors"
    blob = bytearray(os.urandom(5 * 1024 * 1024))
    weights.write_bytes(bytes(blob))
    put(root / "BiCodec" / "config.yaml", "x: 1\n")
    read = []
    real = model.file_digest
    monkeypatch.setattr(model, "file_digest", lambda path: read.append(path.name) or real(path))
    first = checkpoint_hash(root)
    assert sorted(read) == ["config.yaml", "config.yaml", "model.safetensors"]
    read.clear()
    assert checkpoint_hash(root) == first and read == []  # the second time from the cache: nothing read

    before = weights.stat()
    blob[len(blob) // 2] ^= 0xFF  # one byte in the middle, same size and modification time
    weights.write_bytes(bytes(blob))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert checkpoint_hash(root) != first and read == ["model.safetensors"]
