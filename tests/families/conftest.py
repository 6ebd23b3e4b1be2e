"""Fixtures for the model-family tests: the tiny Orpheus checkpoint's SNAC (the checkpoint itself, `orpheus_tiny`,
is tests/conftest.py's)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def snac_tiny(orpheus_tiny) -> Path:
    return orpheus_tiny / "snac"


@pytest.fixture(scope="session")
def snac_decoder(snac_tiny):
    """Our SnacDecoder on the tiny SNAC (fp32, CPU, seed 0, noise on)."""
    from engine.families.orpheus.snac import SnacDecoder

    return SnacDecoder(snac_tiny)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny decodes are faster on one thread than on two contended ones (the CI box has 2 shared cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
