"""Fixtures for the GPU tests (`-m gpu`): they skip cleanly without CUDA or vLLM (CI has neither).

The checkpoint is $VOICEAPP_GPU_MODEL if set (lab/gpu_bench.sh writes a synthetic `full` one there), else a
synthetic `full` checkpoint written once per session into a temporary folder (2.7 GB, ~15 s): vLLM's attention
kernels need the real head size, so the `tiny` checkpoint cannot stand in here.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def cuda():
    if not _cuda():
        pytest.skip("no CUDA GPU")


@pytest.fixture(scope="session")
def gpu_model(cuda, tmp_path_factory) -> Path:
    env = os.environ.get("VOICEAPP_GPU_MODEL")
    if env and Path(env, "config.yaml").is_file():
        return Path(env)
    from engine.synthetic import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("gpu-model") / "full", size="full", seed=0)


@pytest.fixture(scope="session")
def gpu_info(gpu_model):
    from engine.model import load_model_info

    return load_model_info(gpu_model)


@pytest.fixture(scope="session")
def vllm_gen(gpu_info):
    pytest.importorskip("vllm")
    from engine.backends.vllm_gen import VllmTokenGenerator

    notices = []
    gen = VllmTokenGenerator(gpu_info, events=notices.append, warmup_batches=(1, 8, 32))
    gen.test_notices = notices
    yield gen
    gen.close_now()
