"""Where the graph lane's decode step goes (GPU): kernel time vs the gaps between kernels, and the top kernels.

    python lab/lane_profile.py MODEL_DIR [--no-compile] [--span 512] [--steps 50] [--json OUT]

Also times the decode graph of every row count (1, 2, 4, 8 streams stepped at once) and the prefill graph of every
prompt count (1, 2, 4, 8 prompts side by side) at 64 and 128 positions.

Replays the captured one-row decode graph `--steps` times (wall per step from CUDA events), then runs the same step
eagerly under torch.profiler (same kernels, launched one by one) and sums the kernel durations per step. If the
kernel sum is close to the graph's step time, the kernels themselves are the cost (count x minimum duration, or
slow batch-1 GEMVs); if it is far below, launch gaps are. Prints the kernels by total time with their counts.
"""
from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from engine.backends.graph_gen import GraphLane
from engine.backends.lane_runner import LaneRunner
from engine.model import load_model_info
from engine.prompt import semantic_allowed_ids


def graph_step_ms(runner: LaneRunner, rows: int, span: int, steps: int) -> float:
    graph = runner.graphs[("decode", rows, span)]
    with torch.cuda.stream(runner.cuda_stream):
        _replay_steps(runner, graph, span, 5)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _replay_steps(runner, graph, span, steps)
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def _replay_steps(runner: LaneRunner, graph: torch.cuda.CUDAGraph, span: int, steps: int) -> None:
    """`steps` replays of a decode graph, each from the middle of its span (so that positions stay inside it)."""
    for _ in range(steps):
        runner.positions.fill_(span // 2)
        graph.replay()


def replay_ms(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    """ms per replay of `graph` on the current stream (one untimed replay first)."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def prefill_ms(runner: LaneRunner, batch: int, size: int, reps: int = 20) -> float:
    with torch.cuda.stream(runner.cuda_stream):
        return replay_ms(runner.graphs[("prefill", batch, size)], reps)


def eager_kernels(runner: LaneRunner, rows: int, span: int, steps: int) -> tuple[float, list[dict]]:
    with torch.cuda.stream(runner.cuda_stream), torch.inference_mode():
        for _ in range(3):
            runner.positions.fill_(span // 2)
            runner._decode_step(rows, span)  # noqa: SLF001
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                runner.positions.fill_(span // 2)
                runner._decode_step(rows, span)  # noqa: SLF001
            torch.cuda.synchronize()
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            totals[ev.name].append(ev.device_time_total)
    rows = sorted(({"kernel": name[:90], "per_step": round(len(t) / steps, 2), "us_per_step": round(sum(t) / steps, 1)}
                   for name, t in totals.items()), key=lambda r: -r["us_per_step"])
    return sum(r["us_per_step"] for r in rows) / 1e3, rows


def graph_critical_path(runner: LaneRunner, rows: int, span: int, steps: int = 30) -> dict[str, float]:
    """`critical_path_us` of the captured decode graph at `rows` (replays under the profiler: no host gaps, unlike
    an eager step's kernels, launched one by one from Python)."""
    prof = profiled_replays(runner, rows, span, steps)
    return critical_path_us(prof, steps, len(runner.model.layers), layer_roles(runner.plan))


def profiled_replays(runner: LaneRunner, rows: int, span: int, steps: int):
    """torch.profiler's record of `steps` replays of the captured decode graph at (rows, span), after 3 untimed."""
    graph = runner.graphs[("decode", rows, span)]
    with torch.cuda.stream(runner.cuda_stream):
        _replay_steps(runner, graph, span, 3)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _replay_steps(runner, graph, span, steps)
            torch.cuda.synchronize()
    return prof


def layer_roles(plan) -> tuple[str, ...]:
    """The fused step's kernels of one layer under `plan` (a decode_kernels.FusedPlan), in launch order."""
    return ("qkv", *(("attend",) if plan.rope_in_attention else ("rope", "attend")), "o", "gate_up", "down")


def critical_path_us(prof, steps: int, layers: int, roles: tuple[str, ...]) -> dict[str, float]:
    """us per step that each role of the fused step adds to the step's end: a kernel's end minus the end of the one
    before it (with PDL, kernels start early and wait, so their durations overlap; their ends do not). Roles: the
    layers' five kernels (from each step's first projection on), summed over layers; then "before" and "after"."""
    events = sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                    if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0)
    per_step = len(events) // steps
    first = next((i for i, ev in enumerate(events[:per_step]) if "matmul_kernel" in ev[2]), None)
    if first is None or len(events) % steps:
        return {"unreadable": float(len(events))}  # the profiler did not see each replay's kernels
    added: dict[str, float] = collections.defaultdict(float)
    for at in range(per_step, per_step * steps):  # from the second step: each kernel has one before it
        i = at % per_step - first
        role = "before" if i < 0 else roles[i % len(roles)] if i < len(roles) * layers else "after"
        added[role] += (events[at][1] - max(events[at - 1][1], events[at][0])) / (steps - 1)
    return {k: round(v, 1) for k, v in added.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--span", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    info = load_model_info(args.model)
    model = AutoModelForCausalLM.from_pretrained(str(info.llm_dir), dtype=torch.bfloat16)
    lane = GraphLane(model, info.token_ids, semantic_allowed_ids(info.token_ids), compile_layers=not args.no_compile)
    by_rows = {n: round(graph_step_ms(lane.runner, n, args.span, args.steps), 3) for n in lane.shapes.row_buckets}
    graph_ms = by_rows[1]
    prefills = {f"{batch}x{size}": round(prefill_ms(lane.runner, batch, size), 3)
                for size in (64, 128) for batch in lane.shapes.prefill_batches}
    kernel_ms, rows = eager_kernels(lane.runner, 1, args.span, args.steps)
    kernel_ms_8, rows_8 = eager_kernels(lane.runner, lane.rows, args.span, args.steps)
    out = {"device": torch.cuda.get_device_name(), "compiled": not args.no_compile, "span": args.span,
           "rows_step_ms": by_rows, "prefill_ms": prefills, "graph_step_ms": round(graph_ms, 3),
           "kernel_sum_ms_per_step": round(kernel_ms, 3),
           "kernels_per_step": round(sum(r["per_step"] for r in rows), 1), "top": rows[:25],
           f"kernel_sum_ms_per_step_{lane.rows}_rows": round(kernel_ms_8, 3), f"top_{lane.rows}_rows": rows_8[:25]}
    print(json.dumps({k: v for k, v in out.items() if not k.startswith("top")}))
    for name, listing in (("1 row", rows), (f"{lane.rows} rows", rows_8)):
        print(name)
        for r in listing[:16]:
            print(f"{r['us_per_step']:8.1f} us  x{r['per_step']:<6} {r['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
