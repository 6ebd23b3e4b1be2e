"""A Llama (Orpheus's LLM) runs on the same static forward as Qwen2: no q/k/v biases, Llama 3's rotary scaling."""
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.backends.qwen2_checkpoint import Qwen2Config as StaticConfig, rope_inv_freq
from engine.backends.qwen2_static import StaticQwen2, supported

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
"""Llama 3.2's scaling with a small original context, so that the short test sequence spans all three bands."""


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True,
                         rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position_embeddings=4096,
                         initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def test_llama3_frequencies_match_transformers(llama) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    want, _ = ROPE_INIT_FUNCTIONS["llama3"](llama.config, "cpu")
    torch.testing.assert_close(rope_inv_freq(llama.config, 16), want.float())
    plain = rope_inv_freq(SimpleNamespace(rope_theta=500000.0, rope_scaling=None), 16)
    assert not torch.allclose(plain, want.float(), rtol=1e-3, atol=0)  # the scaling changes some frequencies


def test_static_llama_matches_transformers(llama) -> None:
    assert supported(llama.config)
    static = StaticQwen2(llama, 256, "cpu", torch.float32)
    seq = torch.randint(0, 512, (120,), generator=torch.Generator().manual_seed(1))
    n = 100
    with torch.inference_mode():
        ref = llama(seq[None]).logits[0]
        ours = [static.forward(seq[:n], torch.arange(n), 128) @ static.output.T]
        for i in range(n, len(seq)):
            ours.append(static.forward(seq[i:i + 1], torch.tensor([i]), 128) @ static.output.T)
    torch.testing.assert_close(torch.cat(ours), ref, atol=1e-4, rtol=1e-4)


def test_a_llama_config_reads_as_biasless() -> None:
    base = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
            "intermediate_size": 8, "vocab_size": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e4}
    assert not StaticConfig.from_dict({**base, "model_type": "llama"}).attention_bias
    assert StaticConfig.from_dict({**base, "model_type": "qwen2"}).attention_bias
