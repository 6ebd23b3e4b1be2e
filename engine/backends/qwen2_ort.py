"""Provides OrtQwen2: Spark's Qwen2 LLM with int8 weights, stepped by ONNX Runtime on the CPU.

A batch-1 decode step reads every weight once, so on a CPU its speed is the memory bandwidth over the weights'
bytes: 1.4 GB a token in fp32, 0.36 GB in int8. The graph is written here node by node from the checkpoint's
tensors (no exporter, no transformers): StaticQwen2's maths (engine.backends.qwen2_static) with each projection
an ONNX Runtime `MatMulNBits` node of 8-bit weights, blockwise scales along K (`block_size`) and int8 dot
products (`accuracy_level` 4: the activations are quantised per block as well). Embedding and LM head stay in
torch, in fp32: a step reads one embedding row and the allowed head rows.

Once the weights are int8, the other nodes' overhead is a large part of a step, so a layer is written with ONNX
Runtime's fused CPU operators (domain com.microsoft, all in onnxruntime 1.23): `SkipSimplifiedLayerNormalization`
(residual add + RMSNorm), `MatMulNBits` with its bias input, and `GroupQueryAttention` (rotary embedding from its
own cos/sin tables, the KV cache update, grouped-query attention): about ten nodes a layer instead of thirty-five.

The converted model is written once per checkpoint under the user's cache folder (`convert`, `cached_path`) and loaded
from there afterwards. Keys and values live in torch tensors the caller owns ([layers, kv heads, positions, D]);
each layer's slice is bound (IO binding) as both the attention's past and its present, so the attention writes a
step's keys and values into the cache in place: nothing is copied or concatenated per step.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Literal, overload

import numpy as np
import torch

from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.backends.qwen2_checkpoint import rope_inv_freq
from engine.backends.qwen2_static import _check_supported, qkv_bias
from engine.config import QUANTIZE
from engine.errors import ModelFormatError

FORMAT_VERSIONS = {"int8": 3, "int4": 4}
"""Of each kind of converted file: part of its cache key, so a change to the graph or the quantisation converts
again (int8 2: fused operators and the cache bound in place; int4 3: scales searched for the least error; int8 3,
int4 4: a batch axis, so that several requests step together)."""
BLOCK = 128
"""Weights per int8 scale along K (the largest power of two up to this that divides K, for small test models).
128 steps faster than 32 (fewer scales to apply) and stays within the agreement bound (docs/cpu.md)."""
INT4_BLOCK = 128
"""Weights per scale of the opt-in 4-bit weights (`--quantize int4`): as BLOCK, fewer scales make a faster step."""
QUANTIZED = QUANTIZE[1:]
"""The weights this module converts to (each its own cached file): all but fp32."""
ACCURACY_LEVEL = 4
"""MatMulNBits computes in int8 (activations quantised per block): level 0 (fp32 compute) has no fast 8-bit
kernel on x86 and is far slower."""
OPSETS = (("", 17), ("com.microsoft", 1))
IR_VERSION = 8
"""Of the files written: opset 17's (onnx 1.13), which every ONNX Runtime we may meet reads (the onnx package
would stamp its own, newer than older runtimes accept)."""

BINDINGS = 16
"""IO bindings kept (one per cache buffer, the most recently used): more than the streams a CPU engine interleaves;
an evicted one is made again on its cache's next step."""

Progress = Callable[[int, int], None]
"""(layers converted, layers in all)."""


def supported() -> bool:
    """Whether ONNX Runtime and onnx are installed (both are dependencies; a broken install falls back to fp32).
    Looked up, not imported: the import is paid when the model loads."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


TELEMETRY_ENV = {"ORT_DISABLE_TELEMETRY": "1"}
"""What ONNX Runtime reads to keep its usage events (sent to its vendor by default in the official Linux builds
since 1.29) off; `voiceapp.cli.main` sets it too, for every process voicectl starts."""


def runtime():
    """The onnxruntime module, its telemetry off: the environment variable before it is first loaded (a user's
    own value is kept), and its API call where this version has one."""
    for name, value in TELEMETRY_ENV.items():
        os.environ.setdefault(name, value)
    import onnxruntime as ort

    disable = getattr(ort, "disable_telemetry_events", None)
    if disable is not None:
        disable()
    return ort


def describe(quantize: str = "int8") -> str:
    """Which weights and runtime run the LLM (for notices and the platform of a deterministic export)."""
    return f"{quantize} weights through onnxruntime {runtime().__version__}"


# ---- conversion ----------------------------------------------------------------------------------------------

def cached_path(folder: Path, quantize: str = "int8") -> Path:
    """Where the converted model of a checkpoint lives in `folder` (one folder per checkpoint hash)."""
    return folder / f"llm-{quantize}-v{FORMAT_VERSIONS[quantize]}.onnx"


def digest_path(path: Path) -> Path:
    """The converted model's SHA-256, written beside it when it is converted (`intact` checks it)."""
    return path.with_name(path.name + ".sha256")


