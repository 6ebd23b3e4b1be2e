"""Is a graph-lane row's arithmetic independent of its neighbours? (What a deterministic export on the lane needs.)

    python lab/lane_invariance_probe.py --model DIR --out results.json [--spans 1024,2048,4096]

Any family. On StaticQwen2's tensor code (no compile, no fused kernels), one decode step of 128 rows with random
caches and positions, then the same rows again with: another attention span, the rows in another order, fewer rows
beside them, other neighbours' contents. Each variant reports how many rows' hidden states are bitwise equal to the
reference. `by_span`: the variants at each span of --spans against that span's own reference (a fixed-shape lane
runs one span: what its determinism needs is this, not agreement across spans). Also prefills: one prompt alone against the same prompt packed with three others. Then the time of one
captured step at each (rows, span) a fixed-shape lane could use.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--spans", default="1024,2048,4096", help="spans whose own variants to check (default %(default)s)")
    p.add_argument("--rows", type=int, default=128, help="rows of the reference step (default %(default)s; the 3B's "
                   "cache is 8 times Spark's a row, and each variant copies it: 32 there)")
    args = p.parse_args()
    from engine.backends.qwen2_checkpoint import Qwen2Weights
    from engine.backends.qwen2_static import StaticQwen2
    from engine.families import detect

    info = detect(args.model).read(args.model)
    spans = [int(span) for span in args.spans.split(",")]
    model = StaticQwen2(Qwen2Weights.from_checkpoint(info.llm_dir), max(4096, *spans), "cuda", torch.bfloat16,
                        own_cache=False)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "family": info.family}
    with torch.inference_mode():
        result["decode"] = decode_variants(model, rows=args.rows)
        result["by_span"] = {span: decode_variants(model, span, args.rows) for span in spans}
        result["prefill"] = prefill_variants(model)
        result["step_ms"] = step_times(model)
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def decode_variants(model, span: int | None = None, rows: int = 128) -> dict:
    """Rows bitwise equal to a reference step of `rows` rows: with `span`, the variants at that span against its own
    reference; without, against span 1024, spans included."""
    g = torch.Generator(device="cuda").manual_seed(0)
    at = span or 1024
    k, v = model.new_rows_cache(rows, max(4096, at))
    k.normal_(generator=g)
    v.normal_(generator=g)
    ids = torch.randint(0, model.vocab_size, (rows,), device="cuda", generator=g)
    pos = torch.randint(20, 900, (rows,), device="cuda", generator=g)

    def step(order, n, span, cache=None):
        kk, vv = cache or (k.clone(), v.clone())
        sel = torch.tensor(order, device="cuda")
        kk, vv = kk[:, sel].contiguous(), vv[:, sel].contiguous()
        out = model.forward_rows(ids[sel][:n], pos[sel][:n], span, (kk[:, :n], vv[:, :n]))
        back = {int(r): out[i] for i, r in enumerate(order[:n])}
        return back

    base = step(list(range(rows)), rows, at)

    def same(other) -> str:
        hits = sum(bool(torch.equal(base[r], other[r])) for r in other)
        return f"{hits}/{len(other)}"

    out = {} if span else {"span2048": same(step(list(range(rows)), rows, 2048)),
                           "span4096": same(step(list(range(rows)), rows, 4096))}
    out.update({"reversed": same(step(list(range(rows))[::-1], rows, at)),
                "rows16": same(step(list(range(16)), 16, at)),
                "rows1": same(step([5], 1, at)),
                "repeat": same(step(list(range(rows)), rows, at))})
    k2, v2 = k.clone(), v.clone()
    k2[:, rows // 2:].normal_(generator=g)
    v2[:, rows // 2:].normal_(generator=g)
    other = step(list(range(rows)), rows, at, (k2, v2))
    out["other_neighbours_first_half"] = same({r: other[r] for r in range(rows // 2)})
    return out


def prefill_variants(model) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    prompts = torch.randint(0, model.vocab_size, (4, 128), device="cuda", generator=g)
    out = {}
    for size in (64, 128):
        one = model.prefill_rows(prompts[:1, :size], model.new_rows_cache(1, size))
        four = model.prefill_rows(prompts[:, :size], model.new_rows_cache(4, size))
        out[f"alone_vs_packed_{size}"] = bool(torch.equal(one, four[:size]))
    return out


def step_times(model) -> dict:
    times = {}
    for rows in (64, 128):
        k, v = model.new_rows_cache(rows, 4096)
        ids = torch.zeros(rows, dtype=torch.long, device="cuda")
        pos = torch.full((rows,), 500, dtype=torch.long, device="cuda")
        for span in (512, 1024, 2048, 4096):
            fn = lambda c=(k, v), s=span: model.forward_rows(ids, pos, s, c)  # noqa: E731
            fn()
            fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(50):
                graph.replay()
            torch.cuda.synchronize()
            times[f"{rows}x{span}"] = round((time.perf_counter() - t) / 50 * 1e3, 3)
            del graph
        del k, v
        torch.cuda.empty_cache()
    return times


if __name__ == "__main__":
    main()
