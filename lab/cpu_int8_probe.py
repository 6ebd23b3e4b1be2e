"""Probe: the LLM's batch-1 decode step on the CPU in fp32, bf16 and int8 weights, several runtimes, same process.

    python -m lab.cpu_int8_probe --model $MODEL --threads 2 --tokens 100 --out docs/lab/....json
    python -m lab.cpu_int8_probe --model $MODEL --quality 200 --options fp32,ort-int8   # + agreement

Each option steps a globals-prefixed prompt (lab.llm_agreement.SENTENCES[0]) and then `--tokens`
greedy ids, one at a time, with the restricted LM head (semantic + stop rows) as TorchTokenGenerator computes it;
tok/s is over the decode steps only. Options are measured round-robin (`--rounds`) so that a busy neighbour
slows all of them alike; the best round is kept. With `--quality N`, each int8 / bf16 option's next-token
distributions are compared with fp32 over 5 prompts x N positions (llm_agreement.compare).

Options: fp32 (StaticQwen2, today's CPU path) | bf16 (StaticQwen2 in bf16) | torch-int8pack (StaticQwen2's
projections as torch._weight_int8pack_mm: int8 weights, per-channel scales, bf16 activations) | torch-dynamic
(torch.ao quantize_dynamic's fbgemm kernels: int8 weights per channel, activations quantised per tensor) |
ort-fp32 (the same graph as ort-int8, MatMul in fp32, fp32 head) | ort-int8 (engine.backends.qwen2_ort: MatMulNBits,
8 bits, block 128, the head's rows too, fused ONNX Runtime operators) | ort-int8-unfused (the same weights in
the first graph, standard operators around MatMulNBits: lab/qwen2_ort_unfused.py) | ort-int8-fp32head (its head in
fp32) | ort-int8-b32 (block 32) |
ort-dynamic (MatMulIntegerToFloat: int8 weights per channel, activations quantised per tensor, as
onnxruntime.quantization.quantize_dynamic makes; fp32 head) | ort-int4 (MatMulNBits, 4 bits, block 32; ort-int4-b128:
block 128; both with each block's scale reaching its largest weight) | ort-int4-ships (what `--quantize int4` converts
to: block 128, each block's scale searched for the least error, qwen2_ort.quantize_blocks_4bit).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine.backends import qwen2_ort
from lab.llm_agreement import FULL_BOUND, compare, logits, real_prompts, reference_runs
from engine.backends.qwen2_checkpoint import Qwen2Weights
from engine.backends.qwen2_static import StaticQwen2
from lab.qwen2_ort_unfused import UnfusedOrtQwen2, build_unfused_model

OPTIONS = ("fp32", "bf16", "torch-int8pack", "torch-dynamic", "ort-fp32", "ort-int8", "ort-int8-unfused",
           "ort-int8-fp32head", "ort-int8-b32", "ort-dynamic", "ort-int4", "ort-int4-b128",
           "ort-int4-ships")
MAX_LEN = 4096


# ---- torch options: StaticQwen2 with its projections swapped ----------------------------------------------------

class QuantizedStatic(StaticQwen2):
    """StaticQwen2 whose four projections per layer are callables over quantised weights (`pack(w_t)`)."""

    def __init__(self, weights: Qwen2Weights, pack) -> None:
        super().__init__(weights, MAX_LEN, "cpu", torch.float32, own_cache=False)
        self.mm = [{name: pack(getattr(w, f"{name}_t")) for name in ("qkv", "o", "gate_up", "down")}
                   for w in self.layers]
        self.layers = [type(w)(ln1=w.ln1, qkv_t=torch.empty(0), qkv_bias=w.qkv_bias, o_t=torch.empty(0), ln2=w.ln2,
                               gate_up_t=torch.empty(0), down_t=torch.empty(0)) for w in self.layers]
        self._index = {id(w): i for i, w in enumerate(self.layers)}

    def _p(self, w, name: str):
        return self.mm[self._index[id(w)]][name]

    def _project(self, x, w, cos, sin):
        t, d, kvh = x.shape[0], self.head_dim, self.kv_heads
        h = F.rms_norm(x, (self.hidden,), w.ln1, self.eps)
        qkv = self._p(w, "qkv")(h) + w.qkv_bias
        rotated = (self.heads + kvh) * d
        qk = qkv[:, :rotated].view(t, self.heads + kvh, d)
        qk = torch.addcmul(qk * cos[:, None], torch.roll(qk, d // 2, dims=-1), sin[:, None])
        return qk[:, :self.heads], qk[:, self.heads:], qkv[:, rotated:].view(t, kvh, d)

    def _attention(self, x, w, k_cache, v_cache, positions, cos, sin, bias, span):
        t, d, kvh = x.shape[0], self.head_dim, self.kv_heads
        q, k, v = self._project(x, w, cos, sin)
        k_cache.index_copy_(1, positions, k.transpose(0, 1))
        v_cache.index_copy_(1, positions, v.transpose(0, 1))
        q = q.reshape(t, kvh, self.group, d).permute(1, 2, 0, 3).reshape(kvh, self.group * t, d)
        scores = torch.baddbmm(bias, q, k_cache[:, :span].transpose(1, 2), alpha=d ** -0.5)
        out = torch.bmm(torch.softmax(scores, dim=-1), v_cache[:, :span])
        return x + self._p(w, "o")(out.view(kvh, self.group, t, d).permute(2, 0, 1, 3).reshape(t, self.heads * d))

    def _mlp(self, x, w):
        gate, up = self._p(w, "gate_up")(F.rms_norm(x, (self.hidden,), w.ln2, self.eps)).chunk(2, dim=-1)
        return x + self._p(w, "down")(F.silu(gate) * up)


def int8pack(w_t: torch.Tensor):
    """torch._weight_int8pack_mm over w_t [K, N]: int8 [N, K], bf16 scale per output channel."""
    w = w_t.t().contiguous()
    scales = w.abs().amax(1).clamp_min(1e-12) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    scales = scales.to(torch.bfloat16)
    return lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), q, scales).float()


def fbgemm_dynamic(w_t: torch.Tensor):
    """torch.ao's dynamically quantised Linear (fbgemm: int8 weights per channel, uint8 activations per tensor)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    linear = torch.nn.Linear(w_t.shape[0], w_t.shape[1], bias=False)
    linear.weight.data = w_t.t().contiguous()
    return quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear: per_channel_dynamic_qconfig})[0]