def data_path(path: Path) -> Path:
    """Where the tensors of a converted model too large for one file live (`INLINE_BYTES`), beside it."""
    return path.with_name(path.name + ".data")


INLINE_BYTES = 1 << 30
"""Largest weight payload a converted model holds in its own file; a larger one (a 3B LLM's int8 layers) keeps its
tensors in `data_path`: protobuf cannot serialize a message of 2 GB or more."""


def intact(path: Path) -> bool:
    """Whether the converted model at `path` (and its data file, where it has one) is the one that was written: its
    digest file is there and matches every byte (a truncated or altered file fails, or loads and computes other
    numbers without a word). A file is read once per version of it (engine.model.cached_file_digest), not at every
    start."""
    from engine.model import cached_file_digest

    try:
        lines = digest_path(path).read_text(encoding="ascii").split()
        if not lines or lines[0] != cached_file_digest(path):
            return False
        return len(lines) == 1 or lines[1] == cached_file_digest(data_path(path))
    except (OSError, UnicodeDecodeError):
        return False


def convert(llm_dir: Path, path: Path, progress: Progress = lambda done, total: None,
            quantize: str = "int8") -> Path:
    """Write the `quantize` model of `llm_dir` to `path` (and its tensors to `data_path` where they pass
    INLINE_BYTES), with its digest beside it; the files appear complete or not at all, and other format versions of
    it beside it are removed."""
    import shutil

    from engine.atomic import replacing

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.{os.getpid()}"
    staging.mkdir(exist_ok=True)
    try:
        model = build_model(Qwen2Weights.from_checkpoint(llm_dir), quantize=quantize, progress=progress)
        digests = _write_model(model, staging / path.name)
        data_path(path).unlink(missing_ok=True)  # a larger earlier model's tensors, or a torn one
        if len(digests) > 1:
            (staging / data_path(path).name).replace(data_path(path))
        (staging / path.name).replace(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with replacing(digest_path(path), suffix=f".{os.getpid()}.tmp") as digest:
        digest.write_text("\n".join(digests) + "\n", encoding="ascii")
    for old in path.parent.glob(f"llm-{quantize}-v*.onnx"):
        if old != path:
            old.unlink(missing_ok=True)
            digest_path(old).unlink(missing_ok=True)
            data_path(old).unlink(missing_ok=True)
    return path


def _write_model(model, path: Path) -> list[str]:
    """Write `model` to `path`, its tensors to `data_path(path)` when they pass INLINE_BYTES (ONNX's external data,
    which ONNX Runtime reads beside the model); the SHA-256 of each file written."""
    import hashlib

    from engine.model import file_digest

    external = sum(len(t.raw_data) for t in model.graph.initializer) > INLINE_BYTES
    if external:
        from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

        # small tensors (shapes, split sizes) stay in the model: ONNX Runtime's shape inference reads them there
        convert_model_to_external_data(model, all_tensors_to_one_file=True, location=data_path(path).name,
                                       size_threshold=1024)
        write_external_data_tensors(model, str(path.parent))
    data = model.SerializeToString()
    with open(path, "wb") as f:
        f.write(data)
    return [hashlib.sha256(data).hexdigest()] + ([file_digest(data_path(path))] if external else [])


def load(path: Path, llm_dir: Path, threads: int | None = None, int8_head: bool = True,
         spin: bool = False) -> "OrtQwen2":
    """OrtQwen2 over a converted model and its checkpoint (embedding, config)."""
    return OrtQwen2(path, Qwen2Weights.from_checkpoint(llm_dir), threads, int8_head, spin)


def block_for(k: int, most: int = BLOCK) -> int:
    """Scale block along K: the largest power of two up to `most` (and at least 16) that divides `k`."""
    block = most
    while block > 16 and k % block:
        block //= 2
    if k % block:
        raise ModelFormatError(f"cannot quantise a projection of {k} inputs (not a multiple of 16)")
    return block


INT4_SCALE_SEARCH = tuple(1 - 0.025 * i for i in range(21))
"""Scales tried for each 4-bit block, as fractions of the one that reaches its largest weight: with 15 levels, a
block's largest weight is an outlier that leaves the others few levels, so clipping it often reconstructs the block
better. Down to half, below what the synthetic checkpoints choose, as a trained model's outliers may."""


def quantize_blocks_4bit(w: torch.Tensor, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 4-bit of w [N, K] per block of K: (codes + 8, two to a byte, the first in the low nibble, as uint8
    [N, K / block, block / 2], fp32 scales [N * K / block]); w ~ (codes - 8) * scale, MatMulNBits' default zero
    point for 4 bits. Each block's scale is the one of INT4_SCALE_SEARCH with the least squared error."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // block, block)
    reach = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7
    scales, error = reach, torch.full_like(reach, float("inf"))
    for fraction in INT4_SCALE_SEARCH:
        trial = reach * fraction
        trial_error = (_codes_4bit(blocks, trial).mul_(trial).sub_(blocks).square_().sum(-1, keepdim=True))
        better = trial_error < error
        scales, error = torch.where(better, trial, scales), torch.where(better, trial_error, error)
    codes = _codes_4bit(blocks, scales).add_(8).to(torch.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).numpy(), scales.reshape(-1).numpy()


def _codes_4bit(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Signed 4-bit codes (-8..7, as floats) of `blocks` at `scales` (one per block)."""
    return torch.round(blocks / scales).clamp_(-8, 7)


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

    def fresh(self, kind: str) -> str:
        """A new value name."""
        self._names += 1
        return f"{kind.lower()}_{self._names}"

    def node(self, kind: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> None:
        """A node with named outputs ("" for an optional output not produced, as for a missing optional input)."""
        from onnx import helper

        self.nodes.append(helper.make_node(kind, inputs, outputs, domain=domain or None, **attrs))

    @overload
    def op(self, kind: str, *inputs: str, outputs: Literal[1] = 1, domain: str = "", **attrs: Any) -> str: ...

    @overload
    def op(self, kind: str, *inputs: str, outputs: Literal[2, 3], domain: str = "", **attrs: Any) -> list[str]: ...

    def op(self, kind: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs: Any) -> str | list[str]:
        names = [f"{self.fresh(kind)}_{i}" for i in range(outputs)]
        self.node(kind, list(inputs), names, domain, **attrs)
        return names[0] if outputs == 1 else names

    def const(self, name: str, value: np.ndarray | torch.Tensor) -> str:
        array = value.detach().float().numpy() if isinstance(value, torch.Tensor) else value
        self.initializers.append(self._array(np.ascontiguousarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(self.fresh("shape"), np.array(values, dtype=np.int64))

    def linear(self, x: str, w: torch.Tensor, name: str, bias: torch.Tensor | None = None) -> str:
        """x [..., K] @ w.T (+ bias) for a transformers weight w [N, K]: int8 (or int4) MatMulNBits with the bias
        as its input, or fp32 MatMul and Add (quantize none)."""
        n, k = w.shape
        if self.quantize == "none":
            y = self.op("MatMul", x, self.const(name, w.t().contiguous()))
            return y if bias is None else self.op("Add", y, self.const(f"{name}.bias", bias))
        bits = 4 if self.quantize == "int4" else 8
        block = block_for(k, INT4_BLOCK if bits == 4 else self.block)
        codes, scales = (quantize_blocks_4bit if bits == 4 else quantize_blocks)(w, block)
        inputs = [x, self.const(f"{name}.q", codes), self.const(f"{name}.scales", scales)]
        if bias is not None:  # after the zero points and g_idx inputs, left out (symmetric codes, no reordering)
            inputs += ["", "", self.const(f"{name}.bias", bias)]
        return self.op("MatMulNBits", *inputs, domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                       accuracy_level=ACCURACY_LEVEL)


def build_model(weights: Qwen2Weights, quantize: str = "int8", block: int = BLOCK,
                progress: Progress = lambda done, total: None, builder: GraphBuilder | None = None):
    """The step graph (an onnx ModelProto) of `weights`' decoder layers and final norm.

    Inputs: x [B, T, H] (row b: embedded ids at positions S_b - T .. S_b - 1), seqlens_k [B] (int32: S_b - 1),
    total_sequence_length (int32 scalar: the largest S_b) and, per layer l, past_key.l / past_value.l [B, kv, C, D]:
    the B requests' caches side by side, C >= every S_b positions. Outputs: hidden [B, T, H] (after the final norm)
    and present_key.l / present_value.l, which the caller binds to the very buffers of past_key.l / past_value.l:
    GroupQueryAttention then writes row b's T new keys and values at its positions S_b - T .. S_b - 1 in place (its
    shared-buffer mode). Rows of several requests step one token each (T 1); a prompt steps alone (B 1)."""
    from onnx import TensorProto, helper

    cfg = weights.config
    _check(cfg)
    g = builder or GraphBuilder(quantize, block)
    d, layers = _head_dim(cfg), cfg.num_hidden_layers
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", cfg.hidden_size]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "T", cfg.hidden_size])]
    for i in range(layers):
        for kind in ("key", "value"):
            shape = ["B", cfg.num_key_value_heads, "C", d]
            inputs.append(helper.make_tensor_value_info(f"past_{kind}.{i}", TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}.{i}", TensorProto.FLOAT, shape))
    cos, sin = (g.const(name, table) for name, table in zip(("cos", "sin"), _rope_tables(cfg, d)))
    residual, delta = "x", None
    for i in range(layers):
        residual, delta = decoder_layer(g, weights, i, residual, delta, cos, sin)
        progress(i + 1, layers)
    assert delta is not None  # a model has layers
    g.node("SkipSimplifiedLayerNormalization", [residual, delta, g.const("model.norm", weights.tensor(
        "model.norm.weight"))], ["hidden"], domain="com.microsoft", epsilon=cfg.rms_norm_eps)
    return _model(helper.make_graph(g.nodes, "qwen2_step", inputs, outputs, g.initializers))


def decoder_layer(g: GraphBuilder, weights: Qwen2Weights, i: int, residual: str, delta: str | None, cos: str,
                  sin: str) -> tuple[str, str]:
    """Layer i's nodes. The residual stream is carried as (sum so far, delta not yet added): each norm adds the
    pending delta as it normalises, and the last delta (the MLP's) is left to the next layer or the final norm."""
    cfg, name = weights.config, f"model.layers.{i}."

    def w(suffix: str) -> torch.Tensor:
        return weights.tensor(name + suffix).detach().float()

    h, residual = add_norm(g, residual, delta, g.const(f"{name}ln1", w("input_layernorm.weight")), cfg.rms_norm_eps)
    h, residual = add_norm(g, residual, attention(g, cfg, w, i, h, cos, sin),
                           g.const(f"{name}ln2", w("post_attention_layernorm.weight")), cfg.rms_norm_eps)
    return residual, mlp(g, cfg, w, name, h)


def attention(g: GraphBuilder, cfg, w: Callable[[str], torch.Tensor], i: int, h: str, cos: str, sin: str) -> str:
    """Layer i's self-attention of the normed h: one projection to q|k|v with its bias, then GroupQueryAttention
    on the packed result (key and value inputs left out): rotary embedding (rotate-half, as Qwen2's), the new keys
    and values written into the bound cache, grouped-query attention; then the output projection."""
    name = f"model.layers.{i}."
    weight = torch.cat([w(f"self_attn.{p}_proj.weight") for p in "qkv"])
    bias = qkv_bias(lambda key: w(key[len(name):]), name, weight.shape[0]) if cfg.attention_bias else None
    qkv = g.linear(h, weight, f"{name}qkv", bias)
    attended = g.fresh("gqa")
    g.node("GroupQueryAttention", [qkv, "", "", f"past_key.{i}", f"past_value.{i}", "seqlens_k",
                                   "total_sequence_length", cos, sin],
           [attended, f"present_key.{i}", f"present_value.{i}"], domain="com.microsoft",
           num_heads=cfg.num_attention_heads, kv_num_heads=cfg.num_key_value_heads, scale=_head_dim(cfg) ** -0.5,
           do_rotary=1, rotary_interleaved=0)
    return g.linear(attended, w("self_attn.o_proj.weight"), f"{name}o")


def mlp(g: GraphBuilder, cfg, w: Callable[[str], torch.Tensor], name: str, h: str) -> str:
    """SwiGLU of the normed h: gate and up in one projection (ONNX Runtime 1.23 has no fused SwiGLU on the CPU;
    it fuses gate * sigmoid(gate) into one QuickGelu node itself)."""
    gate_up = torch.cat([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")])
    gate, up = g.op("Split", g.linear(h, gate_up, f"{name}gate_up"), g.ints(*[cfg.intermediate_size] * 2),
                    axis=-1, outputs=2)
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    return g.linear(act, w("mlp.down_proj.weight"), f"{name}down")


def add_norm(g: GraphBuilder, residual: str, delta: str | None, weight: str, eps: float) -> tuple[str, str]:
    """(RMSNorm(residual + delta), residual + delta) in one node; the first layer has no delta to add."""
    if delta is None:
        return g.op("SimplifiedLayerNormalization", residual, weight, axis=-1, epsilon=eps, stash_type=1), residual
    normed, total = g.fresh("norm"), g.fresh("residual")
    g.node("SkipSimplifiedLayerNormalization", [residual, delta, weight], [normed, "", "", total],
           domain="com.microsoft", epsilon=eps)  # outputs: normed, mean, inv_std_var, input + skip
    return normed, total


def _check(cfg) -> None:
    """StaticQwen2's checks, and GroupQueryAttention's rotary needs: a head dim that is a multiple of 16."""
    _check_supported(cfg)
    if _head_dim(cfg) % 16:
        raise ModelFormatError(f"no int8 path for a head dim of {_head_dim(cfg)} (not a multiple of 16)")


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


# ---- running it ----------------------------------------------------------------------------------------------

class OrtQwen2:
    """StaticQwen2's stepping interface (`forward`, `new_cache`, `head_rows`, `output`, `vocab_size`) over the
    int8 graph; the cache's position axis is `cache_axis`, and `head_rows` gives a callable (OrtHead). Requests
    whose caches are rows of one `new_rows` buffer step together (`forward_rows`)."""

    cache_axis = 2

    def __init__(self, path: Path, weights: Qwen2Weights, threads: int | None = None, int8_head: bool = True,
                 spin: bool = False) -> None:
        """`path`: a converted model (`convert`); `weights`: the same checkpoint (embedding, config). `int8_head`:
        `head_rows` in int8 (else fp32 rows, as StaticQwen2's). `spin`: the layers' threads wait for the next
        kernel spinning, not sleeping; only where they have cores of their own (factory.cpu_pools)."""
        cfg = weights.config
        self.layers, self.kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.hidden, self.head_dim = cfg.hidden_size, _head_dim(cfg)
        self.embed = weights.tensor("model.embed_tokens.weight").detach().float().contiguous()
        self.output = self.embed if weights.tied else weights.tensor("lm_head.weight").detach().float().contiguous()
        self.vocab_size = self.embed.shape[0]
        self.threads, self.int8_head = threads or torch.get_num_threads(), int8_head
        try:
            self.session = _session(str(path), self.threads, spin)
        except Exception as err:  # noqa: BLE001 - a truncated or foreign file: one user-facing line
            raise ModelFormatError(f"cannot load the int8 LLM {path}: {str(err).splitlines()[0]}") from err
        self._bindings: dict[tuple[int, int, int, int], Any] = {}

    def head_rows(self, ids: torch.Tensor) -> "OrtHead | torch.Tensor":
        """The LM head restricted to vocabulary ids [A], in int8: a step's logits read 8195 x 896 bytes instead of
        four times that (the fp32 rows were ~8% of an int8 step's bytes)."""
        rows = self.output.index_select(0, ids)
        return OrtHead(rows, self.threads) if self.int8_head else rows

    def new_cache(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `length` positions: [layers, kv_heads, length, head_dim] each, so that a
        layer's slice is the [1, kv, C, D] buffer GroupQueryAttention reads and writes."""
        shape = (self.layers, self.kv_heads, length, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def new_rows(self, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `rows` requests of `length` positions side by side: [layers, rows, kv_heads,
        length, head_dim] each. Row r (`[:, r]`) is a request's cache for `forward`; consecutive rows (`[:, a:b]`)
        step together in `forward_rows`."""
        shape = (self.layers, rows, self.kv_heads, length, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, span: int,
                cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Hidden states [T, H] (after the final norm) for `ids` [T] at the consecutive `positions` [T] that end
        at `span` - 1: attends over cache positions < positions[0] and the T new ones (causally), and writes the
        new keys and values into `cache` ([layers, kv, >= span, D] each, a layer's slice contiguous) in place."""
        t, start = ids.shape[0], int(positions[0])
        if span != start + t or span > cache[0].shape[2]:
            raise ValueError("OrtQwen2 steps consecutive positions ending at span - 1, within the cache")
        keys, values = cache
        return self._run(ids[None], [span], (keys[:, None], values[:, None]))[0]

    def forward_rows(self, ids: torch.Tensor, spans: list[int],
                     cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """One step of B requests side by side: hidden states [B, H] (after the final norm). Row b feeds ids[b] at
        position spans[b] - 1 of its own cache, `cache`'s row b ([layers, B, kv, >= every span, D] each: `new_rows`'
        consecutive rows), writes its key and value there in place and attends over that request's positions only.
        B rows read every weight once, as one does."""
        if len(spans) != ids.shape[0] or max(spans) > cache[0].shape[3]:
            raise ValueError("OrtQwen2.forward_rows takes one id and one span per row, within the cache")
        return self._run(ids[:, None], spans, cache)[:, 0]

    def _run(self, ids: torch.Tensor, spans: list[int], cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The graph over `ids` [B, T] (row b's T positions ending at spans[b] - 1) and the rows' caches
        ([layers, B, kv, C, D]): hidden [B, T, H]."""
        x = self.embed.index_select(0, ids.reshape(-1)).reshape(*ids.shape, self.hidden)
        hidden = torch.empty_like(x)
        ends = np.array(spans, np.int32)
        lengths = ends - 1, np.array(ends.max(), np.int32)  # alive until the run is over
        binding = self._binding(cache)
        _bind(binding.bind_input, "x", x)
        binding.bind_cpu_input("seqlens_k", lengths[0])
        binding.bind_cpu_input("total_sequence_length", lengths[1])
        _bind(binding.bind_output, "hidden", hidden)
        self.session.run_with_iobinding(binding)
        return hidden

    def _binding(self, cache: tuple[torch.Tensor, torch.Tensor]):
        """An IO binding with every layer's past and present bound to the cache's slices ([B, kv, C, D], each
        contiguous), made once per cache buffer: binding 4 x layers buffers anew every step would be a noticeable
        share of the step. Kept for the most recent caches, keyed by address and shape: a new cache at
        a freed one's address binds the same way."""
        keys, values = cache
        key = (keys.data_ptr(), values.data_ptr(), keys.shape[1], keys.shape[3])
        binding = self._bindings.pop(key, None)
        if binding is None:
            binding = self.session.io_binding()
            for layer in range(self.layers):
                for kind, buffer in (("key", keys[layer]), ("value", values[layer])):
                    if not buffer.is_contiguous():
                        raise ValueError("OrtQwen2 binds each layer's cache rows as one contiguous buffer")
                    _bind(binding.bind_input, f"past_{kind}.{layer}", buffer)
                    _bind(binding.bind_output, f"present_{kind}.{layer}", buffer)
        self._bindings[key] = binding  # most recent last
        while len(self._bindings) > BINDINGS:
            self._bindings.pop(next(iter(self._bindings)))
        return binding


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


def _bind(bind: Callable, name: str, tensor: torch.Tensor) -> None:
    """Bind a contiguous fp32 CPU tensor's memory (no copy) as an input or output of an IO binding."""
    bind(name, "cpu", 0, np.float32, list(tensor.shape), tensor.data_ptr())


def _model(graph):
    """A ModelProto of `graph` at our opsets and IR version."""
    from onnx import helper

    return helper.make_model(graph, opset_imports=[helper.make_opsetid(*o) for o in OPSETS], ir_version=IR_VERSION,
                             producer_name="voiceapp")


def _session(model: str | bytes, threads: int, spin: bool = False):
    """An ONNX Runtime CPU session on `threads` threads that sleep, not spin, when idle (unless `spin`): the
    decoder (torch) computes on the same cores."""
    ort = runtime()

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


ROPE_POSITIONS = 32768
"""Most positions the rotary tables cover (Qwen2's whole context; a Llama's 131,072 would cost 64 MB of tables that
no sentence reaches)."""


def _rope_tables(cfg, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [max_position_embeddings, D / 2] in fp32, StaticQwen2's frequencies: GroupQueryAttention's
    cos_cache and sin_cache (it picks the rows by position and applies rotate-half itself)."""
    positions = min(cfg.max_position_embeddings, ROPE_POSITIONS)
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), rope_inv_freq(cfg, d))
    return freqs.cos().numpy(), freqs.sin().numpy()
