"""Which running server may stand in for the engine a client asks for (issue 41): the checkpoint is decided by its
hash and the backend, never by a path; the fake engine stands in only for a client asking for it."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.pacing import Pacer
from engine.engine_api import describe_engine
from engine.protocol import project_version
from tests.cli_helpers import one_line_error, voicectl
from voiceapp.server.rendezvous import server_mismatch, wanted_checkpoint


@pytest.fixture
def checkpoint(tiny_model, tmp_path, monkeypatch):
    """A private copy of the tiny checkpoint (it is changed in place below), and no $VOICEAPP_MODEL."""
    monkeypatch.delenv("VOICEAPP_MODEL", raising=False)
    wanted_checkpoint.cache_clear()  # each `say` is a process of its own: nothing is remembered between them
    copy = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_model, copy)
    yield copy
    wanted_checkpoint.cache_clear()


def hello(path, digest, backend="torch"):
    return {"type": "hello", "version": project_version(), "backend": backend,
            "model": {"path": str(path), "hash": digest}}


def test_a_server_stands_in_only_for_a_checkpoint_of_its_hash(checkpoint):
    digest = wanted_checkpoint(str(checkpoint), None)[1]
    assert server_mismatch(hello(checkpoint, digest), "auto", str(checkpoint)) is None
    assert server_mismatch(hello(checkpoint, digest), "torch", str(checkpoint)) is None
    why = server_mismatch(hello(checkpoint, "0123456789abcdef"), "auto", str(checkpoint))
    assert why == f"serves {checkpoint} (checkpoint 0123456789abcdef), not {checkpoint} (checkpoint {digest})"
    assert "uses the torch backend, not vllm" in server_mismatch(hello(checkpoint, digest), "vllm", str(checkpoint))


def test_a_checkpoint_replaced_in_place_is_another_checkpoint(checkpoint):
    served = hello(checkpoint, wanted_checkpoint(str(checkpoint), None)[1])  # what the server hashed as it started
    weights = checkpoint / "BiCodec" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same path, same size: another checkpoint
    weights.write_bytes(bytes(data))
    wanted_checkpoint.cache_clear()  # a new `say`
    assert server_mismatch(served, "auto", str(checkpoint)) is not None


def test_a_relative_model_path_is_the_clients_folder_and_only_the_hash_decides(checkpoint, tmp_path, monkeypatch):
    digest = wanted_checkpoint(str(checkpoint), None)[1]
    other = tmp_path / "elsewhere" / "tiny"  # a folder of the same relative name holding another checkpoint
    shutil.copytree(checkpoint, other)
    (other / "config.yaml").write_text((other / "config.yaml").read_text() + "\n# changed\n")
    wanted_checkpoint.cache_clear()
    monkeypatch.chdir(other.parent)
    # a server reporting the relative name it was started with, from another folder, is not ours ...
    assert server_mismatch(hello("tiny", digest), "auto", "tiny") is not None
    assert wanted_checkpoint("tiny", None)[0] == str(other.resolve())
    monkeypatch.chdir(checkpoint.parent)
    wanted_checkpoint.cache_clear()
    assert server_mismatch(hello("tiny", digest), "auto", "tiny") is None  # ... but is from its own
    monkeypatch.setenv("VOICEAPP_MODEL", "tiny")
    assert server_mismatch(hello(checkpoint, digest), "auto", None) is None


def test_the_server_says_its_checkpoints_absolute_path(checkpoint, monkeypatch):
    monkeypatch.chdir(checkpoint.parent)
    synth = SimpleNamespace(generator=object(), pacer=Pacer(), grammar=SimpleNamespace(family="spark"),
                            model_info=SimpleNamespace(root="tiny", checkpoint_hash="x"))
    assert describe_engine(synth)["model"]["path"] == str(checkpoint.resolve())


def test_a_fake_server_stands_in_only_for_the_fake_backend(fake_server, sock_path, tmp_path):
    fake = {"type": "hello", "version": project_version(), "backend": "fake", "model": None}
    assert server_mismatch(fake, "fake", None) is None
    assert server_mismatch(fake, "auto", None) == "is the fake engine (it stands in only for --backend fake)"
    # a plain `say` with no checkpoint here: not the fake server's tone, but in-process, which names what is missing
    env = {"VOICEAPP_SOCKET": sock_path, "HF_HOME": str(tmp_path / "hf"), "VOICEAPP_MODEL": ""}
    proc = voicectl("say", "Hello.", "--out", str(tmp_path / "a.wav"), "--json", env=env)
    notice, _, error = proc.stderr.decode().partition("\n")
    assert notice == ("voicectl: the running server is the fake engine (it stands in only for --backend fake); "
                      "speaking in-process")
    assert "no Spark-TTS model found" in one_line_error(proc.__class__(proc.args, proc.returncode, b"", error.encode()))
    assert not (tmp_path / "a.wav").exists()
    fake_ok = voicectl("say", "Hello.", "--out", str(tmp_path / "b.wav"), "--json", "--backend", "fake", env=env)
    assert fake_ok.returncode == 0 and json.loads(fake_ok.stdout)["server_pid"] is not None, fake_ok.stderr


@pytest.mark.parametrize("name", ["spark", "orpheus"])
def test_the_hash_a_client_compares_is_the_one_its_family_reports(name, tmp_path, monkeypatch):
    from engine.families import detect, family

    wanted_checkpoint.cache_clear()
    root = family(name).write_synthetic(tmp_path / name)
    assert wanted_checkpoint(str(root), None)[1] == detect(root).read(root).checkpoint_hash
    wanted_checkpoint.cache_clear()


def test_a_model_folder_that_is_not_there_is_the_loaders_one_line_not_a_notice(checkpoint, tmp_path):
    from engine.errors import ModelNotFound

    digest = wanted_checkpoint(str(checkpoint), None)[1]
    with pytest.raises(ModelNotFound, match="no such directory"):
        server_mismatch(hello(checkpoint, digest), "auto", str(tmp_path / "gone"))


def test_the_version_read_line_by_line_is_tomllibs():
    """project_version reads the checkout's pyproject.toml without tomllib (every client compares versions before
    it sends): what it finds is what tomllib finds, and a file it cannot read so says None (the metadata answers)."""
    try:
        import tomllib  # type: ignore[import-not-found]  # Python 3.11+
    except ImportError:  # Python 3.10: the same parser, published as tomli (a dependency there)
        import tomli as tomllib

    from engine.protocol import pyproject_version

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert pyproject_version(text) == tomllib.loads(text)["project"]["version"] == project_version()
    assert pyproject_version('[project]\nname = "other"\nversion = "1.0"\n') is None
    assert pyproject_version('[tool.x]\nname = "voiceapp"\nversion = "9"\n') is None