# ---- ONNX Runtime options ------------------------------------------------------------------------------------

class DynamicInt8Builder(qwen2_ort.GraphBuilder):
    """Projections as MatMulIntegerToFloat after DynamicQuantizeLinear of the input (ORT's dynamic int8)."""

    def linear(self, x: str, w: torch.Tensor, name: str, bias: torch.Tensor | None = None) -> str:
        w_t = w.t().contiguous()  # [K, N]
        scales = (w_t.abs().amax(0).clamp_min(1e-12) / 127)
        codes = torch.round(w_t / scales).clamp(-127, 127).to(torch.int8).numpy()
        xq, xs, xz = self.op("DynamicQuantizeLinear", x, outputs=3)
        extra = [] if bias is None else [self.const(f"{name}.bias", bias)]
        return self.op("MatMulIntegerToFloat", xq, self.const(f"{name}.q", codes),
                       xs, self.const(f"{name}.s", scales.numpy()), xz,
                       self.const(f"{name}.z", np.zeros(w.shape[0], np.int8)), *extra, domain="com.microsoft")


class Int4Builder(qwen2_ort.GraphBuilder):
    """Projections as MatMulNBits of 4 bits, block `int4_block` (32 unless set; zero point 8), for comparison."""

    int4_block = 32

    def linear(self, x: str, w: torch.Tensor, name: str, bias: torch.Tensor | None = None) -> str:
        n, k = w.shape
        b = qwen2_ort.block_for(k, self.int4_block)
        blocks = w.float().reshape(n, k // b, b)
        scales = blocks.abs().amax(-1).clamp_min(1e-12) / 7
        codes = torch.round(blocks / scales[..., None]).clamp(-7, 7).add(8).to(torch.uint8)
        packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).numpy()
        extra = [] if bias is None else ["", "", self.const(f"{name}.bias", bias)]
        return self.op("MatMulNBits", x, self.const(f"{name}.q", packed),
                       self.const(f"{name}.scales", scales.reshape(-1).numpy()), *extra, domain="com.microsoft",
                       K=k, N=n, bits=4, block_size=b, accuracy_level=qwen2_ort.ACCURACY_LEVEL)


def ort_model(weights_dir: Path, work: Path, kind: str, threads: int) -> qwen2_ort.OrtQwen2:
    path = work / f"{kind}.onnx"
    quantize = {"ort-fp32": "none", "ort-int4-ships": "int4"}.get(kind, "int8")
    builder = {"ort-dynamic": DynamicInt8Builder, "ort-int4": Int4Builder, "ort-int4-b128": Int4Builder}.get(
        kind, lambda: None)()
    if kind == "ort-int4-b128":
        builder.int4_block = 128
    unfused = kind == "ort-int8-unfused"
    model = (build_unfused_model if unfused else qwen2_ort.build_model)(
        Qwen2Weights.from_checkpoint(weights_dir), quantize=quantize,
        block=32 if kind.endswith("b32") else qwen2_ort.BLOCK, builder=builder)
    path.write_bytes(model.SerializeToString())
    del model
    int8_head = kind in ("ort-int8", "ort-int8-unfused", "ort-int8-b32", "ort-int4", "ort-int4-b128",
                         "ort-int4-ships")
    runner = UnfusedOrtQwen2 if unfused else qwen2_ort.OrtQwen2
    return runner(path, Qwen2Weights.from_checkpoint(weights_dir), threads=threads, int8_head=int8_head)


