"""The fused decode kernels against the tensor-code step they replace (GPU; no vLLM, no checkpoint needed).

    python lab/decode_kernels_probe.py [--rows 8] [--max-len 1024] [--fuse-rows 16] [--json OUT] [--sweep]
                                           [--warps-sweep] [--no-attention]

On a random Qwen2 of Spark's full shapes, in one process:
1. the decode step's graph time per row count, tensor-code lane (compiled layers, as the factory builds it) vs
   fused lane, and each lane's start-up (graph capture and compiles);
2. their agreement on one step from the same caches (max |logit difference|, rows whose argmax agrees);
3. the kernel count and kernel time of one fused step (torch.profiler);
4. top-k over the padded head: one round (torch.topk) vs two (lane_runner.top_candidates);
5. attention: `attend` per block size / warps / pipelining depth against the tensor code's three kernels, over
   24 layers' caches;
6. with --sweep: every projection's time per `matmul` tiling, against cuBLAS, over as many weight copies as a
   step reads (so the L2 cache does not serve them); with --warps-sweep: warps and pipelining depth of the
   committed tilings.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import replace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.backends import decode_kernels as dk
from engine.backends.decode_kernels import TILINGS, FusedPlan, Tiling
from engine.backends.graph_gen import GraphLane
from engine.backends.lane_runner import CANDIDATES, LaneRunner, top_candidates
from engine.prompt import semantic_allowed_ids
from engine.synthetic.llm import llm_config
from engine.tokens import TokenIds
# lab/ is on sys.path when a script runs
from lane_profile import eager_kernels, graph_critical_path, graph_step_ms, replay_ms

SPAN = 256


def timed(fn, reps: int = 20, calls: int = 1) -> float:
    """ms per call of `fn` replayed from a CUDA graph (`calls` calls captured in it)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return replay_ms(graph, reps) / calls


