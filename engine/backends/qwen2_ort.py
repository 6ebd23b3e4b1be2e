"""Provides OrtQwen2: Spark's Qwen2 LLM with int8 weights, stepped by ONNX Runtime on the CPU.

A batch-1 decode step reads every weight once, so on a CPU its speed is the memory bandwidth over the weights'
bytes: 1.4 GB a token in fp32, 0.36 GB in int8. The graph is written here node by node from the checkpoint's
tensors (no exporter, no transformers): StaticQwen2's maths (engine.backends.qwen2_static) with each projection
an ONNX Runtime `MatMulNBits` node of 8-bit weights, blockwise scales along K (`block_size`) and int8 dot
products (`accuracy_level` 4: the activations are quantised per block as well). Embedding and LM head stay in
torch, in fp32: a step reads one embedding row and the allowed head rows.

The converted model is written once per checkpoint under the user's cache folder (`convert`, `cached_path`) and loaded
from there afterwards. Keys and values live in torch tensors the caller owns ([layers, positions, kv heads, D]);
each layer's past is handed to the graph as a view, and the graph returns the step's new keys and values, which
are copied into the cache after the run.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.backends.qwen2_static import _check_supported
from engine.errors import ModelFormatError

FORMAT_VERSION = 1
"""Of the converted file: part of its cache key, so a change to the graph or the quantisation converts again."""
BLOCK = 128
"""Weights per int8 scale along K (the largest power of two up to this that divides K, for small test models).
On 2 cores the full model stepped 52-60 tokens/s with 128 and 40-43 with 32, which agrees a little better with
fp32 (docs/cpu.md)."""
ACCURACY_LEVEL = 4
"""MatMulNBits computes in int8 (activations quantised per block): level 0 (fp32 compute) has no fast 8-bit
kernel on x86 and ran about 50x slower (docs/cpu.md)."""
OPSETS = (("", 17), ("com.microsoft", 1))
IR_VERSION = 8
"""Of the files written: opset 17's (onnx 1.13), which every ONNX Runtime we may meet reads (the onnx package
would stamp its own, newer than older runtimes accept)."""

Progress = Callable[[int, int], None]
"""(layers converted, layers in all)."""


def supported() -> bool:
    """Whether ONNX Runtime and onnx are installed (both are dependencies; a broken install falls back to fp32).
    Looked up, not imported: the import is paid when the model loads."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


def describe() -> str:
    """Which runtime runs the int8 LLM (for notices and the platform of a deterministic export)."""
    import onnxruntime

    return f"int8 weights through onnxruntime {onnxruntime.__version__}"


# ---- conversion ----------------------------------------------------------------------------------------------

def cached_path(folder: Path) -> Path:
    """Where the converted model of a checkpoint lives in `folder` (one folder per checkpoint hash)."""
    return folder / f"llm-int8-v{FORMAT_VERSION}.onnx"