def build(kind: str, llm_dir: Path, work: Path, threads: int):
    if kind.startswith("ort-"):
        return ort_model(llm_dir, work, kind, threads)
    weights = Qwen2Weights.from_checkpoint(llm_dir)
    if kind in ("fp32", "bf16"):
        return StaticQwen2(weights, MAX_LEN, "cpu", torch.float32 if kind == "fp32" else torch.bfloat16,
                           own_cache=False)
    return QuantizedStatic(weights, {"torch-int8pack": int8pack, "torch-dynamic": fbgemm_dynamic}[kind])


# ---- measuring -----------------------------------------------------------------------------------------------

@torch.inference_mode()
def decode_rate(model, prompt, tokens: int) -> tuple[float, float, list[int]]:
    """(decode tok/s, prefill + first token s, the greedy ids) of greedy steps with the restricted head."""
    allowed = torch.tensor(prompt.allowed_ids)
    head = model.head_rows(allowed)
    n = len(prompt.ids)
    cache = model.new_cache(n + tokens + 8)
    t0 = time.perf_counter()
    hidden = model.forward(torch.tensor(prompt.ids), torch.arange(n), n, cache)[-1]
    greedy = [int(allowed[logits(head, hidden).argmax()])]
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(tokens):
        pos = n + i
        hidden = model.forward(torch.tensor(greedy[-1:]), torch.tensor([pos]), pos + 1, cache)[0]
        greedy.append(int(allowed[logits(head, hidden).argmax()]))
    return tokens / (time.perf_counter() - t0), first, greedy


def same_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two greedy runs share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="checkpoint directory (voicectl model synth --size full)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--options", default=",".join(OPTIONS))
    ap.add_argument("--quality", type=int, default=0, metavar="N", help="positions per prompt for the agreement")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="torch.ao")  # quantize_dynamic's deprecation notice
    from tokenizers import Tokenizer

    from engine.tokens import TokenIds

    llm_dir = args.model / "LLM"
    tokenizer = Tokenizer.from_file(str(llm_dir / "tokenizer.json"))
    prompts = real_prompts(TokenIds(), lambda s: tokenizer.encode(s, add_special_tokens=False).ids)
    kinds = args.options.split(",")
    work = Path(tempfile.mkdtemp(prefix="int8-probe-"))
    models, results = {}, {}
    for kind in kinds:
        t0 = time.perf_counter()
        models[kind] = build(kind, llm_dir, work, args.threads)
        results[kind] = {"build_s": round(time.perf_counter() - t0, 1), "tok_s": [], "prefill_s": [], "load_1m": []}
        print(kind, "built in", results[kind]["build_s"], "s", flush=True)
    for _ in range(args.rounds):
        for kind in kinds:
            rate, first, greedy = decode_rate(models[kind], prompts[0], args.tokens)
            results[kind]["tok_s"].append(round(rate, 1))
            results[kind]["prefill_s"].append(round(first, 3))
            results[kind]["load_1m"].append(os.getloadavg()[0])
            results[kind]["greedy_same_as_first_option"] = same_prefix(greedy, results[kinds[0]].get("greedy", greedy))
            results[kind].setdefault("greedy", greedy)
            print(kind, f"{rate:.1f} tok/s, prefill {first * 1000:.0f} ms, greedy ids shared with {kinds[0]}: "
                  f"{results[kind]['greedy_same_as_first_option']} of {len(greedy)}", flush=True)
    if args.quality and "fp32" in models:
        runs = reference_runs(models["fp32"], prompts, args.quality)
        for kind in (k for k in kinds if k != "fp32"):
            t0 = time.perf_counter()
            measured = compare(models[kind], runs)
            results[kind]["agreement"] = {**measured.as_dict(), "within_full_bound": measured.within(FULL_BOUND)}
            print(kind, results[kind]["agreement"], f"{time.perf_counter() - t0:.0f} s", flush=True)
    for path in work.iterdir():
        path.unlink()
    work.rmdir()
    report = {"bound": FULL_BOUND, "threads": args.threads, "tokens": args.tokens, "prompt_tokens": len(prompts[0].ids),
              "torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
              "load_avg_1m": os.getloadavg()[0], "options": results}
    try:
        import onnxruntime

        report["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    print(json.dumps(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
