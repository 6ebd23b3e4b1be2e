"""The int8 LLM's first ONNX graph (format 1), kept for comparison in lab/cpu_int8_probe.py (option ort-int8-unfused).

Standard ONNX operators around the same `MatMulNBits` projections as engine.backends.qwen2_ort: rotary embedding
as Split/Concat/Mul/Add, grouped-query attention as Reshape/Transpose/MatMul/Softmax over a causal bias input,
residual Adds and separate RMSNorms, about thirty-five nodes a layer. Its cache is [layers, positions, kv heads, D];
each layer's past goes in as a view, past and new keys are concatenated (and transposed) inside the graph every
step, and the new ones come back as outputs that are copied into the cache after the run. The engine's graph does
the same maths with ONNX Runtime's fused operators and writes the cache in place.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.backends import qwen2_ort
from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.backends.qwen2_static import _check_supported


def build_unfused_model(weights: Qwen2Weights, quantize: str = "int8", block: int = qwen2_ort.BLOCK,
                        builder: qwen2_ort.GraphBuilder | None = None):
    """The step graph (an onnx ModelProto) of `weights`' decoder layers and final norm.

    Inputs: x [T, H] (embedded ids), cos and sin [T, D] (StaticQwen2's tables at the T positions), bias [G*T, S]
    (0 / -inf: which of the S = P + T keys each query sees, rows g-major) and, per layer l, past_k.l / past_v.l
    [P, kv, D]. Outputs: hidden [T, H] (after the final norm) and present_k / present_v [L, T, kv, D]."""
    from onnx import TensorProto, helper

    cfg = weights.config
    _check_supported(cfg)
    g = builder or qwen2_ort.GraphBuilder(quantize, block)
    heads, kvh, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    d = getattr(cfg, "head_dim", None) or hidden // heads
    group, layers = heads // kvh, cfg.num_hidden_layers
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", hidden]),
              helper.make_tensor_value_info("cos", TensorProto.FLOAT, ["T", d]),
              helper.make_tensor_value_info("sin", TensorProto.FLOAT, ["T", d]),
              helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["GT", "S"])]
    cos, sin = g.op("Unsqueeze", "cos", g.ints(1)), g.op("Unsqueeze", "sin", g.ints(1))  # [T, 1, D]
    halves = g.ints(d // 2, d // 2)

    def norm(x: str, weight: str) -> str:
        return g.op("SimplifiedLayerNormalization", x, weight, axis=-1, epsilon=cfg.rms_norm_eps,
                    stash_type=1)

    def rope(t: str, count: int) -> str:  # t [T, count * D] -> rotated [T, count, D]
        t = g.op("Reshape", t, g.ints(-1, count, d))
        low, high = g.op("Split", t, halves, axis=-1, outputs=2)
        rolled = g.op("Concat", high, low, axis=-1)  # rotate_half(x) * sin == roll(x, D/2) * [-sin, sin]
        return g.op("Add", g.op("Mul", t, cos), g.op("Mul", rolled, sin))

    x, present_k, present_v = "x", [], []
    for i in range(layers):
        name = f"model.layers.{i}."

        def w(suffix: str) -> torch.Tensor:
            return weights.tensor(name + suffix).detach().float()

        qkv_w = torch.cat([w(f"self_attn.{p}_proj.weight") for p in "qkv"])
        qkv_b = torch.cat([w(f"self_attn.{p}_proj.bias") for p in "qkv"])
        h = norm(x, g.const(f"{name}ln1", w("input_layernorm.weight")))
        qkv = g.op("Add", g.linear(h, qkv_w, f"{name}qkv"), g.const(f"{name}qkv.bias", qkv_b))
        q, k, v = g.op("Split", qkv, g.ints(heads * d, kvh * d, kvh * d), axis=-1, outputs=3)
        q, k = rope(q, heads), rope(k, kvh)
        v = g.op("Reshape", v, g.ints(-1, kvh, d))
        present_k.append(g.op("Unsqueeze", k, g.ints(0)))
        present_v.append(g.op("Unsqueeze", v, g.ints(0)))
        for past in (f"past_k.{i}", f"past_v.{i}"):
            inputs.append(helper.make_tensor_value_info(past, TensorProto.FLOAT, ["P", kvh, d]))
        keys = g.op("Transpose", g.op("Concat", f"past_k.{i}", k, axis=0), perm=[1, 2, 0])  # [kv, D, S]
        values = g.op("Transpose", g.op("Concat", f"past_v.{i}", v, axis=0), perm=[1, 0, 2])  # [kv, S, D]
        # grouped queries: the G query heads of one kv head become G*T rows against that head's keys
        q = g.op("Reshape", g.op("Transpose", g.op("Reshape", q, g.ints(-1, kvh, group, d)), perm=[1, 2, 0, 3]),
                 g.ints(kvh, -1, d))
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, keys), g.const(f"{name}scale", np.float32(d ** -0.5))),
                      "bias")
        out = g.op("MatMul", g.op("Softmax", scores, axis=-1), values)  # [kv, G*T, D]
        out = g.op("Reshape", g.op("Transpose", g.op("Reshape", out, g.ints(kvh, group, -1, d)), perm=[2, 0, 1, 3]),
                   g.ints(-1, heads * d))
        x = g.op("Add", x, g.linear(out, w("self_attn.o_proj.weight"), f"{name}o"))
        h = norm(x, g.const(f"{name}ln2", w("post_attention_layernorm.weight")))
        gate_up = torch.cat([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")])
        gate, up = g.op("Split", g.linear(h, gate_up, f"{name}gate_up"), g.ints(*[cfg.intermediate_size] * 2),
                        axis=-1, outputs=2)
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        x = g.op("Add", x, g.linear(act, w("mlp.down_proj.weight"), f"{name}down"))
    g.node("SimplifiedLayerNormalization", [x, g.const("model.norm", weights.tensor("model.norm.weight"))],
           ["hidden"], axis=-1, epsilon=cfg.rms_norm_eps, stash_type=1)
    g.node("Concat", present_k, ["present_k"], axis=0)
    g.node("Concat", present_v, ["present_v"], axis=0)
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["T", hidden]),
               helper.make_tensor_value_info("present_k", TensorProto.FLOAT, [layers, "T", kvh, d]),
               helper.make_tensor_value_info("present_v", TensorProto.FLOAT, [layers, "T", kvh, d])]
    return qwen2_ort._model(helper.make_graph(g.nodes, "qwen2_step", inputs, outputs, g.initializers))


class UnfusedOrtQwen2(qwen2_ort.OrtQwen2):
    """OrtQwen2's interface over a `build_unfused_model` graph: its own cache layout and forward."""

    cache_axis = 1

    def __init__(self, path: Path, weights: Qwen2Weights, threads: int | None = None, int8_head: bool = True) -> None:
        super().__init__(path, weights, threads, int8_head)
        self.group = weights.config.num_attention_heads // self.kv_heads
        self.cos, self.sin = _rope_tables(weights.config, self.head_dim)

    def new_cache(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `length` positions: [layers, length, kv_heads, head_dim] each."""
        shape = (self.layers, length, self.kv_heads, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, span: int,
                cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """As OrtQwen2.forward; the new keys and values come back from the graph and are copied into `cache`."""
        keys, values = cache
        t, start = ids.shape[0], int(positions[0])
        if span != start + t:
            raise ValueError("OrtQwen2 steps consecutive positions ending at span - 1")
        pos = positions.numpy()
        feed = {"x": self.embed.index_select(0, ids).numpy(), "cos": self.cos[pos], "sin": self.sin[pos],
                "bias": _causal_bias(start, t, self.group)}
        k_np, v_np = keys.numpy(), values.numpy()
        for layer in range(self.layers):
            feed[f"past_k.{layer}"] = k_np[layer, :start]
            feed[f"past_v.{layer}"] = v_np[layer, :start]
        hidden, new_k, new_v = self.session.run(None, feed)
        k_np[:, start:span] = new_k
        v_np[:, start:span] = new_v
        return torch.from_numpy(hidden)


def _rope_tables(cfg, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos [max_len, D] and sin with rotate-half's sign folded in, in fp32 (StaticQwen2's tables)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat([cos, cos], -1).numpy(), torch.cat([-sin, sin], -1).numpy()


def _causal_bias(start: int, t: int, group: int) -> np.ndarray:
    """[G*T, start + T]: 0 where query row r (position start + r % T) may see key s (s <= its position)."""
    keys = np.arange(start + t)
    allowed = keys[None, :] <= (start + np.arange(t))[:, None]
    bias = np.where(allowed, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    return np.tile(bias, (group, 1))
