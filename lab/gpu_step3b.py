"""Device probe: where Orpheus 3B's one-row decode step goes (the step every token of a lone stream's first window
waits for), and what its projections alone cost.

    python lab/gpu_step3b.py OUT.json [--parts step,start,compiled,gemm]

step: the lane as the factory builds it for Orpheus (tensor code, the penalty's ops captured), on a random Llama of
      Orpheus's full shapes in memory: the captured one-row step per span, its kernels from a profiled replay of the
      graph (count and time per step, the sum against the wall time per step: the rest is gaps), and the prefill of
      one prompt at each bucket.
compiled: the same lane with Inductor-compiled layers (rows 2, so few shapes compile): one-row step and kernels.
start: that lane driven as the engine drives it (GraphLane.stream): one stream alone, then 32 submitted at once; per
      stream the time from submission to its first token and to its 21st (an Orpheus first window), p50/p95. What
      the bench adds beyond these is the pipeline's own (text, prompt, decoder, delivery).
gemm: the 28 layers' four projections alone at one row, captured: as the lane lays its weights ([in, out]), as
      nn.Linear does ([out, in]), and with FP8 weights through torch._scaled_mm (padded to 16 rows); the floor
      the weights' bytes set at the card's bandwidth beside them.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_kernels_probe import timed  # noqa: E402 - lab/ beside this script
from gpu_lane3b import llama_3b  # noqa: E402
from lane_profile import graph_step_ms, prefill_ms, profiled_replays  # noqa: E402
from lane_trace import timeline  # noqa: E402


def save(out: dict, path: str) -> None:
    Path(path).write_text(json.dumps(out, indent=1))


def graph_kernels(runner, rows: int, span: int, steps: int = 30) -> dict:
    """Kernels of the captured decode graph at (rows, span), from profiled replays: per-step count and time each,
    their sum, and the busy time (union of kernel intervals) against the wall time per step."""
    prof = profiled_replays(runner, rows, span, steps)
    events = sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                    if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0)
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for start, end, name in events:
        totals[name].append(end - start)
    busy, reach = 0.0, None
    for start, end, _ in events:
        if reach is None or start >= reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    wall = (events[-1][1] - events[0][0]) / steps if events else 0.0
    top = sorted(({"kernel": name[:100], "per_step": round(len(t) / steps, 2), "us_per_step": round(sum(t) / steps, 1)}
                  for name, t in totals.items()), key=lambda r: -r["us_per_step"])
    return {"rows": rows, "span": span, "kernels_per_step": round(len(events) / steps, 1),
            "kernel_sum_us": round(sum(r["us_per_step"] for r in top), 1), "busy_us": round(busy / steps, 1),
            "wall_us": round(wall, 1), "top": top[:25]}


def lane_figures(out: dict, key: str, lane) -> None:
    runner = lane.runner
    out[key] = {"step_ms_1": {span: round(graph_step_ms(runner, 1, span, 100), 3) for span in lane.shapes.spans}}
    out[key]["kernels_1"] = graph_kernels(runner, 1, lane.shapes.spans[0])
    out[key]["prefill_ms_1"] = {size: round(prefill_ms(runner, 1, size), 2) for size in lane.shapes.prefills}


async def stream_times(lane, prompts, opts) -> list[tuple[float, float]]:
    """(ms to the first token, ms to the 21st) of each prompt, all submitted at once."""
    from engine.prompt import Prompt

    async def one(index: int, ids) -> tuple[float, float]:
        t0, got, first, window = time.perf_counter(), 0, float("nan"), float("nan")
        async for tokens in lane.stream(Prompt(ids=ids, allowed_ids=lane_allowed), opts, f"r{index}"):
            now = (time.perf_counter() - t0) * 1e3
            if got == 0:
                first = now
            got += len(tokens)
            if got >= 21:
                window = now
                break
        return first, window

    from engine.families.orpheus.grammar import OrpheusIds
    lane_allowed = OrpheusIds().audio_ids
    return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))


def start(out: dict, path: str, lane) -> None:
    from engine.families.orpheus import DEFAULT_SAMPLING

    opts = replace(DEFAULT_SAMPLING, max_tokens=64)
    gen = torch.Generator().manual_seed(0)

    def prompt() -> tuple[int, ...]:
        text = torch.randint(1000, 20000, (40,), generator=gen).tolist()
        return (128259, *text, 128009, 128260, 128261, 128257)

    res: dict = {}
    marks = timeline(lane)
    for label, count, rounds in (("1", 1, 6), ("32", 32, 3)):
        times = []
        for round_ in range(rounds):
            marks.clear()
            marks.append(("submit", time.perf_counter()))
            got = asyncio.run(stream_times(lane, [prompt() for _ in range(count)], opts))
            times += got
            t0 = marks[0][1]
            res.setdefault(f"timeline_{label}", []).append(
                {"first_ms": sorted(round(t[0], 1) for t in got), "window_ms": sorted(round(t[1], 1) for t in got),
                 "marks": [(name, round((t - t0) * 1e3, 2)) for name, t in marks[1:80]]})
        firsts, windows = sorted(t[0] for t in times), sorted(t[1] for t in times)
        pct = lambda xs, q: round(xs[min(len(xs) - 1, int(q / 100 * len(xs)))], 1)  # noqa: E731
        res[label] = {"first_token_ms_p50": pct(firsts, 50), "first_token_ms_p95": pct(firsts, 95),
                      "window_tokens_ms_p50": pct(windows, 50), "window_tokens_ms_p95": pct(windows, 95)}
    out["start"] = res
    print("start", json.dumps(res), flush=True)
    save(out, path)


def step(out: dict, path: str, model, parts: list[str]) -> None:
    from engine.backends.graph_gen import GraphLane
    from engine.families.orpheus.grammar import OrpheusIds

    ids = OrpheusIds()
    t0 = time.perf_counter()
    lane = GraphLane(model, ids, ids.audio_ids, rows=32, max_len=1024, fused=False, repetition_penalty=True)
    out["plain_start_s"] = round(time.perf_counter() - t0, 1)
    lane_figures(out, "plain", lane)
    print("plain", json.dumps({k: v for k, v in out["plain"].items() if k != "kernels_1"}), flush=True)
    save(out, path)
    if "start" in parts:
        start(out, path, lane)
    del lane
    torch.cuda.empty_cache()


def compiled(out: dict, path: str, model, parts: list[str]) -> None:
    from engine.backends.graph_gen import GraphLane
    from engine.families.orpheus.grammar import OrpheusIds

    ids = OrpheusIds()
    t0 = time.perf_counter()
    lane = GraphLane(model, ids, ids.audio_ids, rows=2, max_len=512, fused=False, compile_layers=True,
                     repetition_penalty=True)
    out["compiled_start_s"] = round(time.perf_counter() - t0, 1)
    lane_figures(out, "compiled", lane)
    print("compiled", json.dumps({k: v for k, v in out["compiled"].items() if k != "kernels_1"}), flush=True)
    save(out, path)
    del lane
    torch.cuda.empty_cache()


def gemm(out: dict, path: str, model, parts: list[str]) -> None:
    cfg = model.config
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    shapes = [(h, qkv), (h, h), (h, 2 * inter), (inter, h)]  # (in, out) of qkv, o, gate_up, down
    layers = cfg.num_hidden_layers
    nbytes = sum(k * n for k, n in shapes) * layers * 2
    res: dict = {"weight_gb": round(nbytes / 1e9, 2)}
    props = torch.cuda.get_device_properties(0)
    res["device"] = props.name
    with torch.inference_mode():
        w_in_out = [[torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02 for k, n in shapes]
                    for _ in range(layers)]
        x = {k: torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for k, _ in shapes}

        def lane_layout() -> None:
            for ws in w_in_out:
                for w in ws:
                    torch.mm(x[w.shape[0]], w)
        res["bf16_in_out_ms"] = round(timed(lane_layout), 3)
        w_out_in = [[w.t().contiguous() for w in ws] for ws in w_in_out]

        def linear_layout() -> None:
            for ws in w_out_in:
                for w in ws:
                    torch.nn.functional.linear(x[w.shape[1]], w)
        res["bf16_out_in_ms"] = round(timed(linear_layout), 3)
        save({**out, "gemm": res}, path)
        try:
            w8 = [[w.to(torch.float8_e4m3fn) for w in ws] for ws in w_out_in]
            x16 = {k: torch.randn(16, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
                   for k, _ in shapes}
            one = torch.ones((), device="cuda", dtype=torch.float32)

            def fp8() -> None:
                for ws in w8:
                    for w in ws:
                        torch._scaled_mm(x16[w.shape[1]], w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            res["fp8_m16_ms"] = round(timed(fp8), 3)
        except Exception as exc:  # noqa: BLE001 - a probe records what failed
            res["fp8_error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["gemm"] = res
    print("gemm", json.dumps(res), flush=True)
    save(out, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--parts", default="step,start,gemm,compiled")
    args = ap.parse_args()
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    model = llama_3b()
    parts = args.parts.split(",")
    for part in parts:
        if part == "start":
            continue  # within step, on its lane
        t0 = time.perf_counter()
        try:
            {"step": step, "compiled": compiled, "gemm": gemm}[part](out, args.out, model, parts)
        except Exception as exc:  # noqa: BLE001 - one part's failure leaves the others' figures
            out[f"{part}_error"] = f"{type(exc).__name__}: {exc}"[:500]
        out[f"{part}_s"] = round(time.perf_counter() - t0, 1)
        save(out, args.out)


if __name__ == "__main__":
    main()
