"""Provides StaticQwen2: Spark's Qwen2 LLM as plain tensor code over a preallocated KV cache, for CUDA graphs.

Every buffer has a fixed address and every shape is fixed per call site (prompt bucket, attention span bucket), so
a whole prefill or decode step, sampling included, can be captured once as a CUDA graph and replayed with one
launch (engine.backends.graph_gen). The maths is transformers' Qwen2 (RMSNorm, rotary embeddings with
rotate-half, grouped-query attention with q/k/v biases, SwiGLU MLP); tests check it against
`Qwen2ForCausalLM` on a tiny random model. Projections that share an input are concatenated (q/k/v, gate/up) and
the residual adds ride in the GEMM epilogues (addmm): fewer kernels per layer is what a batch-1 step is made of.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from engine.backends import decode_kernels
from engine.backends.decode_kernels import TILINGS, FusedPlan
from engine.errors import ModelFormatError
from engine.backends.qwen2_checkpoint import ARCHITECTURES, Qwen2Weights, rope_inv_freq, rope_kind


def supported(cfg) -> bool:
    """Whether StaticQwen2 implements this transformers config (Qwen2 or Llama, plain or llama3 rotary, no sliding
    window)."""
    try:
        _check_supported(cfg)
    except ValueError:
        return False
    return getattr(cfg, "model_type", None) in ARCHITECTURES


def _check_supported(cfg) -> None:
    """ValueError for variants this forward does not implement (neither family's checkpoint uses them)."""
    kind = rope_kind(cfg)
    if kind not in ("default", "llama3"):
        raise ValueError(f"the graph lane implements plain and llama3 rotary embeddings, not {kind!r}")
    if getattr(cfg, "use_sliding_window", False):
        raise ValueError("the graph lane does not implement sliding-window attention")


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer's tensors, projections pre-transposed for addmm (x @ W.T)."""

    ln1: torch.Tensor
    qkv_t: torch.Tensor
    """[H, (heads + 2 kv_heads) * head_dim]: q, k, v projections side by side."""
    qkv_bias: torch.Tensor
    o_t: torch.Tensor
    ln2: torch.Tensor
    gate_up_t: torch.Tensor
    """[H, 2 * intermediate]: gate then up."""
    down_t: torch.Tensor


def qkv_bias(tensor, prefix: str, width: int) -> torch.Tensor:
    """A layer's q|k|v biases side by side (`tensor`: name -> tensor), or zeros where the model has none (Llama):
    one projection with a bias serves both."""
    try:
        return torch.cat([tensor(f"{prefix}self_attn.{p}_proj.bias").detach() for p in "qkv"])
    except (KeyError, ModelFormatError):
        return torch.zeros(width)


COUNTS = 4096
"""`StaticQwen2.counts`: enough for 16 rows x 256 kv heads, or 4096 output blocks of a split-K projection."""


class StaticQwen2:
    """Qwen2 forward over a static KV cache of `max_len` positions (batch 1)."""

    def __init__(self, model: torch.nn.Module | Qwen2Weights, max_len: int, device: torch.device | str,
                 dtype: torch.dtype, compile_layers: bool = False, own_cache: bool = True,
                 release: bool = False) -> None:
        """`model`: a transformers Qwen2 model or its weights read from a checkpoint. `max_len`: positions covered
        (rotary tables, and the cache when `own_cache`; without it every forward gets a cache from `new_cache`).
        `release`: free each transformers layer's weights once converted, so a CPU holds one copy of the model, not
        two (the model cannot run by itself afterwards)."""
        weights = model if isinstance(model, Qwen2Weights) else Qwen2Weights.from_module(model)
        cfg = weights.config
        _check_supported(cfg)
        self.device, self.dtype, self.max_len = torch.device(device), dtype, max_len
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.eps = cfg.rms_norm_eps
        self.hidden = cfg.hidden_size

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(device=self.device, dtype=dtype).contiguous()

        self.embed = put(weights.tensor("model.embed_tokens.weight"))
        self.output = self.embed if weights.tied else put(weights.tensor("lm_head.weight"))
        """Output embedding [V, H] (the same tensor as `embed` when tied, as in Spark's checkpoint: one 300 MB
        copy, not two); restricted rows are taken from it."""
        self.vocab_size = self.embed.shape[0]
        self.norm = put(weights.tensor("model.norm.weight"))
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            self.layers.append(self._weights(weights.tensor, f"model.layers.{i}.", self.device, dtype))
            if release:
                weights.release(i)
        self.k_cache: torch.Tensor | None
        self.v_cache: torch.Tensor | None
        self.k_cache, self.v_cache = self.new_cache(max_len) if own_cache else (None, None)
        self.counts = torch.zeros(COUNTS, device=self.device, dtype=torch.int32)
        """Counters of the fused kernels whose last program merges the others' work (split attention, reduced
        split-K): each kernel leaves them zero, and the step's kernels run one after another, so they share."""
        self._k_major: dict[tuple[bool, bool], list[LayerWeights]] = {}
        """`_fused_weights`' copies, per (o, down) in our kernels."""
        self.cos, self.sin = self._rope_tables(cfg, max_len)
        self._layer, self._row_layer = self._layer_step, self._row_layer_step
        self._prefill_layer = self._prefill_layer_step
        """One decoder layer; with `compile_layers`, Inductor fuses its elementwise work (norms, rotary, SwiGLU)
        into a few kernels. Every layer has the same shapes, so one compile per span serves all of them."""
        if compile_layers:
            self.compile_layers()

    def compile_layers(self, prefill: bool = True) -> None:
        """Inductor compiles the layer steps (and the prefill's, with `prefill`) on their first call."""
        # one compile per shape: (rows, span) ~42, (prompts, bucket) ~20, above dynamo's default limit of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._layer = torch.compile(self._layer_step, fullgraph=True, dynamic=False)
        self._row_layer = torch.compile(self._row_layer_step, fullgraph=True, dynamic=False)
        if prefill:
            self._prefill_layer = torch.compile(self._prefill_layer_step, fullgraph=True, dynamic=False)

    @staticmethod
    def _weights(tensor, prefix: str, device: torch.device, dtype: torch.dtype) -> LayerWeights:
        """One layer's tensors (`tensor`: name -> tensor; names under `prefix`), concatenated and transposed where
        they will live (on a GPU that is faster than on the host)."""
        def get(name: str) -> torch.Tensor:
            return tensor(prefix + name).detach().to(device=device, dtype=dtype).contiguous()

        qkv = torch.cat([get(f"self_attn.{p}_proj.weight") for p in "qkv"])
        bias = qkv_bias(tensor, prefix, qkv.shape[0]).to(device=device, dtype=dtype)
        gate_up = torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")])
        return LayerWeights(ln1=get("input_layernorm.weight"), qkv_t=qkv.t().contiguous(), qkv_bias=bias,
                            o_t=get("self_attn.o_proj.weight").t().contiguous(),
                            ln2=get("post_attention_layernorm.weight"), gate_up_t=gate_up.t().contiguous(),
                            down_t=get("mlp.down_proj.weight").t().contiguous())

    def new_cache(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `length` positions: [layers, kv_heads, length, head_dim] each."""
        shape = (len(self.layers), self.kv_heads, length, self.head_dim)
        return (torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype))

    def _rope_tables(self, cfg, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos [max_len, D] and sin with rotate-half's sign folded in ([-sin, +sin] halves), in the model dtype
        (transformers computes them in fp32 and casts to the activations' dtype too)."""
        d = self.head_dim
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(cfg, d))
        cos, sin = freqs.cos(), freqs.sin()
        cos = torch.cat([cos, cos], dim=-1)
        signed_sin = torch.cat([-sin, sin], dim=-1)
        return (cos.to(device=self.device, dtype=self.dtype), signed_sin.to(device=self.device, dtype=self.dtype))

    # ---- one forward pass ------------------------------------------------------------------------------------

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, span: int,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Hidden states [T, H] (after the final norm) for `ids` [T] at `positions` [T]; writes their keys and
        values into the cache (`cache`, else this model's own) at those positions and attends over cache
        positions < `span` (a key at position p is seen by a query at q >= p only). Positions past the real
        sequence may hold stale keys: they are masked until overwritten, so padded prefills and over-long spans
        are safe."""
        if cache is None:
            if self.k_cache is None or self.v_cache is None:
                raise ValueError("this model keeps no cache of its own (own_cache=False): pass `cache`")
            cache = (self.k_cache, self.v_cache)
        k_cache, v_cache = cache
        x = self.embed.index_select(0, ids)
        cos, sin = self.cos.index_select(0, positions), self.sin.index_select(0, positions)
        keys = torch.arange(span, device=ids.device)
        allowed = keys[None, :] <= positions[:, None]  # [T, span]
        bias = torch.zeros(allowed.shape, device=ids.device, dtype=self.dtype).masked_fill_(~allowed, float("-inf"))
        bias = bias.repeat(self.group, 1)  # [G*T, span], rows g-major like the queries below
        for index, w in enumerate(self.layers):
            x = self._layer(x, w, k_cache[index], v_cache[index], positions, cos, sin, bias, span)
        return F.rms_norm(x, (self.hidden,), self.norm, self.eps)

    def forward_rows(self, ids: torch.Tensor, positions: torch.Tensor, span: int,
                     cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """One decode step of B independent sequences: hidden states [B, H] (after the final norm). Row r feeds
        ids[r] at positions[r] of sequence r, writes its key and value into cache[0][:, r] / cache[1][:, r]
        ([layers, B, kv, length, D] each, from `new_rows_cache` sliced to B) and attends over that sequence's
        positions <= positions[r] (all below `span`). A batch-1 step reads every weight once; B rows read them
        once too, so B sequences cost about what one does."""
        k_all, v_all = cache
        b = ids.shape[0]
        x = self.embed.index_select(0, ids)
        cos, sin = self.cos.index_select(0, positions), self.sin.index_select(0, positions)
        keys = torch.arange(span, device=ids.device)
        bias = torch.zeros((b, span), device=ids.device, dtype=self.dtype)
        bias = bias.masked_fill_(keys[None, :] > positions[:, None], float("-inf"))
        bias = bias[:, None, None, :].expand(b, self.kv_heads, self.group, span).reshape(-1, self.group, span)
        # where each row's new key goes: cache[row, head, positions[row]] (indices broadcast to [B, kv])
        where = (torch.arange(b, device=ids.device)[:, None], torch.arange(self.kv_heads, device=ids.device)[None, :],
                 positions[:, None])
        for index, w in enumerate(self.layers):
            x = self._row_layer(x, w, k_all[index], v_all[index], where, cos, sin, bias, span)
        return F.rms_norm(x, (self.hidden,), self.norm, self.eps)

    def prefill_rows(self, ids: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """P prompts side by side, each right-padded to S positions (ids [P, S], positions 0..S-1): hidden
        states [P * S, H] (after the final norm; prompt p's position t at row p * S + t). Writes their keys and
        values into cache[0] / cache[1] ([layers, P, kv, S, D] each). Attention is causal within each prompt,
        so a padded tail changes nothing before it (its stale keys sit past the real length: masked until
        overwritten, as in `forward`). One pass reads every weight once for all P prompts: a crowd's prompts
        cost about what one does."""
        p, s = ids.shape
        x = self.embed.index_select(0, ids.reshape(-1))
        cos, sin = self.cos[:s].repeat(p, 1), self.sin[:s].repeat(p, 1)
        steps = torch.arange(s, device=ids.device)
        bias = torch.zeros((s, s), device=ids.device, dtype=self.dtype)
        bias = bias.masked_fill_(steps[None, :] > steps[:, None], float("-inf")).repeat(self.group, 1)  # [G*S, S]
        k_all, v_all = cache
        for index, w in enumerate(self.layers):
            x = self._prefill_layer(x, w, k_all[index], v_all[index], cos, sin, bias, p)
        return F.rms_norm(x, (self.hidden,), self.norm, self.eps)

    def _prefill_layer_step(self, x: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, p: int) -> torch.Tensor:
        """One decoder layer for P prompts of S tokens (x [P*S, H]; caches [P, kv, S, D])."""
        d, kvh, g = self.head_dim, self.kv_heads, self.group
        s = x.shape[0] // p
        q, k, v = self._project(x, w, cos, sin)
        keys = k.view(p, s, kvh, d).transpose(1, 2)  # [P, kv, S, D]
        values = v.view(p, s, kvh, d).transpose(1, 2)
        k_cache.copy_(keys)
        v_cache.copy_(values)
        # per (prompt, kv head): its G query heads' S rows, g-major like the bias
        q = q.view(p, s, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(p * kvh, g * s, d)
        scores = torch.baddbmm(bias, q, keys.reshape(p * kvh, s, d).transpose(1, 2), alpha=d ** -0.5)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
        out = torch.bmm(probs, values.reshape(p * kvh, s, d))  # [P*kv, G*S, D]
        out = out.view(p, kvh, g, s, d).permute(0, 3, 1, 2, 4).reshape(p * s, self.heads * d)
        return self._mlp(torch.addmm(x, out, w.o_t), w)

    def new_rows_cache(self, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values for `rows` sequences of `length` positions: [layers, rows, kv, length, D]."""
        shape = (len(self.layers), rows, self.kv_heads, length, self.head_dim)
        return (torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype))

    def _row_layer_step(self, x: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        where: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                        span: int) -> torch.Tensor:
        """One decoder layer for B sequences of one token each (caches [B, kv, length, D])."""
        b, d, kvh = x.shape[0], self.head_dim, self.kv_heads
        q, k, v = self._project(x, w, cos, sin)
        k_cache.index_put_(where, k)
        v_cache.index_put_(where, v)
        # [B, kv, span, D] views whose first two dims merge: one batched matmul over every (row, kv head)
        keys = k_cache[:, :, :span].view(b * kvh, span, d)
        values = v_cache[:, :, :span].view(b * kvh, span, d)
        q = q.reshape(b * kvh, self.group, d)  # query head h reads kv head h // G
        scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=d ** -0.5)  # [B*kv, G, span]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
        out = torch.bmm(probs, values).view(b, self.heads * d)
        return self._mlp(torch.addmm(x, out, w.o_t), w)

    def _layer_step(self, x: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                    span: int) -> torch.Tensor:
        """One decoder layer: attention (writing this layer's cache, [kv, max_len, D] each) then the MLP."""
        return self._mlp(self._attention(x, w, k_cache, v_cache, positions, cos, sin, bias, span), w)

    def _project(self, x: torch.Tensor, w: LayerWeights, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries [T, heads, D] and keys [T, kv, D], and values [T, kv, D], for rows x [T, H]."""
        t, d, kvh = x.shape[0], self.head_dim, self.kv_heads
        h = F.rms_norm(x, (self.hidden,), w.ln1, self.eps)
        qkv = torch.addmm(w.qkv_bias, h, w.qkv_t)  # [T, (heads + 2 kv) * D]
        rotated = (self.heads + kvh) * d
        qk = qkv[:, :rotated].view(t, self.heads + kvh, d)
        # rotate_half(x) * sin == roll(x, D/2) * [-sin, sin]
        qk = torch.addcmul(qk * cos[:, None], torch.roll(qk, d // 2, dims=-1), sin[:, None])
        return qk[:, :self.heads], qk[:, self.heads:], qkv[:, rotated:].view(t, kvh, d)

    def _attention(self, x: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                   span: int) -> torch.Tensor:
        t, d, kvh = x.shape[0], self.head_dim, self.kv_heads
        q, k, v = self._project(x, w, cos, sin)
        k_cache.index_copy_(1, positions, k.transpose(0, 1))
        v_cache.index_copy_(1, positions, v.transpose(0, 1))
        keys, values = k_cache[:, :span], v_cache[:, :span]  # [kv, span, D]
        # grouped queries: the G query heads of one kv head become G*T rows against that head's keys
        q = q.reshape(t, kvh, self.group, d).permute(1, 2, 0, 3).reshape(kvh, self.group * t, d)
        scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=d ** -0.5)  # [kv, G*T, span]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
        out = torch.bmm(probs, values)  # [kv, G*T, D]
        out = out.view(kvh, self.group, t, d).permute(2, 0, 1, 3).reshape(t, self.heads * d)
        return torch.addmm(x, out, w.o_t)

    def _mlp(self, x: torch.Tensor, w: LayerWeights) -> torch.Tensor:
        h = F.rms_norm(x, (self.hidden,), w.ln2, self.eps)
        gate, up = torch.mm(h, w.gate_up_t).chunk(2, dim=-1)
        return torch.addmm(x, F.silu(gate) * up, w.down_t)

    # ---- the fused decode step (engine.backends.decode_kernels) ---------------------------------------------

    def forward_fused(self, ids: torch.Tensor, positions: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
                      plan: FusedPlan = FusedPlan()) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward_rows` in five or six kernels a layer instead of ~18 (engine.backends.decode_kernels; `plan`
        says which variant), for up to decode_kernels.MAX_ROWS rows. Returns the last layer's residual stream as
        two parts [B, H] whose sum is it, *before* the final norm: `logits_fused` adds them inside its first
        kernel, as every layer does with the one before it. Each row attends over its own positions <=
        positions[r], so the step needs no span bucket."""
        dk = decode_kernels
        k_all, v_all = cache
        launch = dict(pdl=plan.pdl)
        x, pending = self.embed.index_select(0, ids), None
        # the q/k/v kernel sums the down projection's partials where it preloads, at up to LATE_SUM_ROWS rows
        late_down = (plan.late_sum and ids.shape[0] <= dk.LATE_SUM_ROWS
                     and dk.preloads(plan.preload_tiling("qkv"), self.layers[0].qkv_t, ids.shape[0]))
        for index, w in enumerate(self._fused_weights(plan)):
            k_cache, v_cache = k_all[index], v_all[index]
            kw = dict(norm=w.ln1, eps=self.eps, bias=w.qkv_bias, tiling=TILINGS["qkv"],
                      preload=plan.preload_tiling("qkv"), **launch)
            if pending is None:
                qkv = dk.matmul(x, w.qkv_t, **kw)
            else:
                qkv, x = dk.add_matmul(x, pending, w.qkv_t, **kw)
            if plan.rope_in_attention:
                attention = dk.rope_attend(qkv, self.cos, self.sin, positions, k_cache, v_cache, self.heads,
                                           self.kv_heads, self.head_dim, pdl=plan.pdl, chunk=plan.attend_chunk,
                                           counts=self.counts, preload=plan.attend_preload)
            else:
                q = dk.rope_store(qkv, self.cos, self.sin, positions, k_cache, v_cache, self.heads, self.kv_heads,
                                  self.head_dim, pdl=plan.pdl)
                attention = dk.attend(q, k_cache, v_cache, positions, self.kv_heads, self.head_dim, pdl=plan.pdl,
                                      chunk=plan.attend_chunk, counts=self.counts)
            attended = self._fused_projection(attention, w.o_t, plan.o_split, "o", plan)
            act, x = dk.add_matmul(x, attended, w.gate_up_t, norm=w.ln2, eps=self.eps, swiglu=True,
                                   tiling=TILINGS["gate_up"], preload=plan.preload_tiling("gate_up"), **launch)
            pending = self._fused_projection(act, w.down_t, plan.down_split, "down", plan,
                                             late=late_down and index < len(self.layers) - 1)
        assert pending is not None  # a model has layers
        return x, pending

    def _fused_weights(self, plan: FusedPlan) -> list[LayerWeights]:
        """The layers as `plan` reads them: with k_major, the projections our kernels run are [N, K] copies (made
        on first use: another 0.7 GB for Spark's LLM), seen as [K, N]; cuBLAS's stay row-major [K, N]."""
        if not plan.k_major:
            return self.layers
        key = (plan.o_split > 0, plan.down_split > 0)
        if key not in self._k_major:
            def flip(t: torch.Tensor) -> torch.Tensor:
                return t.t().contiguous().t()

            self._k_major[key] = [replace(w, qkv_t=flip(w.qkv_t), gate_up_t=flip(w.gate_up_t),
                                          o_t=flip(w.o_t) if key[0] else w.o_t,
                                          down_t=flip(w.down_t) if key[1] else w.down_t) for w in self.layers]
        return self._k_major[key]

    def _fused_projection(self, x: torch.Tensor, w_t: torch.Tensor, split: int, name: str, plan: FusedPlan, *,
                          late: bool = False) -> torch.Tensor:
        """x @ w_t by cuBLAS (split 0) or by `matmul` with K split `split` ways; `late`: split
        K's unsummed partials [split, B, N] for the next kernel's `add` (FusedPlan.late_sum)."""
        if not split:
            return torch.mm(x, w_t)
        key = name if split == 1 else f"{name}_split"
        return decode_kernels.matmul(x, w_t, tiling=TILINGS[key], split_k=split, pdl=plan.pdl,
                                     preload=plan.preload_tiling(key), counts=self.counts, reduce=not late)

    def logits_fused(self, stream: tuple[torch.Tensor, torch.Tensor], head_t: torch.Tensor,
                     bias: torch.Tensor, plan: FusedPlan = FusedPlan()) -> torch.Tensor:
        """fp32 logits [B, A] = rms_norm(x) @ head_t + bias for the residual stream x from `forward_fused` (two
        parts) and output rows head_t [H, A] (the kernel reads W [K, N]: row-major, or the transposed view of the
        [A, H] rows, which suits a k_major plan)."""
        x, pending = stream
        return decode_kernels.add_matmul(x, pending, head_t, norm=self.norm, eps=self.eps, bias=bias,
                                         out_dtype=torch.float32, tiling=TILINGS["head"], pdl=plan.pdl,
                                         preload=plan.preload_tiling("head"))[0]

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Output-embedding rows [A, H] for vocabulary ids [A]: logits over those ids only."""
        return self.output.index_select(0, ids)
