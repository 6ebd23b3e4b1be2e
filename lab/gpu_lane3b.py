"""Device probe: where Orpheus 3B's graph-lane step goes, SNAC in bf16, and both decoders at crowd batch sizes.

    python lab/gpu_lane3b.py OUT.json [--parts lane,sweep,snac,bicodec,penalty]

lane: a random Llama-3.2-3B (Orpheus's full shapes, in memory: no checkpoint) in the graph lane; model-only step
      time per FusedPlan variant at 1-16 rows (decode_kernels_probe.plan_steps), the tensor code's captured step
      (cuBLAS) per row bucket, and the kernels of the fastest plan's one-row step.
sweep: each projection at the 3B shapes per `matmul` tiling against cuBLAS (decode_kernels_probe.sweep).
snac: our SNAC (synthetic full weights) fp32 vs bf16: windows of the family's schedule against the fp32 one-shot
      decode (dB), and ms per window at batch 1-128 from captured graphs.
bicodec: Spark's BiCodec (synthetic full) ms per window at batch 16-128, fp32 and bf16, graphs.
penalty: what Orpheus's repetition penalty costs the lane: the 3B tensor-code step per row bucket captured without
      and with the penalty's ops (GraphLane `repetition_penalty`), and a seeded stream on each (at penalty 1.0 the
      penalised lane must draw the plain lane's tokens, at 1.3 others). Not in the default parts.
crowd: Orpheus's crowd lane as the factory sizes it on this GPU (ModelFamily.lane: rows of its longest sentence's
      positions at its memory share; penalty ops in): torch's total memory, the rows, the KV cache and the captured
      tensor-code step per row bucket (32 rows up) and attention span. A step attends over the span bucket of its
      busiest row, so the spans show what a crowd's longest sentence costs every row. Not in the default parts.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_kernels_probe import kernels, plan_steps, save, sweep  # noqa: E402 - lab/ beside this script
from lane_profile import graph_step_ms  # noqa: E402

from engine.backends import decode_kernels as dk  # noqa: E402


def llama_3b():
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.families.orpheus.synthetic import llm_config
    raw = {k: v for k, v in llm_config("full").items() if k not in ("architectures", "model_type", "torch_dtype")}
    cfg = LlamaConfig(**raw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


def lane(out: dict, path: str) -> None:
    from engine.backends.graph_gen import GraphLane
    from engine.families.orpheus.grammar import OrpheusIds

    model = llama_3b()
    ids = OrpheusIds()
    allowed = ids.audio_ids
    plans = {
        "ship": dk.PLAN,
        "no_preload": replace(dk.PLAN, preload=()),
        "preload_qkv": replace(dk.PLAN, preload=("qkv",)),
        "no_late_sum": replace(dk.PLAN, late_sum=False),
        "down4_o2": replace(dk.PLAN, down_split=4, o_split=2),
        "down16_o8": replace(dk.PLAN, down_split=16, o_split=8),
        "cublas_o_down": replace(dk.PLAN, o_split=0, down_split=0, late_sum=False, preload=("qkv",)),
        "row_major": replace(dk.PLAN, k_major=False, preload=()),
    }
    t0 = time.perf_counter()
    fused = GraphLane(model, ids, allowed, rows=16, max_len=1024, fused=True, fuse_rows=16)
    out["fused_lane_start_s"] = round(time.perf_counter() - t0, 1)
    out["fused_lane_step_ms"] = {n: round(graph_step_ms(fused.runner, n, 256, 50), 3)
                                 for n in fused.shapes.row_buckets}
    print("fused lane", out["fused_lane_step_ms"], flush=True)
    save(out, path)
    out["plans_us"] = plan_steps(fused.runner, (1, 2, 4, 8, 16), plans, positions=(128, 400))
    save(out, path)
    best = min((k for k, v in out["plans_us"].items() if "1@128" in v), key=lambda k: out["plans_us"][k]["1@128"])
    out["best_plan"] = best
    if best != "ship":
        fused.runner.plan = dk.plan_for(plans[best])
    out["kernels_ship_1"] = kernels(fused.runner, 1)
    save(out, path)
    del fused
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    plain = GraphLane(model, ids, allowed, rows=32, max_len=1024, fused=False)
    out["plain_lane_start_s"] = round(time.perf_counter() - t0, 1)
    out["plain_lane_step_ms"] = {n: round(graph_step_ms(plain.runner, n, 256, 50), 3)
                                 for n in plain.shapes.row_buckets}
    print("plain lane", out["plain_lane_step_ms"], flush=True)
    save(out, path)
    del plain, model
    torch.cuda.empty_cache()


def penalty(out: dict, path: str) -> None:
    from engine.backends.graph_gen import GraphLane
    from engine.config import SamplingOptions
    from engine.families.orpheus.grammar import OrpheusIds
    from engine.prompt import Prompt

    model = llama_3b()
    ids = OrpheusIds()
    prompt = Prompt(tuple(range(128000, 128040)), ids.audio_ids)
    opts = SamplingOptions(temperature=0.6, top_k=50, top_p=0.8, max_tokens=200, seed=3)

    async def tokens(lane: GraphLane, penalty: float) -> list[int]:
        stream = lane.stream(prompt, replace(opts, repetition_penalty=penalty), "p")
        return [t async for delta in stream for t in delta]

    steps, drawn = {}, {}
    for name, penalised in (("plain", False), ("penalised", True)):
        t0 = time.perf_counter()
        lane = GraphLane(model, ids, ids.audio_ids, rows=32, max_len=1024, fused=False, repetition_penalty=penalised)
        out[f"penalty_{name}_start_s"] = round(time.perf_counter() - t0, 1)
        steps[name] = {n: round(graph_step_ms(lane.runner, n, 256, 50), 3) for n in lane.shapes.row_buckets}
        drawn[name] = {p: asyncio.run(tokens(lane, p)) for p in ((1.0, 1.3) if penalised else (1.0,))}
        print("penalty", name, steps[name], flush=True)
        asyncio.run(lane.close())
        del lane
        torch.cuda.empty_cache()
    out["penalty_step_ms"] = steps
    out["penalty_extra_pct"] = {n: round(100 * (steps["penalised"][n] / steps["plain"][n] - 1), 1)
                                for n in steps["plain"]}
    out["penalty_same_tokens_at_1"] = drawn["penalised"][1.0] == drawn["plain"][1.0]
    out["penalty_other_tokens_at_1_3"] = drawn["penalised"][1.3] != drawn["plain"][1.0]
    save(out, path)
    del model
    torch.cuda.empty_cache()


def crowd(out: dict, path: str) -> None:
    from engine.backends.graph_gen import GraphLane, row_bytes, rows_for
    from engine.families import family
    from engine.families.orpheus.grammar import OrpheusIds

    model = llama_3b()
    ids, sizing = OrpheusIds(), family("orpheus").lane
    total = torch.cuda.get_device_properties(0).total_memory
    row = row_bytes(model.config, max_len=sizing.positions)
    rows = rows_for(total, row, share=sizing.memory_share)
    out.update(crowd_gpu_bytes=total, crowd_positions=sizing.positions, crowd_share=sizing.memory_share,
               crowd_rows=rows, crowd_kv_gb=round(rows * row / 1e9, 1))
    print("crowd lane", {k: v for k, v in out.items() if k.startswith("crowd_")}, flush=True)
    save(out, path)
    t0 = time.perf_counter()
    lane = GraphLane(model, ids, ids.audio_ids, rows=rows, max_len=sizing.positions, fused=False,
                     repetition_penalty=True)
    out["crowd_start_s"] = round(time.perf_counter() - t0, 1)
    out["crowd_peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
    steps: dict[str, float] = {}
    for n in (b for b in lane.shapes.row_buckets if b >= 32):
        for span in lane.shapes.spans:
            steps[f"{n}@{span}"] = round(graph_step_ms(lane.runner, n, span, 20), 3)
        print("crowd step ms", {k: v for k, v in steps.items() if k.startswith(f"{n}@")}, flush=True)
        out["crowd_step_ms"] = steps
        save(out, path)
    asyncio.run(lane.close())
    del lane, model
    torch.cuda.empty_cache()


def tiling_sweep(out: dict, path: str) -> None:
    from transformers import Qwen2Config

    from engine.families.orpheus.synthetic import llm_config
    raw = {k: v for k, v in llm_config("full").items() if k not in ("architectures", "model_type", "torch_dtype")}
    out["sweep_us"] = sweep(Qwen2Config(**raw), (1, 8))
    save(out, path)
    out["k_major_sweep_us"] = sweep(Qwen2Config(**raw), (1, 8), k_major=True)
    save(out, path)


def snac(out: dict, path: str, root: Path) -> None:
    from engine.families.orpheus.snac import SnacDecoder
    from engine.families.orpheus.synthetic import write_snac
    from engine.seams import seam_error_db
    from orpheus_snac_gpu import one_shot, window_ms, windowed
    from orpheus_snac_measure import random_frames as frames

    snac_dir = root / "snac"
    write_snac(snac_dir, "full", 0)
    ref = SnacDecoder(snac_dir, device="cuda", dtype=torch.float32)
    rows: dict = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        dec = SnacDecoder(snac_dir, device="cuda", dtype=dtype, max_batch=128)
        worst_seam, worst_snr = -999.0, 999.0
        for seed in range(3):
            codes = frames(120, seed)
            one, joined = one_shot(ref, codes), windowed(dec, codes)
            n = min(len(one), len(joined))
            worst_seam = max(worst_seam, seam_error_db(joined[:n], one[:n]))
            err = joined[:n].astype(np.float64) - one[:n]
            worst_snr = min(worst_snr, 10 * np.log10(np.sum(one[:n].astype(np.float64) ** 2) / np.sum(err ** 2)))
        row = {"seam_db_vs_fp32_oneshot": round(float(worst_seam), 1), "snr_db_vs_fp32": round(float(worst_snr), 1)}
        lengths, batches = (6, 13, 21, 37), (1, 16, 32, 64, 128)
        t0 = time.perf_counter()
        dec.warmup(lengths, batches)
        row["capture_s"] = round(time.perf_counter() - t0, 1)
        row["window_ms"] = {f"{length}x{batch}": round(window_ms(dec, length, batch), 2)
                            for length in lengths for batch in batches}
        rows[name] = row
        print("snac", name, row, flush=True)
        out["snac"] = rows
        save(out, path)
        del dec
        torch.cuda.empty_cache()


def bicodec(out: dict, path: str, root: Path) -> None:
    from engine.bench.decoder import decoder_speed
    from engine.synthetic.bicodec import write_bicodec

    write_bicodec(root, "full", 0)  # writes root/BiCodec
    # the busy schedule's window lengths (16 left + 16 new + 16 right, then longer) at crowd batches
    out["bicodec_speed"] = decoder_speed(root / "BiCodec", (48, 96), batches=(16, 64),
                                         dtypes=("fp32", "fp16", "bf16"), repeats=5)
    save(out, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--parts", default="lane,snac,bicodec,sweep")
    args = ap.parse_args()
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "pdl": dk.pdl_supported(), "plan": repr(dk.PLAN)}
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            t0 = time.perf_counter()
            try:
                if part == "lane":
                    lane(out, args.out)
                elif part == "sweep":
                    tiling_sweep(out, args.out)
                elif part == "snac":
                    snac(out, args.out, Path(tmp))
                elif part == "bicodec":
                    bicodec(out, args.out, Path(tmp))
                elif part == "penalty":
                    penalty(out, args.out)
                elif part == "crowd":
                    crowd(out, args.out)
            except Exception as err:  # noqa: BLE001 - one part failing must not lose the others
                out[f"{part}_error"] = f"{type(err).__name__}: {err}"[:600]
                print(part, "failed:", out[f"{part}_error"], flush=True)
            out[f"{part}_s"] = round(time.perf_counter() - t0, 1)
            print(part, "done in", out[f"{part}_s"], "s", flush=True)
            save(out, args.out)


if __name__ == "__main__":
    main()
