"""Which token generator the composition root builds on a GPU (devices faked: pure wiring): a front end with one
listener gets the graph lane in front of the torch generator and never starts vLLM; a crowd's front end gets vLLM
behind a lane too small for its crowd, or where the lane could not be built."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from engine import factory
from engine.families import family
from engine.families.spark import SPARK
from engine.backends import torch_gen
from engine.backends.graph_gen import LaneRouter
from engine.events import Notice
from engine.factory import EngineConfig


class FakeTorchGen:
    def __init__(self, *args, **kwargs) -> None:
        self.device = torch.device(kwargs.get("device") or "cuda")
        self.kwargs = kwargs


class FakeVllm:
    def __init__(self, *args, **kwargs) -> None:
        self.started = True


@pytest.fixture
def gpu(monkeypatch):
    """A GPU, vLLM installed, and lane builds counted (`lanes`: what each build returns, in turn)."""
    built = SimpleNamespace(lanes=[], calls=0, devices=[])

    def build_lane(info, events, device=None, rows=None):
        built.calls += 1
        built.devices.append(device)
        return built.lanes.pop(0)

    module = ModuleType("engine.backends.vllm_gen")
    module.VllmTokenGenerator = FakeVllm
    monkeypatch.setitem(sys.modules, "engine.backends.vllm_gen", module)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else find_spec(name, *a))
    monkeypatch.setattr(factory, "_cuda", lambda: True)
    monkeypatch.setattr(factory, "_build_lane", build_lane)
    monkeypatch.setattr(torch_gen, "TorchTokenGenerator", FakeTorchGen)
    return built


def _generator(config: EngineConfig):
    notices = []
    info = SimpleNamespace(llm_dir="llm", token_ids=None, checkpoint_hash="0123456789abcdef")
    gen = factory._build_generator(info, config, lambda e: notices.append(e))
    return gen, [n.message for n in notices if isinstance(n, Notice)]


def test_one_listener_gets_the_lane_before_the_torch_generator_and_no_vllm(gpu) -> None:
    lane = SimpleNamespace(rows=2)
    gpu.lanes = [lane]
    gen, notices = _generator(EngineConfig(one_listener=True))
    assert isinstance(gen, LaneRouter) and gen.lane is lane and isinstance(gen.primary, FakeTorchGen)
    assert gen.others_limit is None and gen.handoff_at is None and not gen.overflow  # never to the slower one
    assert gpu.calls == 1 and any("vLLM is not started" in n for n in notices)


def test_one_listener_without_a_lane_falls_back_to_vllm_without_building_the_lane_again(gpu) -> None:
    gpu.lanes = [None]
    gen, _ = _generator(EngineConfig(one_listener=True))
    assert isinstance(gen, FakeVllm) and gpu.calls == 1


@pytest.mark.parametrize("config", [EngineConfig(), EngineConfig(one_listener=True, backend="vllm")],
                         ids=["crowd", "vllm-asked-for"])
def test_otherwise_vllm_starts_behind_the_lane(gpu, config) -> None:
    lane = SimpleNamespace(rows=2)
    gpu.lanes = [lane]
    gen, _ = _generator(config)
    assert isinstance(gen, LaneRouter) and isinstance(gen.primary, FakeVllm) and gen.lane is lane


def test_a_crowd_lane_keeps_its_overflow_rather_than_time_slice_the_gpu_with_vllm(gpu) -> None:
    from engine.backends.graph_gen import CROWD_ROWS

    small, crowd = SimpleNamespace(rows=2), SimpleNamespace(rows=CROWD_ROWS)
    gpu.lanes = [small]
    gen, _ = _generator(EngineConfig())
    assert gen.overflow and gen.handoff_at is not None  # a small lane hands a crowd to vLLM
    gpu.lanes = [crowd]
    gen, notices = _generator(EngineConfig())  # backend auto: no vLLM behind a lane that holds the crowd
    assert isinstance(gen.primary, FakeTorchGen) and not gen.overflow and gen.handoff_at is None
    assert any("vLLM is not started" in n for n in notices)
    gpu.lanes = [crowd]
    gen, _ = _generator(EngineConfig(backend="vllm"))  # asked for: started, and the crowd still stays on the lane
    assert isinstance(gen.primary, FakeVllm) and not gen.overflow and gen.others_limit is None
    assert gen.handoff_at is None


def test_say_the_tui_and_their_servers_declare_one_listener_export_and_serve_do_not() -> None:
    import argparse

    from voiceapp.common import engine_config

    args = argparse.Namespace(model=None, backend="auto", compute="auto", threads=None)
    assert engine_config(args, one_listener=True).one_listener and not engine_config(args).one_listener
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "voiceapp" / "cli"
    assert "engine_config(args, one_listener=True)" in (root / "say.py").read_text()
    assert "engine_config(args, one_listener=True)" in (root / "tui.py").read_text()
    assert "one_listener" not in (root / "export.py").read_text()
    from voiceapp.cli import build_parser
    from voiceapp.cli.serve import first_config, serve_config, tunes

    # every server on backend auto answers first with the engine one listener gets; one started by hand then
    # tunes itself for a crowd in the background; on another backend it builds the crowd's engine before answering
    def parsed(*flags):
        return build_parser().parse_args(["serve", *flags])

    assert first_config(parsed()).one_listener and tunes(parsed()) and not serve_config(parsed()).one_listener
    assert serve_config(parsed()).lane_rows is None and serve_config(parsed()).decoder_autotune == "all"
    assert first_config(parsed("--auto-started")).one_listener and not tunes(parsed("--auto-started"))
    assert not tunes(parsed("--no-tune"))
    assert not first_config(parsed("--backend", "vllm")).one_listener and not tunes(parsed("--backend", "vllm"))


def test_compute_cpu_keeps_the_llm_off_the_gpu(gpu) -> None:
    gen, _ = _generator(EngineConfig(device="cpu", one_listener=True))
    assert isinstance(gen, FakeTorchGen) and gpu.calls == 0  # no lane, no vLLM on the GPU it was told not to use


def test_the_llm_on_the_cpu_is_int8_unless_told_otherwise_and_never_on_a_gpu(gpu, monkeypatch, tmp_path) -> None:
    from engine.errors import InputError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gen, _ = _generator(EngineConfig(device="cpu", backend="torch"))
    assert gen.kwargs["quantize"] == "int8"
    assert gen.kwargs["quantized_dir"] == tmp_path / "voiceapp/llm/0123456789abcdef"
    gen, _ = _generator(EngineConfig(device="cpu", backend="torch", quantize="none"))
    assert gen.kwargs["quantize"] == "none" and gen.kwargs["quantized_dir"] is None
    gen, _ = _generator(EngineConfig(device="cuda", backend="torch", graph_lane=False))
    assert gen.kwargs["quantize"] == "none"
    with pytest.raises(InputError, match="--quantize int8 is the LLM's CPU path"):
        _generator(EngineConfig(device="cuda", backend="torch", graph_lane=False, quantize="int8"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # ONNX Runtime not installed
    gen, _ = _generator(EngineConfig(device="cpu", backend="torch"))
    assert gen.kwargs["quantize"] == "none"


def test_quantize_flag() -> None:
    from voiceapp.cli import build_parser
    from voiceapp.common import engine_config

    def quantize(*argv: str) -> str:
        return engine_config(build_parser().parse_args(list(argv))).quantize

    assert quantize("say", "hi") == "auto" and quantize("say", "hi", "--quantize", "none") == "none"
    assert quantize("export", "in.txt", "-o", "o.wav", "--quantize", "int8") == "int8"
    assert quantize("say", "hi", "--quantize", "int4") == "int4"
    with pytest.raises(ValueError, match="unknown quantize"):
        EngineConfig(quantize="int2")


def test_no_warm_up_turns_the_warm_up_request_off_and_its_absence_leaves_it_to_the_decoder_device() -> None:
    import argparse

    from voiceapp.cli import build_parser
    from voiceapp.common import engine_config

    args = argparse.Namespace(model=None, backend="auto", compute="auto", threads=None)
    assert engine_config(args).warm_up is None and EngineConfig().warm_up is None
    parsed = build_parser().parse_args(["say", "hi", "--no-warm-up"])
    assert engine_config(parsed).warm_up is False


@pytest.mark.parametrize("one_listener", [True, False])
def test_one_listener_captures_decoder_graphs_for_two_windows_at_once_a_crowd_for_every_batch(
        monkeypatch, one_listener) -> None:
    """A listener's windows come from at most two sentences at once: its decoder captures batches 1 and 4 (two
    windows replay the batch-4 graph) for every window length; a crowd's engine captures every batch."""
    from engine.backends import bicodec
    from engine.batching import lengths_for

    captured = {}

    class FakeDecoder:
        def __init__(self, *args, **kwargs) -> None:
            self.device = kwargs["device"]

        def warmup(self, lengths, batches=(1, 4, 8, 16, 32, 64)):
            captured.update(lengths=tuple(lengths), batches=tuple(batches))
            return 0.1

        def decode(self, items):  # the fp16 probe (factory.full_precision_if_lost), before any capture
            captured.setdefault("probed", []).extend(len(item.codes) for item in items)
            return [[0.0] * len(item.codes) for item in items]

    monkeypatch.setattr(bicodec, "BiCodecDecoder", FakeDecoder)
    monkeypatch.setattr(factory, "_cuda", lambda: True)
    monkeypatch.setattr(factory, "probe_decoder", lambda decoder, item: 0.001)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    config = EngineConfig(one_listener=one_listener, schedule=SPARK.schedule)
    decoder = factory._build_decoder(SPARK, SimpleNamespace(bicodec_dir="unused"), config)  # noqa: SLF001
    assert decoder.device == "cuda" and captured["lengths"] == lengths_for(config.schedule)
    assert captured["batches"] == ((1, 4) if one_listener else (1, 4, 8, 16, 32, 64))
    assert captured["probed"] == [lengths_for(config.schedule)[-1]]  # Spark streams in fp16: probed once