def agreement(plain: LaneRunner, fused: LaneRunner, rows: int) -> dict:
    """One step of both lanes' models from the same caches, tokens and positions."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for a, b in ((plain.k_rows, fused.k_rows), (plain.v_rows, fused.v_rows)):
            a.copy_(torch.randn(a.shape, device="cuda", generator=gen, dtype=torch.float32).to(a.dtype) * 0.5)
            b.copy_(a)
        tokens = torch.tensor(plain.allowed_now[:rows], device="cuda")
        positions = torch.arange(rows, device="cuda") * 29 + 20  # below SPAN for 8 rows
        caches = lambda runner: (runner.k_rows[:, :rows], runner.v_rows[:, :rows])  # noqa: E731
        want = plain._logits(plain.model.forward_rows(tokens, positions, SPAN, caches(plain)))  # noqa: SLF001
        got = fused.model.logits_fused(fused.model.forward_fused(tokens, positions, caches(fused)), fused.head_t,
                                       fused.head_bias)
        width = len(plain.allowed_now)
        want, got = want[:, :width], got[:, :width]
    return {"max_abs_logit_diff": round((want - got).abs().max().item(), 4),
            "logit_scale": round(want.abs().max().item(), 3),
            "argmax_agree_rows": int((want.argmax(-1) == got.argmax(-1)).sum()), "rows": rows,
            "top64_overlap": round(sum(len(set(a.tolist()) & set(b.tolist())) for a, b in
                                       zip(want.topk(CANDIDATES).indices, got.topk(CANDIDATES).indices)) / rows, 1)}


def kernels(runner: LaneRunner, rows: int, steps: int = 20) -> dict:
    kernel_ms, top = eager_kernels(runner, rows, SPAN, steps)
    out = {"rows": rows, "kernels_per_step": round(sum(r["per_step"] for r in top), 1),
           "kernel_sum_ms_per_step": round(kernel_ms, 3), "top": top[:14]}
    if runner.fused:
        out["critical_path_us"] = graph_critical_path(runner, rows, SPAN)
    return out


def topk_ms(width: int) -> dict:
    out = {}
    for rows in (1, 8):
        logits = torch.randn(rows, width, device="cuda")
        out[f"one_round_{rows}"] = round(timed(lambda: torch.topk(logits, CANDIDATES, dim=-1), calls=24) * 1e3, 1)
        out[f"two_rounds_{rows}"] = round(timed(lambda: top_candidates(logits), calls=24) * 1e3, 1)
    return {"width": width, "us": out}


def sweep(cfg: Qwen2Config, rows_list: tuple[int, ...], tilings: dict | None = None, k_major: bool = False) -> dict:
    """Each projection: cuBLAS (the tensor code's GEMM) and every candidate tiling, per row count (us). k_major:
    our kernels read [N, K] weights (FusedPlan.k_major); o and down also split K 1, 2 and 4 ways."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    d = h // cfg.num_attention_heads
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    shapes = {"qkv": (h, qkv, dict(norm=True, bias=True)), "o": (h, h, dict()),
              "gate_up": (h, 2 * inter, dict(norm=True, swiglu=True)), "down": (inter, h, dict()),
              "head": (h, 8208, dict(norm=True, bias=True, fp32=True))}
    results: dict = {}
    for name, (k, n, flags) in shapes.items():
        if tilings is not None and name not in tilings:
            continue
        copies = max(24, (256 << 20) // (k * n * 2))
        weights = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        ours = [w.t().contiguous().t() for w in weights] if k_major else weights
        norm = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        out_n = n // 2 if flags.get("swiglu") else n
        bias = torch.zeros(out_n, device="cuda", dtype=torch.float32 if flags.get("fp32") else torch.bfloat16)
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            turn = itertools.cycle(weights)
            calls = len(weights)
            row: dict = {"cublas": round(timed(lambda: torch.mm(x, next(turn)), calls=calls) * 1e3, 2)}
            turn = itertools.cycle(ours)
            candidates = (tilings[name] if tilings is not None else
                          [Tiling(block_n=bn, block_k=bk) for bn, bk in itertools.product((16, 32, 64, 128),
                                                                                         (64, 128, 256))])
            splits = (1, 2, 4) if k_major and name in ("o", "down") else (1,)
            for t, split in itertools.product(candidates, splits):
                kw = dict(norm=norm if flags.get("norm") else None, eps=1e-6,
                          bias=bias if flags.get("bias") else None,
                          swiglu=bool(flags.get("swiglu")), out_dtype=torch.float32 if flags.get("fp32") else None,
                          tiling=t)
                if split > 1:
                    kw.update(split_k=split)
                try:
                    us = timed(lambda: dk.matmul(x, next(turn), **kw), calls=calls) * 1e3
                except Exception as err:  # noqa: BLE001 - a tiling the GPU cannot run (shared memory)
                    row[_key(t, split)] = f"error: {type(err).__name__}"
                    continue
                row[_key(t, split)] = round(us, 2)
            best = min((v, key) for key, v in row.items() if key != "cublas" and isinstance(v, float))
            row["best"] = {"tiling": best[1], "us": best[0]}
            results.setdefault(name, {})[rows] = row
            print(name, rows, "cublas", row["cublas"], "best", best, flush=True)
        del weights
        torch.cuda.empty_cache()
    return results


def _key(t: Tiling, split: int = 1) -> str:
    return f"{t.block_n}/{t.block_k}/{t.warps}/{t.stages}" + (f" split {split}" if split > 1 else "")


def attention(cfg: Qwen2Config) -> dict:
    """us per layer: `attend` per (block, warps, stages) and the tensor code (baddbmm, softmax, bmm over the span
    bucket), rows at `pos` of 24 layers' caches."""
    kv, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    heads, group, layers, length = cfg.num_attention_heads, cfg.num_attention_heads // kv, 24, 1024
    results = {}
    for rows, pos in ((1, 250), (1, 900), (8, 250)):
        k = torch.randn(layers, rows, kv, length, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(rows, heads * d, device="cuda", dtype=torch.bfloat16)
        positions = torch.full((rows,), pos, device="cuda")
        span = next(s for s in (128, 256, 512, 1024) if s > pos)
        bias = torch.zeros(rows * kv, group, span, device="cuda", dtype=torch.bfloat16)
        turn = itertools.cycle(range(layers))

        def plain():
            i = next(turn)
            keys, values = k[i, :, :, :span].reshape(rows * kv, span, d), v[i, :, :, :span].reshape(rows * kv, span, d)
            scores = torch.baddbmm(bias, q.view(rows * kv, group, d), keys.transpose(1, 2), alpha=d ** -0.5)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.bmm(probs, values)

        row = {"tensor_code": round(timed(plain, calls=layers) * 1e3, 2)}
        for block, warps, stages in itertools.product((32, 64, 128, 256), (2, 4, 8), (2, 3)):
            def fn(block=block, warps=warps, stages=stages):
                i = next(turn)
                return dk.attend(q, k[i], v[i], positions, kv, d, block=block, warps=warps, stages=stages)

            try:
                row[f"{block}/{warps}/{stages}"] = round(timed(fn, calls=layers) * 1e3, 2)
            except Exception as err:  # noqa: BLE001 - a shape the GPU cannot run
                row[f"{block}/{warps}/{stages}"] = f"error: {type(err).__name__}"
        best = min((val, key) for key, val in row.items() if key != "tensor_code" and isinstance(val, float))
        row["best"] = {"tiling": best[1], "us": best[0]}
        print("attention rows", rows, "pos", pos, "tensor code", row["tensor_code"], "best", best,
              "current", row.get(f"{dk.ATTEND_BLOCK}/4/3"), flush=True)
        results[f"{rows}x{pos}"] = row
    return results


_FAST = dict(pdl=True, k_major=True)
_RUN22 = dict(_FAST, o_split=4, down_split=8, attend_chunk=256)
PLANS = {
    "base": FusedPlan(),
    "pdl_k_major_o1": FusedPlan(**_FAST, o_split=1),
    "o1_down8": FusedPlan(**_FAST, o_split=1, down_split=8),
    "o4_down8": FusedPlan(**_FAST, o_split=4, down_split=8),
    "o4_down4": FusedPlan(**_FAST, o_split=4, down_split=4),
    "o4_down8_chunk128": FusedPlan(**_FAST, o_split=4, down_split=8, attend_chunk=128),
    "o4_down8_chunk256": FusedPlan(**_RUN22),
    "o1_down8_chunk128": FusedPlan(**_FAST, o_split=1, down_split=8, attend_chunk=128),
    "o4_down8_chunk256_rope_attend": FusedPlan(**_RUN22, rope_in_attention=True),
    "rope_attend_one_sample": FusedPlan(**_RUN22, rope_in_attention=True, one_sample=True),
    "one_sample_topk": FusedPlan(**_RUN22, rope_in_attention=True, one_sample=True, sample_topk=True),
    "preload_all": replace(dk.PLAN, preload=("qkv", "o", "gate_up", "down", "head")),
    "preload_small": replace(dk.PLAN, preload=("qkv", "o", "down", "head")),
    "preload_qkv_o": replace(dk.PLAN, preload=("qkv", "o")),  # PLAN
    "run28": replace(dk.PLAN, late_sum=False, attend_preload=False),  # PLAN as in run 28
    "attend_pre": replace(dk.PLAN, attend_preload=True),  # PLAN
    "before_attend_pre": replace(dk.PLAN, attend_preload=False),
    "no_late_sum": replace(dk.PLAN, late_sum=False),
    "pre_gate_up": replace(dk.PLAN, preload=("qkv", "o", "gate_up")),
    "pre_down10": replace(dk.PLAN, preload=("qkv", "o", "down"), down_split=10),
    "late_down4": replace(dk.PLAN, down_split=4),
    "late_down16": replace(dk.PLAN, down_split=16),
}
"""Variants of the fused step (decode_kernels.FusedPlan) timed side by side by --plans."""


def plan_steps(runner: LaneRunner, rows_list: tuple[int, ...], plans: dict[str, FusedPlan],
               positions: tuple[int, ...] = (128, 300, 600, 900)) -> dict:
    """us per fused step (model only: forward_fused + logits_fused, no sampling) of every plan, per rows and
    position, and each plan's logits against the base plan's from the same caches (8 rows at position 300)."""
    model, results, base = runner.model, {}, None
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode():
        for cache in (runner.k_rows, runner.v_rows):
            cache.copy_(torch.randn(cache.shape, device="cuda", generator=gen, dtype=torch.float32).to(cache.dtype))

    def step(plan, rows, pos):
        tokens = torch.tensor(runner.allowed_now[:rows], device="cuda")
        at = torch.full((rows,), pos, device="cuda")
        caches = (runner.k_rows[:, :rows], runner.v_rows[:, :rows])
        return lambda: model.logits_fused(model.forward_fused(tokens, at, caches, plan), runner.head_for(plan),
                                          runner.head_bias, plan)

    for name, plan in plans.items():
        row: dict = {}
        try:
            with torch.inference_mode():
                for rows in rows_list:
                    for pos in positions:
                        row[f"{rows}@{pos}"] = round(timed(step(plan, rows, pos), reps=50) * 1e3, 1)
                logits = step(plan, min(8, max(rows_list)), 300)()[:, :len(runner.allowed_now)]
                if base is None:
                    base = logits
                row["max_abs_diff_vs_base"] = round((logits - base).abs().max().item(), 4)
                row["argmax_agree_vs_base"] = int((logits.argmax(-1) == base.argmax(-1)).sum())
        except Exception as err:  # noqa: BLE001 - a variant this GPU or Triton cannot run
            row["error"] = f"{type(err).__name__}: {err}"[:400]
        results[name] = row
        print("plan", name, row, flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--warps-sweep", action="store_true")
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--fuse-rows", type=int, default=16)
    ap.add_argument("--plans", action="store_true",
                    help="only: time every FusedPlan variant, then a lane of the fastest (step, kernels)")
    ap.add_argument("--k-major-sweep", action="store_true", help="with --plans: then --sweep's tilings, k_major")
    ap.add_argument("--only", metavar="NAMES", help="with --plans: only these plans (comma-separated)")
    ap.add_argument("--lanes", metavar="NAMES",
                    help="only: lanes of these plans (comma-separated), their steps timed in turns, kernels listed; "
                         "and the sampling kernel's draws against the tensor code's. A name may end in "
                         "@projection:block_n:warps[:block_k] (repeatable): that preloading tiling instead; "
                         "@t.projection:block_n:block_k:warps:stages: that looped tiling (a TILINGS key)")
    ap.add_argument("--prefill", action="store_true",
                    help="only: two-row lanes (as `say` builds them) with eager vs Inductor-compiled prefills, "
                         "their start-up and prefill replay times")
    args = ap.parse_args()
    cfg = Qwen2Config(**{k: v for k, v in llm_config("full").items() if k not in ("architectures", "model_type")})
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "tilings": {k: _key(v) for k, v in TILINGS.items()}}
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = TokenIds()
    allowed = semantic_allowed_ids(ids)
    if args.plans:
        return probe_plans(model, ids, allowed, args, out)
    if args.lanes:
        return probe_lanes(model, ids, allowed, args, out)
    if args.prefill:
        return probe_prefill(model, ids, allowed, args, out)
    lanes = {}
    for name, fused, compiled in (("fused", True, False), ("plain_compiled", False, True)):
        t0 = time.perf_counter()
        lanes[name] = GraphLane(model, ids, allowed, rows=args.rows, max_len=args.max_len, compile_layers=compiled,
                                fused=fused, fuse_rows=args.fuse_rows)
        out[f"{name}_start_s"] = round(time.perf_counter() - t0, 1)
        out[f"{name}_step_ms"] = {n: round(graph_step_ms(lanes[name].runner, n, SPAN, 50), 3)
                                  for n in lanes[name].shapes.row_buckets}
        print(name, out[f"{name}_start_s"], out[f"{name}_step_ms"], flush=True)
        save(out, args.json)
    out["agreement"] = [agreement(lanes["plain_compiled"].runner, lanes["fused"].runner, n)
                        for n in (1, min(args.rows, 8))]
    out["fused_kernels"] = [kernels(lanes["fused"].runner, n) for n in (1, min(args.rows, 8))]
    out["topk"] = topk_ms(lanes["fused"].runner.head_width)
    save(out, args.json)
    if args.warps_sweep:
        variants = {name: [Tiling(t.block_n, t.block_k, warps, stages) for warps in (4, 8) for stages in (2, 3, 4, 5)]
                    for name, t in TILINGS.items()}
        out["warps_sweep_us"] = sweep(cfg, (1, 32), variants)
        save(out, args.json)
    if not args.no_attention:
        out["attention_us"] = attention(cfg)
        save(out, args.json)
    print(json.dumps({k: v for k, v in out.items() if k not in ("sweep_us", "fused_kernels", "attention_us")}))
    for listing in out["fused_kernels"]:
        print("fused step, rows", listing["rows"], listing["kernels_per_step"], "kernels",
              listing["kernel_sum_ms_per_step"], "ms")
        for r in listing["top"]:
            print(f"{r['us_per_step']:8.1f} us  x{r['per_step']:<6} {r['kernel']}")
    if args.sweep:
        del lanes, model
        torch.cuda.empty_cache()
        out["sweep_us"] = sweep(cfg, (1, 8))
        save(out, args.json)


def probe_plans(model, ids: TokenIds, allowed: tuple[int, ...], args, out: dict) -> None:
    lane = GraphLane(model, ids, allowed, rows=args.rows, max_len=args.max_len, fused=True, fuse_rows=args.fuse_rows,
                     plan=FusedPlan())
    out["pdl_supported"] = dk.pdl_supported()
    plans = {k: v for k, v in PLANS.items() if not args.only or k in args.only.split(",")}
    out["plans_us"] = plan_steps(lane.runner, tuple(n for n in (1, 2, 4, 8, 16) if n <= args.rows), plans)
    save(out, args.json)
    at = ("1@128", "1@300", "2@128", "2@300")  # a listener's sentences: one or two rows, positions ~100-350
    timed_ok = {k: sum(v[a] for a in at) for k, v in out["plans_us"].items() if all(a in v for a in at)}
    best = min(timed_ok, key=timed_ok.get)
    out["best_plan"] = best
    del lane
    torch.cuda.empty_cache()
    for name in dict.fromkeys(("base", best)):
        t0 = time.perf_counter()
        lane = GraphLane(model, ids, allowed, rows=args.rows, max_len=args.max_len, fused=True,
                         fuse_rows=args.fuse_rows, plan=PLANS[name])
        out[f"lane_{name}_start_s"] = round(time.perf_counter() - t0, 1)
        out[f"lane_{name}_step_ms"] = {n: round(graph_step_ms(lane.runner, n, SPAN, 50), 3)
                                       for n in lane.shapes.row_buckets}
        out[f"lane_{name}_kernels"] = [kernels(lane.runner, n) for n in (1, min(args.rows, 8))]
        print("lane", name, out[f"lane_{name}_start_s"], out[f"lane_{name}_step_ms"], flush=True)
        for listing in out[f"lane_{name}_kernels"]:
            print(" rows", listing["rows"], listing["kernels_per_step"], "kernels", listing["kernel_sum_ms_per_step"])
            for r in listing["top"]:
                print(f"  {r['us_per_step']:8.1f} us  x{r['per_step']:<6} {r['kernel']}")
        save(out, args.json)
        del lane
        torch.cuda.empty_cache()
    if args.k_major_sweep:
        cfg = model.config
        del model
        torch.cuda.empty_cache()
        out["k_major_sweep_us"] = sweep(cfg, (1, 8), k_major=True)
        save(out, args.json)


def probe_lanes(model, ids: TokenIds, allowed: tuple[int, ...], args, out: dict) -> None:
    """Lanes of the named plans side by side: each step time is the median of rounds taken in turns, so that a
    drifting clock or a neighbour's load falls on every plan alike."""
    lanes = {}
    saved, saved_looped = dict(dk.PRELOAD_TILINGS), dict(TILINGS)

    def tilings_of(name: str) -> str:
        """Sets the tilings a lane name asks for (the rest as saved); returns its plan's name."""
        base, *changes = name.split("@")  # plan@projection:block_n:warps...: other preloading tilings
        dk.PRELOAD_TILINGS.update(saved)
        TILINGS.update(saved_looped)
        for change in changes:
            if change.startswith("t."):  # t.projection:block_n:block_k:warps:stages: another looped tiling
                proj, *numbers = change[2:].split(":")
                TILINGS[proj] = Tiling(*map(int, numbers))
                continue
            proj, block_n, warps, *more = change.split(":")  # [:block_k]
            block_k = int(more[0]) if more else saved[proj].block_k
            dk.PRELOAD_TILINGS[proj] = Tiling(int(block_n), block_k, int(warps), saved[proj].stages)
        return base

    for name in args.lanes.split(","):
        t0 = time.perf_counter()
        base = tilings_of(name)
        lanes[name] = GraphLane(model, ids, allowed, rows=args.rows, max_len=args.max_len, fused=True,
                                fuse_rows=args.fuse_rows, plan=PLANS[base])  # captured now: the tilings stay
        out[f"lane_{name}_start_s"] = round(time.perf_counter() - t0, 1)
    rounds: dict[str, dict[int, list[float]]] = {name: {} for name in lanes}
    for _ in range(7):
        for name, lane in lanes.items():
            for n in lane.shapes.row_buckets:
                rounds[name].setdefault(n, []).append(graph_step_ms(lane.runner, n, SPAN, 50))
    for name, lane in lanes.items():
        out[f"lane_{name}_step_ms"] = {n: round(sorted(t)[len(t) // 2], 4) for n, t in rounds[name].items()}
        print("lane", name, out[f"lane_{name}_start_s"], out[f"lane_{name}_step_ms"], flush=True)
        save(out, args.json)
    for name, lane in lanes.items():
        tilings_of(name)  # the eager listing runs the lane's kernels again, with its tilings
        out[f"lane_{name}_kernels"] = [kernels(lane.runner, n) for n in (1, 2)]
        for listing in out[f"lane_{name}_kernels"]:
            print(name, "rows", listing["rows"], listing["kernels_per_step"], "kernels",
                  listing["kernel_sum_ms_per_step"], "critical path", listing.get("critical_path_us"))
            for r in listing["top"][:8]:
                print(f"  {r['us_per_step']:8.1f} us  x{r['per_step']:<6} {r['kernel']}")
        save(out, args.json)
    dk.PRELOAD_TILINGS.update(saved)
    TILINGS.update(saved_looped)
    width = next(iter(lanes.values())).allowed.numel()
    for topk in (False, True):
        out[f"sample_vs_pick{'_topk' if topk else ''}"] = found = sample_agreement(width, topk=topk)
        print("sample vs pick", found, flush=True)
    save(out, args.json)


def probe_prefill(model, ids: TokenIds, allowed: tuple[int, ...], args, out: dict) -> None:
    """A two-row lane as the factory builds it for one listener (compiled, fused), its prefills eager (built
    first, so it pays the fused kernels' compiles) and Inductor-compiled: start-up and ms per prefill replay."""
    for name, compiled in (("eager_prefill", False), ("compiled_prefill", True)):
        t0 = time.perf_counter()
        lane = GraphLane(model, ids, allowed, rows=2, max_len=args.max_len, compile_layers=True,
                         compile_prefill=compiled)
        out[f"{name}_start_s"] = round(time.perf_counter() - t0, 1)
        with torch.cuda.stream(lane.runner.cuda_stream):
            out[f"{name}_ms"] = {f"{b}x{n}": round(replay_ms(lane.runner.graphs[("prefill", b, n)], 20), 3)
                                 for b in lane.shapes.prefill_batches for n in lane.shapes.prefills}
        print(name, out[f"{name}_start_s"], out[f"{name}_ms"], flush=True)
        save(out, args.json)
        del lane
        torch.cuda.empty_cache()


def sample_agreement(width: int, rows: int = 16, trials: int = 64, topk: bool = False) -> dict:
    """decode_kernels.sample's draws against lane_runner.pick's on the GPU, same logits and noise (random logits
    of a trained model's spread, temperature 0.8, top-k 50, top-p 0.95, fresh noise each trial); then the
    kernel's time alone at 1, 2 and 16 rows (us)."""
    from engine.backends.lane_runner import pick

    g = torch.Generator(device="cuda").manual_seed(0)
    same = total = 0
    for _ in range(trials):
        logits = torch.randn(rows, width, device="cuda", generator=g) * 4
        noise = -torch.log(torch.empty(rows, 2, CANDIDATES, device="cuda").exponential_(generator=g))
        state = dk.StepState(temperature=torch.full((rows,), 0.8, device="cuda"),
                             top_k=torch.full((rows,), 50, device="cuda", dtype=torch.long),
                             top_p=torch.full((rows,), 0.95, device="cuda"), noise=noise,
                             allowed=torch.arange(width, device="cuda"),
                             tokens=torch.zeros(rows, device="cuda", dtype=torch.long),
                             steps=torch.zeros(rows, device="cuda", dtype=torch.long),
                             positions=torch.zeros(rows, device="cuda", dtype=torch.long),
                             ring=torch.zeros(4, rows, device="cuda", dtype=torch.long),
                             launch=torch.zeros(1, device="cuda", dtype=torch.long), max_len=1)
        want = pick(logits, state.temperature, state.top_k, state.top_p, noise[:, 0])
        counts = torch.zeros(rows + 1, device="cuda", dtype=torch.int32)
        dk.sample(logits, state, CANDIDATES, counts, topk=topk)
        same += int((state.tokens == want).sum())
        total += rows
    us = {n: round(1000 * timed(lambda n=n: dk.sample(logits[:n], state, CANDIDATES, counts, topk=topk), 20, 10), 1)
          for n in (1, 2, 16)}
    return {"same": same, "of": total, "topk": topk and dk.has_topk(), "kernel_us": us}


def save(out: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
