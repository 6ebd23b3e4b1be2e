"""Start-up is part of the product: a fresh engine pays only for what it needs before its first audio. Importing
transformers was the largest single cost of a fresh `say`, and torch's compiler (pulled in by a random init on the
meta device) the next; the engine needs neither to load a checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from engine.factory import EngineConfig, build_synthesizer
build_synthesizer(EngineConfig(model=sys.argv[1], backend="torch", threads=2, cache_dir=sys.argv[2]))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "vllm")
                        or m.startswith(("torch._dynamo", "torch._inductor")))))
"""


def test_building_an_engine_imports_neither_transformers_nor_vllm_nor_the_compiler(tiny_model, tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tiny_model), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_tokenizer_read_without_transformers_gives_transformers_ids(tiny_model) -> None:
    from transformers import AutoTokenizer

    from engine.factory import _load_encoder
    from engine.model import load_model_info

    info = load_model_info(tiny_model)
    ours, theirs = _load_encoder(info), AutoTokenizer.from_pretrained(str(info.llm_dir))
    texts = ["Hello there.", "  two  spaces", "Ünïcödé — “quotes” 你好 🙂", "<|endoftext|> in the text", "3/4/2025",
             "a\nb\tc", ""]
    assert [ours(t) for t in texts] == [theirs.encode(t, add_special_tokens=False) for t in texts]


def test_compile_caches_persist_in_the_user_cache_unless_the_user_chose(monkeypatch, tmp_path) -> None:
    from engine.factory import COMPILE_CACHES, keep_compile_caches

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env: dict[str, str] = {}
    keep_compile_caches(env)
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "voiceapp" / "compile" / "inductor")}
    mine = {name: "/mine" for name in COMPILE_CACHES}
    keep_compile_caches(mine)
    assert mine == {name: "/mine" for name in COMPILE_CACHES}


WITHOUT_TRANSFORMERS = """
import asyncio, sys
sys.modules["transformers"] = None  # importing it fails, as in the user install on a CPU (it is an extra there)
from engine.config import SamplingOptions, SynthesisRequest
from engine.factory import EngineConfig, build_synthesizer

async def main():
    synth = build_synthesizer(EngineConfig(model=sys.argv[1], backend="torch", threads=2, cache_dir=sys.argv[2]))
    samples = 0
    async for chunk in synth.synthesize(SynthesisRequest("Hello there.", options=SamplingOptions(seed=1))):
        samples += len(chunk.samples)
    await synth.close()
    print(samples)

asyncio.run(main())
"""


@pytest.mark.parametrize("checkpoint", ["tiny_model", "orpheus_tiny"])
def test_a_cpu_engine_speaks_without_transformers(checkpoint, request, tmp_path) -> None:
    """transformers is an extra (pyproject.toml): the CPU path of either family, from the checkpoint to audio, never
    imports it."""
    model = request.getfixturevalue(checkpoint)
    out = subprocess.run([sys.executable, "-c", WITHOUT_TRANSFORMERS, str(model), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip().splitlines()[-1]) > 0


def test_what_needs_transformers_says_which_extra_adds_it(tiny_model, tmp_path, monkeypatch) -> None:
    """A checkpoint without tokenizer.json, and transformers' own forward (here on the meta device: anything but
    the CPU), need the extra: one line that names it, where transformers is not installed."""
    import shutil

    from engine.backends.torch_gen import TorchTokenGenerator
    from engine.errors import MissingExtra
    from engine.factory import _load_encoder
    from engine.model import load_model_info
    from engine.tokens import TokenIds

    info = load_model_info(tiny_model)
    monkeypatch.setitem(sys.modules, "transformers", None)
    copy = tmp_path / "llm"
    shutil.copytree(info.llm_dir, copy)
    (copy / "tokenizer.json").unlink()
    for attempt in (lambda: _load_encoder(type("Info", (), {"llm_dir": copy})()),
                    lambda: TorchTokenGenerator(info.llm_dir, TokenIds(), device="meta")):
        with pytest.raises(MissingExtra) as caught:
            attempt()
        message = str(caught.value)
        assert "pip install 'voiceapp[transformers]'" in message and "\n" not in message, message