def test_an_engine_on_a_named_gpu_puts_its_lane_and_llm_there_and_leaves_vllm_out(gpu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    gpu.lanes = [SimpleNamespace(rows=2) for _ in range(3)]
    gen, notices = _generator(EngineConfig(device="cuda:1", one_listener=True))
    assert gpu.devices == ["cuda:1"] and gen.primary.device == torch.device("cuda:1")
    gen, notices = _generator(EngineConfig(device="cuda:1"))  # a crowd's engine: vLLM would land on cuda:0
    assert list(map(str, gpu.devices)) == ["cuda:1", "cuda:1"] and isinstance(gen.primary, FakeTorchGen)
    assert gen.primary.device == torch.device("cuda:1")
    assert any("vLLM unavailable (vLLM runs on the process's current GPU, not cuda:1" in n for n in notices)
    gen, _ = _generator(EngineConfig(device="cuda:0"))  # the current GPU: vLLM as ever
    assert isinstance(gen.primary, FakeVllm)


def test_the_engines_gpu_comes_from_its_config() -> None:
    assert factory.gpu_device(EngineConfig()) == "cuda"
    assert factory.gpu_device(EngineConfig(device="cuda:1")) == "cuda:1"
    assert factory.gpu_device(EngineConfig(decoder_device="cuda:2")) == "cuda:2"
    with pytest.raises(ValueError, match="unknown device 'gpu:1'"):
        EngineConfig(device="gpu:1")
    with pytest.raises(ValueError, match="unknown decoder_device 'mps'"):
        EngineConfig(decoder_device="mps")


def test_compute_takes_a_gpu_index_and_refuses_anything_else(capsys) -> None:
    from voiceapp.cli import build_parser
    from voiceapp.common import engine_config

    args = build_parser().parse_args(["serve", "--compute", "cuda:1"])
    config = engine_config(args)
    assert config.device == "cuda:1" and config.decoder_device == "cuda:1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--compute", "cuda:x"])
    assert "--compute: invalid" in capsys.readouterr().err