def convert(llm_dir: Path, path: Path, progress: Progress = lambda done, total: None) -> Path:
    """Write the int8 model of `llm_dir` to `path`; the file appears complete or not at all, and other format
    versions beside it are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        model = build_model(Qwen2Weights.from_checkpoint(llm_dir), progress=progress)
        with open(tmp, "wb") as f:
            f.write(model.SerializeToString())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    for old in path.parent.glob("llm-int8-v*.onnx"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def load(path: Path, llm_dir: Path, threads: int | None = None, int8_head: bool = True) -> "OrtQwen2":
    """OrtQwen2 over a converted model and its checkpoint (embedding, config)."""
    return OrtQwen2(path, Qwen2Weights.from_checkpoint(llm_dir), threads, int8_head)


def block_for(k: int, most: int = BLOCK) -> int:
    """Scale block along K: the largest power of two up to `most` (and at least 16) that divides `k`."""
    block = most
    while block > 16 and k % block:
        block //= 2
    if k % block:
        raise ModelFormatError(f"cannot quantise a projection of {k} inputs (not a multiple of 16)")
    return block


def quantize_blocks(w: torch.Tensor, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 of w [N, K] per block of K: (codes + 128 as uint8 [N, K / block, block], fp32 scales
    [N * K / block]); w ~ (codes - 128) * scale, MatMulNBits' default zero point."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // block, block)
    scales = blocks.abs().amax(-1).clamp_min(1e-12) / 127
    codes = torch.round(blocks / scales[..., None]).clamp_(-127, 127).add_(128).to(torch.uint8)
    return codes.numpy(), scales.reshape(-1).numpy()


class GraphBuilder:
    """An ONNX graph under construction: nodes, initializers and fresh value names."""

    def __init__(self, quantize: str = "int8", block: int = BLOCK) -> None:
        from onnx import numpy_helper

        self._array = numpy_helper.from_array
        self.quantize, self.block = quantize, block
        self.nodes: list = []
        self.initializers: list = []
        self._names = 0

    def op(self, kind: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs) -> str | list[str]:
        from onnx import helper

        self._names += 1
        names = [f"{kind.lower()}_{self._names}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(kind, list(inputs), names, domain=domain or None, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, name: str, value: np.ndarray | torch.Tensor) -> str:
        array = value.detach().float().numpy() if isinstance(value, torch.Tensor) else value
        self.initializers.append(self._array(np.ascontiguousarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        self._names += 1
        return self.const(f"shape_{self._names}", np.array(values, dtype=np.int64))

    def linear(self, x: str, w: torch.Tensor, name: str) -> str:
        """x [T, K] @ w.T for a transformers weight w [N, K]: int8 MatMulNBits, or fp32 MatMul (quantize none)."""
        n, k = w.shape
        if self.quantize == "none":
            return self.op("MatMul", x, self.const(name, w.t().contiguous()))
        block = block_for(k, self.block)
        codes, scales = quantize_blocks(w, block)
        return self.op("MatMulNBits", x, self.const(f"{name}.q", codes), self.const(f"{name}.scales", scales),
                       domain="com.microsoft", K=k, N=n, bits=8, block_size=block, accuracy_level=ACCURACY_LEVEL)


def build_model(weights: Qwen2Weights, quantize: str = "int8", block: int = BLOCK,
                progress: Progress = lambda done, total: None, builder: GraphBuilder | None = None):
    """The step graph (an onnx ModelProto) of `weights`' decoder layers and final norm.

    Inputs: x [T, H] (embedded ids), cos and sin [T, D] (StaticQwen2's tables at the T positions), bias [G*T, S]
    (0 / -inf: which of the S = P + T keys each query sees, rows g-major) and, per layer l, past_k.l / past_v.l
    [P, kv, D]. Outputs: hidden [T, H] (after the final norm) and present_k / present_v [L, T, kv, D]."""
    from onnx import TensorProto, helper

    cfg = weights.config
    _check_supported(cfg)
    g = builder or GraphBuilder(quantize, block)
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
        progress(i + 1, layers)
    g.nodes.append(helper.make_node("SimplifiedLayerNormalization",
                                    [x, g.const("model.norm", weights.tensor("model.norm.weight"))], ["hidden"],
                                    axis=-1, epsilon=cfg.rms_norm_eps, stash_type=1))
    g.nodes.append(helper.make_node("Concat", present_k, ["present_k"], axis=0))
    g.nodes.append(helper.make_node("Concat", present_v, ["present_v"], axis=0))
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["T", hidden]),
               helper.make_tensor_value_info("present_k", TensorProto.FLOAT, [layers, "T", kvh, d]),
               helper.make_tensor_value_info("present_v", TensorProto.FLOAT, [layers, "T", kvh, d])]
    graph = helper.make_graph(g.nodes, "qwen2_step", inputs, outputs, g.initializers)
    return _model(graph)


# ---- running it ----------------------------------------------------------------------------------------------

class OrtQwen2:
    """StaticQwen2's stepping interface (`forward`, `new_cache`, `head_rows`, `output`, `vocab_size`) over the
    int8 graph; the cache's position axis is `cache_axis`, and `head_rows` gives a callable (OrtHead)."""

    cache_axis = 1

    def __init__(self, path: Path, weights: Qwen2Weights, threads: int | None = None, int8_head: bool = True) -> None:
        """`path`: a converted model (`convert`); `weights`: the same checkpoint (embedding, config). `int8_head`:
        `head_rows` in int8 (else fp32 rows, as StaticQwen2's)."""
        import onnxruntime as ort

        cfg = weights.config
        self.layers, self.kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.heads, self.hidden = cfg.num_attention_heads, cfg.hidden_size
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.embed = weights.tensor("model.embed_tokens.weight").detach().float().contiguous()
        self.output = self.embed if weights.tied else weights.tensor("lm_head.weight").detach().float().contiguous()
        self.vocab_size = self.embed.shape[0]
        self.cos, self.sin = _rope_tables(cfg, self.head_dim)
        self.threads, self.int8_head = threads or torch.get_num_threads(), int8_head
        try:
            self.session = _session(str(path), self.threads)
        except Exception as err:  # noqa: BLE001 - a truncated or foreign file: one user-facing line
            raise ModelFormatError(f"cannot load the int8 LLM {path}: {str(err).splitlines()[0]}") from err

    def head_rows(self, ids: torch.Tensor) -> "OrtHead | torch.Tensor":
        """The LM head restricted to vocabulary ids [A], in int8: a step's logits read 8195 x 896 bytes instead of
        four times that (the fp32 rows were ~8% of an int8 step's bytes)."""
        rows = self.output.index_select(0, ids)
        return OrtHead(rows, self.threads) if self.int8_head else rows

    def new_cache(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `length` positions: [layers, length, kv_heads, head_dim] each."""
        shape = (self.layers, length, self.kv_heads, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, span: int,
                cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Hidden states [T, H] (after the final norm) for `ids` [T] at the consecutive `positions` [T] that end
        at `span` - 1: attends over cache positions < positions[0] and the T new ones (causally), then writes the
        new keys and values into `cache` ([layers, >= span, kv, D] each)."""
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


class OrtHead:
    """Logits over fixed output rows [A, H]: int8 rows (MatMulNBits, as the layers') in a graph of their own."""

    def __init__(self, rows: torch.Tensor, threads: int) -> None:
        from onnx import TensorProto, helper

        g = GraphBuilder()
        logits = g.linear("hidden", rows, "head")
        graph = helper.make_graph(g.nodes, "head", [helper.make_tensor_value_info("hidden", TensorProto.FLOAT,
                                                                                   ["T", rows.shape[1]])],
                                  [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["T", rows.shape[0]])],
                                  g.initializers)
        self.session = _session(_model(graph).SerializeToString(), threads)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [A] for a hidden state [H] (or [T, A] for [T, H])."""
        rows = hidden.float().reshape(-1, hidden.shape[-1]).numpy()
        logits = torch.from_numpy(self.session.run(None, {"hidden": rows})[0])
        return logits.reshape(*hidden.shape[:-1], -1)


def _model(graph):
    """A ModelProto of `graph` at our opsets and IR version."""
    from onnx import helper

    return helper.make_model(graph, opset_imports=[helper.make_opsetid(*o) for o in OPSETS], ir_version=IR_VERSION,
                             producer_name="voiceapp")


def _session(model: str | bytes, threads: int):
    """An ONNX Runtime CPU session on `threads` threads that sleep, not spin, when idle: the decoder (torch)
    computes on the same cores."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _rope_tables(cfg, d: int, max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos [max_len, D] and sin with rotate-half's sign folded in, in fp32 (StaticQwen2's tables)."""
    max_len = max_len or cfg.max_position_embeddings
    theta = cfg.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat([cos, cos], -1).numpy(), torch.cat([-sin, sin], -1).numpy()


def _causal_bias(start: int, t: int, group: int) -> np.ndarray:
    """[G*T, start + T]: 0 where query row r (position start + r % T) may see key s (s <= its position)."""
    keys = np.arange(start + t)
    allowed = keys[None, :] <= (start + np.arange(t))[:, None]
    bias = np.where(allowed, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    return np.tile(bias, (group, 1))