def test_export_lanes_the_gpu_cannot_hold_are_one_line_naming_what_to_free(monkeypatch) -> None:
    """The fixed lanes' rows follow the card's total memory (a sentence's bytes must not depend on what else runs):
    where another process holds the memory (a server of the same 3B model), the export ends with one line that says
    what to do, not CUDA's traceback."""
    import torch
    from transformers import LlamaConfig

    from engine.backends import graph_gen, qwen2_checkpoint
    from engine.errors import GenerationError

    gib = 1 << 30
    model = SimpleNamespace(config=LlamaConfig(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,
                                               num_hidden_layers=28))
    monkeypatch.setattr(factory, "_lane_runs_on", lambda gpu, events, then="": True)
    monkeypatch.setattr(qwen2_checkpoint.Qwen2Weights, "from_checkpoint", staticmethod(lambda path: model))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda gpu: SimpleNamespace(total_memory=140 * gib))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda gpu: (7 * gib, 140 * gib))

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 13.95 GiB.")

    monkeypatch.setattr(graph_gen, "GraphLane", no_room)
    info = SimpleNamespace(family="orpheus", llm_dir="unused", token_ids=SimpleNamespace(audio_ids=()))
    with pytest.raises(GenerationError) as err:
        factory._build_fixed_lanes(info, family("orpheus").lane, lambda event: None, "cuda:0")
    line = str(err.value)
    assert "\n" not in line and "56.0 GiB of KV cache; 7.0 of 140.0 GiB free" in line and "--compute cpu" in line
