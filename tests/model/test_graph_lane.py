"""The graph lane's model and sampler on a tiny random Qwen2 (CPU, eager: the same code the GPU captures).

StaticQwen2 == transformers' Qwen2 (logits, padded prefill, cached decode); the lane's greedy stream == the torch
generator's; seeded sampling is reproducible and draws from the top-k/top-p distribution; stops, limits, abort,
and the router's choice between the lane and the other generator.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.backends import decode_kernels
from engine.backends.decode_kernels import FusedPlan
from engine.backends.graph_gen import GraphLane, LaneRouter
from engine.backends.lane_runner import CANDIDATES, TOPK_CHUNKS, gumbel, pick, top_candidates
from engine.backends.qwen2_static import StaticQwen2
from engine.backends.torch_gen import TorchTokenGenerator, repetition_penalty, top_k_top_p
from engine.config import SamplingOptions, request_of, sentence_id
from engine.errors import GenerationError
from engine.fakes import ScriptedGenerator
from engine.pacing import Pacer
from engine.lane_scheduler import BURST, CROWD_BURSTS, bucket
from engine.prompt import Prompt, semantic_allowed_ids
from engine.tokens import SEMANTIC_CODEBOOK, TokenIds
from tests.lane_helpers import arriving_together

IDS = TokenIds()
SEMANTIC_ONLY = tuple(range(IDS.semantic_base, IDS.semantic_base + SEMANTIC_CODEBOOK))
PROMPT = Prompt((IDS.structural["task_tts"], IDS.structural["start_content"], 9906, 11, 1879, 13,
                 IDS.structural["end_content"], IDS.structural["start_semantic_token"]), SEMANTIC_ONLY)


def _qwen(seed: int, hidden: int, intermediate: int) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 with Spark's vocabulary, 4 query heads and 2 kv heads."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=166000, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=intermediate, tie_word_embeddings=True,
                         initializer_range=0.2)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return _qwen(0, 32, 64)


@pytest.fixture(scope="module")
def lane(model):
    return GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256)


async def collect(gen, prompt: Prompt, opts: SamplingOptions, rid: str = "r") -> list[int]:
    return [t async for delta in gen.stream(prompt, opts, rid) for t in delta]


def test_static_model_matches_transformers(model) -> None:
    static = StaticQwen2(model, 64, "cpu", torch.float32)
    seq = torch.tensor(PROMPT.ids + (IDS.semantic_base + 5, IDS.semantic_base + 77, IDS.semantic_base + 3))
    n = len(PROMPT.ids)
    with torch.inference_mode():
        ref = model(seq[None]).logits[0]
        padded = torch.cat([seq[:n], torch.zeros(16 - n, dtype=torch.long)])  # prefill padded to a bucket
        ours = [static.forward(padded, torch.arange(16), 16)[:n] @ static.output.T]
        for i in range(n, len(seq)):  # decode steps overwrite the padding's stale cache entries
            ours.append(static.forward(seq[i:i + 1], torch.tensor([i]), 32) @ static.output.T)
    torch.testing.assert_close(torch.cat(ours), ref, atol=1e-4, rtol=1e-4)
    assert static.output is static.embed  # tied embeddings: one copy on the device, not two


def test_prompts_prefilled_side_by_side_match_each_alone(model) -> None:
    """prefill_rows over three right-padded prompts of different lengths == each prompt's own forward: hidden
    states at the real positions, and the keys and values each leaves in its cache."""
    static = StaticQwen2(model, 64, "cpu", torch.float32)
    prompts = [PROMPT.ids, PROMPT.ids[:3], PROMPT.ids[:2] + (9906,) * 9 + PROMPT.ids[-2:]]
    size = 16
    ids = torch.zeros(len(prompts), size, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    with torch.inference_mode():
        cache = static.new_rows_cache(len(prompts), size)
        together = static.prefill_rows(ids, cache).view(len(prompts), size, -1)
        for i, p in enumerate(prompts):
            own = static.new_cache(size)
            alone = static.forward(torch.tensor(p), torch.arange(len(p)), size, cache=own)
            torch.testing.assert_close(together[i, :len(p)], alone, atol=1e-5, rtol=1e-5)
            for got, want in zip(cache, own):
                torch.testing.assert_close(got[:, i, :, :len(p)], want[:, :, :len(p)], atol=1e-5, rtol=1e-5)


async def test_a_crowd_arriving_at_once_is_prefilled_in_few_launches(model, monkeypatch) -> None:
    """Seven requests at once on an eight-row lane: prefilled as 4 + 2 + 1 prompts (shortest first), and each
    gets exactly its lone tokens, greedy and seeded (the scheduler's side: tests/pure/test_lane_scheduler.py)."""
    lane = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256,
                     rows=8)
    prompts = [Prompt(PROMPT.ids[:2] + (9906 + 5 * i,) * (1 + 6 * i) + PROMPT.ids[-2:], SEMANTIC_ONLY)
               for i in range(7)]  # 5..41 ids: buckets 32 and 64 in one admission
    opts = [SamplingOptions(temperature=0, max_tokens=30 + 5 * i) if i % 2 else
            SamplingOptions(max_tokens=40, seed=i) for i in range(7)]
    alone = [await collect(lane, p, o, f"a{i}") for i, (p, o) in enumerate(zip(prompts, opts))]
    prefills = []
    prefill = lane.runner.prefill

    def counted(rows, prompts, options, size) -> None:
        prefills.append((len(prompts), size))
        prefill(rows, prompts, options, size)

    monkeypatch.setattr(lane.runner, "prefill", counted)
    together = await arriving_together(lane, monkeypatch, PROMPT, lambda: asyncio.gather(
        *(collect(lane, p, o, f"t{i}") for i, (p, o) in enumerate(zip(prompts, opts)))), len(prompts))
    assert together == alone and all(len(t) == o.max_tokens for t, o in zip(alone, opts))
    assert prefills == [(1, 32), (4, 32), (2, 64), (1, 64)]  # the first holds the lane until all seven wait
    await lane.close()


async def test_greedy_stream_equals_the_torch_generator(model, lane) -> None:
    opts = SamplingOptions(temperature=0, max_tokens=40)
    ref_gen = TorchTokenGenerator(model, IDS, device="cpu")
    try:
        ref = await collect(ref_gen, PROMPT, opts)
    finally:
        await ref_gen.close()
    ours = await collect(lane, PROMPT, opts)
    assert ours == ref and len(ours) == 40 and len(set(ours)) > 1


async def test_spans_and_prefill_buckets_are_crossed(model) -> None:
    """A prompt padded into a larger bucket and a stream that crosses two span buckets still match."""
    small = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=1024)
    opts = SamplingOptions(temperature=0, max_tokens=300)  # 8 + 300 positions: spans 128, 256, 512
    ref_gen = TorchTokenGenerator(model, IDS, device="cpu")
    try:
        ref = await collect(ref_gen, PROMPT, opts)
    finally:
        await ref_gen.close()
    assert await collect(small, PROMPT, opts) == ref
    await small.close()


async def test_seeded_sampling_is_reproducible(lane) -> None:
    a = await collect(lane, PROMPT, SamplingOptions(max_tokens=30, seed=7))
    b = await collect(lane, PROMPT, SamplingOptions(max_tokens=30, seed=7))
    c = await collect(lane, PROMPT, SamplingOptions(max_tokens=30, seed=8))
    assert a == b and a != c
    assert all(IDS.semantic_index(t) is not None for t in a)


def test_pick_draws_from_the_top_k_top_p_distribution() -> None:
    torch.manual_seed(1)
    logits = torch.randn(500) * 2
    temperature, top_k, top_p = 0.8, 50, 0.7
    values, ids = top_k_top_p(logits / temperature, top_k, top_p)  # the torch generator's candidates
    expected = dict(zip(ids.tolist(), torch.softmax(values, -1).tolist()))
    draws = 20000
    noise = gumbel(draws, CANDIDATES, 3, torch.device("cpu"))
    args = (torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]))
    counts = Counter(int(pick(logits[None], *args, noise[i][None])) for i in range(draws))
    assert set(counts) <= set(expected)  # nothing outside top-k/top-p, ever
    for token, p in expected.items():
        sigma = math.sqrt(p * (1 - p) / draws)
        assert abs(counts[token] / draws - p) < 5 * sigma + 1e-3, (token, counts[token] / draws, p)


def test_pick_with_no_noise_is_greedy() -> None:
    logits = torch.randn(300)
    args = (torch.tensor([1.0]), torch.tensor([1]), torch.tensor([1.0]))
    assert int(pick(logits[None], *args, torch.zeros(1, CANDIDATES))) == int(torch.argmax(logits))


async def test_stops_at_a_stop_id_and_at_max_tokens(lane) -> None:
    stop = min(IDS.stop_ids)
    only_stop = Prompt(PROMPT.ids, (stop,))  # padding rows of the head are -inf: the stop is the only choice
    assert await collect(lane, only_stop, SamplingOptions(max_tokens=50, seed=0)) == [stop]
    assert len(await collect(lane, PROMPT, SamplingOptions(max_tokens=7, seed=1))) == 7
    # the head is switched back to the semantic ids for the next request
    assert all(IDS.semantic_index(t) is not None for t in await collect(lane, PROMPT, SamplingOptions(max_tokens=9)))


async def test_supports_only_what_the_graphs_hold(lane) -> None:
    assert lane.supports(PROMPT, SamplingOptions(max_tokens=100))
    assert not lane.supports(Prompt(PROMPT.ids, None), SamplingOptions())  # needs an allowed set
    assert not lane.supports(PROMPT, SamplingOptions(top_k=0))  # all-vocabulary sampling
    assert not lane.supports(PROMPT, SamplingOptions(top_k=CANDIDATES + 1))
    assert lane.supports(PROMPT, SamplingOptions(temperature=0, top_k=0, max_tokens=100))  # greedy ignores top-k
    assert not lane.supports(PROMPT, SamplingOptions(max_tokens=256))  # prompt + tokens over max_len
    assert not lane.supports(Prompt(tuple(range(600)), SEMANTIC_ONLY), SamplingOptions(max_tokens=10))
    with pytest.raises(ValueError):
        await collect(lane, PROMPT, SamplingOptions(top_k=0, max_tokens=100))


async def test_a_sentence_longer_than_a_row_is_refused_by_name_and_runs_behind_the_lane(lane) -> None:
    fits, over = SamplingOptions(max_tokens=256 - len(PROMPT.ids)), SamplingOptions(max_tokens=257 - len(PROMPT.ids))
    assert lane.supports(PROMPT, fits) and not lane.supports(PROMPT, over)
    with pytest.raises(ValueError, match="a prompt of 8 ids and a budget of 249 tokens need 257 positions; its "
                                         "rows hold 256"):
        await collect(lane, PROMPT, over)
    assert not lane.scheduler.jobs  # nothing was queued, so nothing stepped past a row's cache
    other = ScriptedGenerator(IDS)
    router = LaneRouter(other, lane, others_limit=None, handoff_at=None, overflow=False)  # a crowd's lane
    assert len(await collect(router, PROMPT, over, "long-0")) == over.max_tokens  # its whole budget, elsewhere
    assert router.lane_streams == 0 and other.started == ["long-0"]


async def test_leaving_the_stream_aborts_the_job(lane, monkeypatch) -> None:
    steps = []
    decode = lane.runner.decode

    def slow_decode(rows: int, span: int) -> None:  # 200 steps take over a second: an abort must cut them short
        steps.append(span)
        time.sleep(0.005)
        decode(rows, span)

    monkeypatch.setattr(lane.runner, "decode", slow_decode)
    got = []
    async for delta in lane.stream(PROMPT, SamplingOptions(max_tokens=200, seed=2), "early"):
        got += delta
        break
    for _ in range(200):
        if lane.load == 0:
            break
        await asyncio.sleep(0.01)
    assert lane.load == 0 and len(got) < 200
    assert len(steps) < 50  # the job stopped within a few bursts of the consumer leaving, not after 199 steps


async def test_the_lane_reads_back_its_bursts_steps_at_a_time(lane) -> None:
    """`bursts` sets the steps between read-backs (the bench's burst4 variant): after the prefill's first token,
    a lone stream's tokens arrive in deliveries of that many; the same tokens either way."""
    async def deltas(opts: SamplingOptions) -> list[list[int]]:
        return [list(d) async for d in lane.stream(PROMPT, opts, "b")]

    opts = SamplingOptions(max_tokens=21, seed=3)
    default = await deltas(opts)
    lane.bursts = ((8, 5), (None, 8))
    try:
        fives = await deltas(opts)
    finally:
        lane.bursts = CROWD_BURSTS
    assert [len(d) for d in fives] == [1, 5, 5, 5, 5]
    assert [len(d) for d in default] == [1] + [BURST] * (20 // BURST)
    assert sum(fives, []) == sum(default, [])
    assert lane.busy_ms == lane.idle_ms == 0.0  # timed on CUDA only


async def test_streams_side_by_side_get_what_each_gets_alone(model, monkeypatch) -> None:
    """Five requests on a lane of two rows: they share steps (rows at different positions and spans, rows freed
    and refilled mid-run) and each gets exactly its lone tokens, greedy and seeded."""
    lane = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=512,
                     rows=2)
    prompts = [Prompt(PROMPT.ids[:2] + (9906 + 7 * i,) * (1 + 3 * i) + PROMPT.ids[-2:], SEMANTIC_ONLY)
               for i in range(5)]
    opts = [SamplingOptions(temperature=0, max_tokens=40 + 60 * i) if i % 2 else
            SamplingOptions(max_tokens=150 - 20 * i, seed=i) for i in range(5)]
    alone = [await collect(lane, p, o, f"a{i}") for i, (p, o) in enumerate(zip(prompts, opts))]
    steps = []
    decode = lane.runner.decode

    def counted(rows: int, span: int) -> None:
        steps.append(rows)
        decode(rows, span)

    monkeypatch.setattr(lane.runner, "decode", counted)
    together = await asyncio.gather(*(collect(lane, p, o, f"t{i}") for i, (p, o) in enumerate(zip(prompts, opts))))
    assert together == alone and [len(t) for t in alone] == [o.max_tokens for o in opts]
    assert max(steps) == 2 and len(steps) < sum(len(t) for t in alone) - 5  # rows really shared steps
    assert lane.load == 0 and lane.scheduler.row_jobs == [None, None]
    await lane.close()


async def test_a_fixed_shape_lane_runs_one_decode_shape_and_one_prompt_per_prefill(model, monkeypatch) -> None:
    """fixed_shapes: whatever rows are busy and however long the sequences, every decode step is (rows, max_len) and
    every prefill one prompt; each request still gets its lone tokens in company, in any order."""
    lane = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=384,
                     rows=3, fixed_shapes=True)
    prompts = [Prompt(PROMPT.ids[:2] + (9906 + 5 * i,) * (2 + 4 * i) + PROMPT.ids[-2:], SEMANTIC_ONLY)
               for i in range(5)]
    opts = [SamplingOptions(max_tokens=30 + 25 * i, seed=10 + i) for i in range(5)]
    alone = [await collect(lane, p, o, f"a{i}") for i, (p, o) in enumerate(zip(prompts, opts))]
    shapes = []
    prefill, decode = lane.runner.prefill, lane.runner.decode

    def prefilled(rows, prompts, options, size) -> None:
        shapes.append(("prefill", len(prompts), size))
        prefill(rows, prompts, options, size)

    def decoded(rows: int, span: int) -> None:
        shapes.append(("decode", rows, span))
        decode(rows, span)

    monkeypatch.setattr(lane.runner, "prefill", prefilled)
    monkeypatch.setattr(lane.runner, "decode", decoded)
    forward = await asyncio.gather(*(collect(lane, p, o, f"f{i}") for i, (p, o) in enumerate(zip(prompts, opts))))
    backward = await asyncio.gather(*(collect(lane, p, o, f"b{i}") for i, (p, o) in
                                      reversed(list(enumerate(zip(prompts, opts))))))
    assert forward == alone and backward == alone[::-1]
    assert {s for s in shapes if s[0] == "decode"} == {("decode", 3, 384)}
    assert {s[1] for s in shapes if s[0] == "prefill"} == {1}
    await lane.close()


async def test_a_chain_of_fixed_lanes_routes_by_the_request_alone(model) -> None:
    """A request takes the first lane whose positions hold its prompt and budget, else the fallback, however busy
    the lanes are; `lane_rows` counts every lane of the chain."""
    from engine.factory import fixed_lane_chain, lane_rows

    short, long = (GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=n,
                             rows=r, fixed_shapes=True) for n, r in ((64, 3), (160, 2)))
    fallback = ScriptedGenerator(IDS, delay_s=0.001)
    chain = fixed_lane_chain(fallback, [short, long])
    budgets = [20, 100, 200, 30, 120]  # prompt (8 ids) + budget: short lane, long lane, neither, short, long
    got = await asyncio.gather(*(collect(chain, PROMPT, SamplingOptions(max_tokens=n, seed=i), f"r{i}-0")
                                 for i, n in enumerate(budgets)))
    assert [len(g) for g in got] == budgets and fallback.started == ["r2-0"]
    assert (short.served, long.served) == (2, 2) and lane_rows(chain) == 5
    await chain.close()


async def test_a_chain_that_fits_budgets_keeps_every_prompt_it_holds_on_its_longest_lane(model) -> None:
    """fit_budget (Orpheus's export): a budget past the long lane's positions runs there, cut to fit; a short budget
    still takes the short lane, and only a prompt no lane holds reaches the fallback."""
    from engine.factory import fixed_lane_chain

    short, long = (GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=n,
                             rows=r, fixed_shapes=True) for n, r in ((64, 3), (160, 2)))
    fallback = ScriptedGenerator(IDS, delay_s=0.001)
    chain = fixed_lane_chain(fallback, [short, long], fit_budget=True)
    budgets = [20, 100, 200, 500]  # prompt (8 ids) + budget: short lane, long lane, long lane cut to 152 (twice)
    got = await asyncio.gather(*(collect(chain, PROMPT, SamplingOptions(max_tokens=n, seed=i), f"r{i}-0")
                                 for i, n in enumerate(budgets)))
    assert [len(g) for g in got] == [20, 100, 160 - len(PROMPT.ids), 160 - len(PROMPT.ids)]
    assert fallback.started == [] and (short.served, long.served) == (1, 3)
    huge = Prompt(PROMPT.ids[:2] + (9906,) * 600 + PROMPT.ids[-2:], SEMANTIC_ONLY)  # more than any lane prefills
    assert len(await collect(chain, huge, SamplingOptions(max_tokens=10, seed=0), "r9-0")) == 10
    assert fallback.started == ["r9-0"]
    await chain.close()


def test_a_fixed_shape_lane_refuses_fused_or_compiled_steps(model) -> None:
    for extra in ({"fused": True}, {"compile_layers": True}):
        with pytest.raises(ValueError, match="fixed shapes"):
            GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", fixed_shapes=True, **extra)


async def test_a_strict_router_reports_a_failing_lane_instead_of_switching(lane, monkeypatch) -> None:
    """failover=False (a deterministic engine): the other generator would draw other tokens, so the lane's failure
    ends the stream with its error."""
    other = ScriptedGenerator(IDS, delay_s=0.001)
    router = LaneRouter(other, lane, others_limit=None, handoff_at=None, overflow=False, failover=False)

    def broken(rows: int, span: int) -> None:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(lane.runner, "decode", broken)
    with pytest.raises(GenerationError, match="out of GPU memory"):
        await collect(router, PROMPT, SamplingOptions(max_tokens=30, seed=0), "r-0")
    assert other.started == [] and not router.failed


async def test_a_row_that_stops_or_leaves_frees_its_row_for_the_others(lane) -> None:
    stop = min(IDS.stop_ids)
    only_stop = Prompt(PROMPT.ids, (stop,))  # another allowed set: it waits until the rows are empty
    opts = SamplingOptions(max_tokens=60, seed=3)
    alone = await collect(lane, PROMPT, opts, "alone")

    async def leave_early() -> list[int]:
        got = []
        async for delta in lane.stream(PROMPT, SamplingOptions(max_tokens=200, seed=4), "leaver"):
            got += delta
            if len(got) >= 5:
                break
        return got

    results = await asyncio.gather(collect(lane, PROMPT, opts, "a"), leave_early(),
                                   collect(lane, only_stop, opts, "s"), collect(lane, PROMPT, opts, "b"))
    assert results[0] == alone and results[3] == alone and results[2] == [stop] and 5 <= len(results[1]) < 200
    for _ in range(200):
        if lane.load == 0:
            break
        await asyncio.sleep(0.01)
    assert lane.load == 0 and lane.scheduler.busy_rows == 0


async def test_a_request_without_a_row_goes_before_later_sentences(model) -> None:
    lane = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256,
                     rows=2)
    firsts: list[str] = []

    async def run(rid: str) -> int:
        got = []
        async for delta in lane.stream(PROMPT, SamplingOptions(max_tokens=30, seed=1), rid, request_of(rid)):
            if not got:
                firsts.append(rid)
            got += delta
        return len(got)

    counts = await asyncio.gather(*(run(rid) for rid in ("a-0", "a-1", "a-2", "b-0")))
    assert counts == [30] * 4 and firsts.index("b-0") < firsts.index("a-1")  # b arrived last, got a row second
    await lane.close()


async def test_a_crowd_lane_keeps_its_streams_and_overflows_the_rest(model) -> None:
    lane = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256,
                     rows=2)
    other = ScriptedGenerator(IDS, delay_s=0.001)
    router = LaneRouter(other, lane, others_limit=None, handoff_at=None)
    opts = SamplingOptions(max_tokens=40, seed=0)
    got = await asyncio.gather(*(collect(router, PROMPT, opts, f"c{i}-0") for i in range(3)))
    assert [len(g) for g in got] == [40] * 3 and router.lane_streams == 2 and other.started == ["c2-0"]
    assert router.handoffs == 0
    waiting = LaneRouter(other, lane, others_limit=None, handoff_at=None, overflow=False)
    got = await asyncio.gather(*(collect(waiting, PROMPT, opts, f"w{i}-0") for i in range(3)))
    assert [len(g) for g in got] == [40] * 3 and waiting.lane_streams == 3  # the third waited for a row
    await lane.close()


def test_rows_fit_a_share_of_the_gpu() -> None:
    from engine.backends.graph_gen import row_bytes, rows_for

    spark = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24)
    assert row_bytes(spark) == 50331648  # 2 x 24 layers x 2 kv heads x 4096 positions x 64 x 2 bytes: 48 MiB
    gib = 1 << 30
    assert rows_for(141 * gib, row_bytes(spark)) == 512 and rows_for(80 * gib, row_bytes(spark)) == 256
    assert rows_for(24 * gib, row_bytes(spark)) == 64 and rows_for(8 * gib, row_bytes(spark)) == 32
    assert rows_for(gib // 4, row_bytes(spark)) == 1
    assert rows_for(141 * gib, row_bytes(spark), most=8) == 8 and rows_for(8 * gib, row_bytes(spark), most=16) == 16
    assert rows_for(141 * gib, row_bytes(spark), most=6) == 4  # a row bucket: graphs exist for it


def test_each_familys_crowd_lane_fits_its_rows_to_its_longest_sentence() -> None:
    from engine.backends.graph_gen import row_bytes, rows_for
    from engine.families import family

    spark = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24)
    orpheus = Qwen2Config(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8, num_hidden_layers=28,
                          head_dim=128)  # Llama-3.2-3B's shapes
    assert row_bytes(orpheus, max_len=1) == 112 * 1024  # bf16 keys and values a position

    def rows(name: str, cfg: Qwen2Config, gpu: int) -> int:
        sizing = family(name).lane
        return rows_for(gpu, row_bytes(cfg, max_len=sizing.positions), share=sizing.memory_share)

    h200, h100 = 150_000_000_000, 85_000_000_000  # about what torch reports for a 141 GB and an 80 GB card
    assert family("spark").lane.positions == 4096 and family("spark").lane.memory_share == 0.20  # as before
    assert rows("spark", spark, h200) == rows_for(h200, row_bytes(spark)) == 512
    assert rows("spark", spark, h100) == rows_for(h100, row_bytes(spark)) == 256
    assert family("orpheus").lane.positions == 512 + 3000  # the longest prompt a lane takes + max_tokens
    assert rows("orpheus", orpheus, h200) == 256 and rows("orpheus", orpheus, h100) == 128
    assert rows_for(h200, row_bytes(orpheus)) == 32  # Spark's sizing: what an H200 gave Orpheus before


def test_fixed_lane_rows_fit_a_share_of_the_gpu() -> None:
    from engine.backends.graph_gen import fixed_rows_for, row_bytes

    spark = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24)
    gib, row = 1 << 30, row_bytes(spark, max_len=2048)
    assert fixed_rows_for(80 * gib, row, 256) == 256 and fixed_rows_for(80 * gib, row, 64) == 64
    assert fixed_rows_for(24 * gib, row, 256) == 102 and fixed_rows_for(gib // 8, row, 256) == 1


def test_export_lanes_are_the_familys() -> None:
    """Spark's export lanes are as they were (their row counts are part of its bytes); Orpheus's long lane, which most
    of a book takes, gets twice the rows on a card that holds them."""
    from transformers import LlamaConfig

    from engine.backends.graph_gen import fixed_rows_for, row_bytes
    from engine.families import family

    def rows(name: str, cfg, gpu_bytes: int) -> list[int]:
        sizing = family(name).lane
        return [fixed_rows_for(gpu_bytes, row_bytes(cfg, max_len=positions), most, sizing.fixed_share)
                for positions, most in sizing.fixed]

    spark = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24)
    orpheus = LlamaConfig(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8, num_hidden_layers=28)
    gib = 1 << 30
    assert family("spark").lane.fixed == ((1024, 256), (2048, 64)) and family("spark").lane.fixed_share == 0.10
    assert rows("spark", spark, 140 * gib) == [256, 64]
    assert rows("orpheus", orpheus, 140 * gib) == [256, 128]
    assert rows("orpheus", orpheus, 80 * gib) == [146, 73]
    assert rows("orpheus", orpheus, 140 * gib)[1] == 2 * fixed_rows_for(140 * gib, row_bytes(orpheus, max_len=2048), 128)


def test_lane_rows_by_front_end() -> None:
    """In-process front ends get a 2-row lane (one listener); `voicectl serve` one sized to the GPU."""
    import argparse

    from engine.factory import EngineConfig
    from voiceapp.cli.serve import add_parser, serve_config
    from voiceapp.common import engine_config

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert engine_config(args).lane_rows == 2 and EngineConfig().lane_rows == 2
    assert serve_config(args).lane_rows is None and serve_config(args).decoder_autotune == "all"
    with pytest.raises(ValueError, match="lane_rows"):
        EngineConfig(lane_rows=0)


def test_bucket_and_request_of() -> None:
    assert bucket(1, (32, 64)) == 32 and bucket(33, (32, 64)) == 64
    with pytest.raises(ValueError, match="65 exceeds"):
        bucket(65, (32, 64))
    assert request_of("abc-3") == "abc" and request_of("a-b-12") == "a-b"
    assert request_of("warm") == "warm" and request_of("x-y") == "x-y"
    assert request_of(sentence_id("r0s8-3", 12)) == "r0s8-3"  # the bench's request ids end in digits too


async def test_router_lone_stream_and_its_sentences_take_the_lane(lane) -> None:
    other = ScriptedGenerator(IDS, delay_s=0.001)
    router = LaneRouter(other, lane)
    opts = SamplingOptions(max_tokens=20, seed=0)
    assert await collect(router, PROMPT, opts, "req-0") and router.lane_streams == 1 and not other.started
    assert len(await collect(router, Prompt(PROMPT.ids, None), opts, "x-0")) > 0  # no allowed set: elsewhere
    assert router.lane_streams == 1 and other.started == ["x-0"]


class HeldLane(ScriptedGenerator):
    """A lane as LaneRouter sees it, holding the requests `held` names (a request's sentences repeat its name)."""

    rows = 2

    def __init__(self) -> None:
        super().__init__(IDS)
        self.held: list[str] = []

    def groups(self) -> set[str]:
        return set(self.held)

    def supports(self, prompt: Prompt, opts: SamplingOptions) -> bool:
        return prompt.allowed_ids is not None

    async def stream(self, prompt: Prompt, opts: SamplingOptions, request_id: str, group: str | None = None):
        async for delta in super().stream(prompt, opts, request_id):
            yield delta


async def test_router_sends_a_full_lane_only_later_sentences_of_its_requests() -> None:
    """While as many requests as rows are on the lane, a later sentence of one waits there and a new request goes
    elsewhere; nothing new goes to the lane while the other generator is busy, or with the lane off."""
    lane, other = HeldLane(), ScriptedGenerator(IDS)
    router = LaneRouter(other, lane)

    async def on_lane(request_id: str) -> bool:
        await collect(router, PROMPT, SamplingOptions(max_tokens=3, seed=0), request_id)
        return lane.started[-1:] == [request_id]

    lane.held = ["req0", "req1"]
    assert await on_lane("req0-1") and not await on_lane("other-0")
    lane.held = ["req0"]  # room for one more request
    assert await on_lane("other-1")
    lane.held = ["req0", "req1", "req1", "req1"]  # its later sentences count as one request
    assert not await on_lane("other-2") and await on_lane("req0-2")
    router.primary_live = 1
    assert not await on_lane("req0-3")
    router.primary_live = 0
    router.enabled = False
    assert not await on_lane("req0-4")
    assert other.started == ["other-0", "other-2", "req0-3", "req0-4"]


def test_lane_refuses_ids_outside_the_vocabulary(lane) -> None:
    opts = SamplingOptions(max_tokens=10)
    assert not lane.supports(Prompt(PROMPT.ids + (166000,), SEMANTIC_ONLY), opts)
    assert not lane.supports(Prompt(PROMPT.ids, SEMANTIC_ONLY + (170000,)), opts)
    assert not lane.supports(Prompt((-1,) + PROMPT.ids, SEMANTIC_ONLY), opts)


def test_the_allowed_set_every_sentence_shares_is_scanned_once(lane) -> None:
    """semantic_allowed_ids gives every sentence the same tuple, and the lane checks its 8,195 ids only once."""
    allowed = semantic_allowed_ids(IDS)
    assert semantic_allowed_ids(IDS) is allowed
    class Scanned(tuple):
        """Counts the passes over it (the vocabulary check takes two: min and max)."""

        passes = 0

        def __iter__(self):
            self.passes += 1
            return super().__iter__()

    shared, ids = Scanned(allowed), Scanned(PROMPT.ids)
    opts = SamplingOptions(max_tokens=10)
    assert all(lane.supports(Prompt(ids, shared), opts) for _ in range(3))
    assert shared.passes == 2 and ids.passes == 6
    bad = allowed[:-1] + (170000,)
    assert not lane.supports(Prompt(PROMPT.ids, bad), opts) and not lane.supports(Prompt(PROMPT.ids, bad), opts)


async def test_router_hands_a_lane_stream_to_the_other_generator_when_it_gets_busy(lane) -> None:
    other = ScriptedGenerator(IDS, delay_s=0.001)
    router = LaneRouter(other, lane)
    opts = SamplingOptions(max_tokens=60, seed=0)
    stream = router.stream(PROMPT, opts, "solo-0")
    got = list(await stream.__anext__())
    assert router.lane_streams == 1 and not other.started
    router.primary_live = 5  # as if a crowd had arrived on the other generator
    async for delta in stream:
        got += delta
    assert router.handoffs == 1 and other.started == ["solo-0"]
    assert len(got) == 60  # the rest of the budget, no token lost or repeated
    assert all(IDS.semantic_index(t) is not None for t in got)
    router.primary_live = 0
    for _ in range(200):
        if lane.load == 0:
            break
        await asyncio.sleep(0.01)
    assert lane.load == 0  # the lane's job ended when the stream moved


async def test_a_failing_lane_hands_its_stream_over_and_stops_taking_new_ones(lane, monkeypatch) -> None:
    other = ScriptedGenerator(IDS, delay_s=0.001)
    notices = []
    router = LaneRouter(other, lane, events=notices.append)
    calls = []

    def broken(rows: int, span: int) -> None:
        calls.append(span)
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(lane.runner, "decode", broken)  # the prefill works, the first decode step fails
    got = await collect(router, PROMPT, SamplingOptions(max_tokens=30, seed=0), "r-0")
    assert calls and len(got) == 30 and router.handoffs == 1 and router.failed and router.enabled
    assert other.started == ["r-0"] and "graph lane stopped" in notices[0].message
    assert "out of GPU memory" in notices[0].message
    await collect(router, PROMPT, SamplingOptions(max_tokens=5, seed=0), "s-0")
    assert router.lane_streams == 1 and other.started == ["r-0", "s-0"]


async def test_router_in_front_of_a_slower_generator_never_hands_over(lane) -> None:
    other = ScriptedGenerator(IDS, delay_s=0.001)
    router = LaneRouter(other, lane, others_limit=None, handoff_at=None)
    router.primary_live = 5  # busy: the lane still takes the stream, and keeps it
    got = await collect(router, PROMPT, SamplingOptions(max_tokens=40, seed=0), "t-0")
    assert len(got) == 40 and router.lane_streams == 1 and router.handoffs == 0 and not other.started


def test_status_reports_the_lane(lane) -> None:
    from engine.engine_api import describe_engine, lane_status
    from voiceapp.cli.status import describe

    router = LaneRouter(ScriptedGenerator(IDS), lane)
    router.lane_streams, router.handoffs = 3, 1
    assert lane_status(router) == {"lane": {"on": True, "streams": 3, "handed_over": 1, "failed": False,
                                            "fused": False}}  # a CPU lane: the tensor code
    assert lane_status(router.primary) == {} and lane_status(lane) == {}

    class Synth:
        generator = router
        pacer = Pacer()
        grammar = SimpleNamespace(family="spark")

    assert describe_engine(Synth())["backend"] == "fake"  # named after the generator behind the lane
    router.failed = True
    status = {"pid": 1, "uptime_s": 5, "socket": "s", "model": None, "backend": "vllm", "sample_rate": 16000,
              "devices": [], "streams": [], "served": 4, "cancelled": 0, "failed": 0, "clients": 0,
              **lane_status(router)}
    assert "graph lane: failed, off; 3 streams started there, 1 moved to vllm when other streams arrived" \
        in describe(status)
    status["lane"].update(failed=False, on=True, fused=True)
    assert "graph lane: on (fused decode kernels); 3 streams started there" in "\n".join(describe(status))


def test_static_model_refuses_what_it_does_not_implement(model) -> None:
    from engine.backends.qwen2_static import supported

    assert supported(model.config)
    scaled = Qwen2Config(**{**model.config.to_dict(), "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    windowed = Qwen2Config(**{**model.config.to_dict(), "use_sliding_window": True})
    assert not supported(scaled) and not supported(windowed)
    with pytest.raises(ValueError, match="rotary"):
        StaticQwen2(Qwen2ForCausalLM(scaled), 16, "cpu", torch.float32)


# ---- the repetition penalty (a lane built with `repetition_penalty`: Orpheus's) --------------------------------

@pytest.fixture(scope="module")
def penalised(model):
    return GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256, rows=4,
                     repetition_penalty=True)


async def repeating_prompt(model) -> Prompt:
    """PROMPT followed by the unpenalised greedy stream up to its first repeat: without a penalty the model's next
    id is one the prompt holds."""
    gen = TorchTokenGenerator(model, IDS, device="cpu")
    try:
        plain = await collect(gen, PROMPT, SamplingOptions(temperature=0, max_tokens=60))
    finally:
        await gen.close()
    repeat = next(i for i, t in enumerate(plain) if t in plain[:i])
    return Prompt(PROMPT.ids + tuple(plain[:repeat]), SEMANTIC_ONLY)


async def test_a_lane_without_the_penalty_captures_none_and_takes_no_penalised_request(model, lane) -> None:
    """Spark's lane: no penalty buffers or ops; a request with a penalty goes to the generator behind it, never
    runs unpenalised; one without stays on the lane."""
    assert lane.runner.penalties is None
    with_penalty = SamplingOptions(max_tokens=20, seed=1, repetition_penalty=1.3)
    assert not lane.supports(PROMPT, with_penalty) and lane.supports(PROMPT, replace(with_penalty,
                                                                                     repetition_penalty=1.0))
    with pytest.raises(ValueError):
        await collect(lane, PROMPT, with_penalty)
    other = ScriptedGenerator(IDS, delay_s=0.001)
    router = LaneRouter(other, lane, others_limit=None, handoff_at=None, overflow=False)
    await collect(router, PROMPT, with_penalty, "p-0")
    await collect(router, PROMPT, replace(with_penalty, repetition_penalty=1.0), "q-0")
    assert other.started == ["p-0"]


async def test_a_penalised_greedy_stream_equals_the_torch_generators(model, penalised) -> None:
    """The prompt's allowed ids (seen at prefill) and every drawn id (seen from its step on) are penalised as the
    torch generator penalises them (tests/model/test_torch_gen.py checks that one against transformers)."""
    prompt = await repeating_prompt(model)
    opts = SamplingOptions(temperature=0, max_tokens=60, repetition_penalty=1.3)
    ref_gen = TorchTokenGenerator(model, IDS, device="cpu")
    try:
        ref = await collect(ref_gen, prompt, opts)
        plain = await collect(ref_gen, prompt, replace(opts, repetition_penalty=1.0))
    finally:
        await ref_gen.close()
    assert await collect(penalised, prompt, opts) == ref and ref != plain
    assert await collect(penalised, prompt, replace(opts, repetition_penalty=1.0)) == plain


async def test_a_penalised_lane_at_penalty_one_draws_what_a_plain_lane_draws(model, penalised) -> None:
    """Seeded streams side by side (rows reused mid-run): a penalty of 1.0 changes no draw; 1.3 changes them, and a
    row taken over by another request forgets what the last one saw (each gets its lone tokens in company)."""
    plain = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256, rows=4)
    prompts = [Prompt(PROMPT.ids[:2] + (9906 + 7 * i,) * (1 + 3 * i) + PROMPT.ids[-2:], SEMANTIC_ONLY)
               for i in range(6)]
    opts = [SamplingOptions(max_tokens=40 + 15 * i, seed=i) for i in range(6)]

    async def together(lane: GraphLane, penalty: float) -> list[list[int]]:
        return list(await asyncio.gather(*(collect(lane, p, replace(o, repetition_penalty=penalty), f"t{i}")
                                           for i, (p, o) in enumerate(zip(prompts, opts)))))

    unpenalised = await together(plain, 1.0)
    assert await together(penalised, 1.0) == unpenalised
    with_penalty = await together(penalised, 1.3)
    assert all(a != b for a, b in zip(with_penalty, unpenalised))
    alone = [await collect(penalised, p, replace(o, repetition_penalty=1.3), f"a{i}")
             for i, (p, o) in enumerate(zip(prompts, opts))]
    assert with_penalty == alone
    await plain.close()


async def test_a_fixed_shape_lane_with_the_penalty_gives_the_same_tokens_in_any_company(model) -> None:
    """Deterministic export's lanes with the penalty on: a request's tokens do not depend on what runs beside it."""
    lane = GraphLane(model, IDS, semantic_allowed_ids(IDS), device="cpu", dtype=torch.float32, max_len=256,
                     rows=3, fixed_shapes=True, repetition_penalty=True)
    prompts = [Prompt(PROMPT.ids[:2] + (9906 + 5 * i,) * (2 + 4 * i) + PROMPT.ids[-2:], SEMANTIC_ONLY)
               for i in range(4)]
    opts = [SamplingOptions(max_tokens=30 + 20 * i, seed=10 + i, repetition_penalty=1.3) for i in range(4)]
    alone = [await collect(lane, p, o, f"a{i}") for i, (p, o) in enumerate(zip(prompts, opts))]
    backward = await asyncio.gather(*(collect(lane, p, o, f"b{i}") for i, (p, o) in
                                      reversed(list(enumerate(zip(prompts, opts))))))
    assert list(backward) == alone[::-1]
    await lane.close()


async def test_the_lanes_penalised_draws_follow_the_torch_generators_distribution(model, penalised) -> None:
    """First tokens of many seeds after a prompt whose next id (unpenalised) is one of its own: the lane and the
    torch generator both draw from softmax over top-k of the penalised logits (the rule on transformers' logits),
    and the repeat's probability is the lower one the rule gives."""
    prompt = await repeating_prompt(model)
    temperature, top_k, draws = 1.0, 8, 600
    with torch.inference_mode():
        logits = model(torch.tensor([prompt.ids])).logits[0, -1][list(SEMANTIC_ONLY)]
    seen = torch.isin(torch.tensor(SEMANTIC_ONLY), torch.tensor(prompt.ids))

    def expected(penalty: float) -> dict[int, float]:
        values, index = top_k_top_p(repetition_penalty(logits, seen, penalty) / temperature, top_k, 1.0)
        return {SEMANTIC_ONLY[i]: p for i, p in zip(index.tolist(), torch.softmax(values, -1).tolist())}

    want, unpenalised = expected(1.3), expected(1.0)
    repeat = max(unpenalised, key=lambda t: unpenalised[t])
    assert repeat in prompt.ids and want.get(repeat, 0.0) < unpenalised[repeat] - 0.05
    ref_gen = TorchTokenGenerator(model, IDS, device="cpu")
    try:
        for gen in (penalised, ref_gen):
            firsts = Counter([(await collect(gen, prompt, SamplingOptions(
                temperature=temperature, top_k=top_k, top_p=1.0, max_tokens=1, seed=seed,
                repetition_penalty=1.3), f"s{seed}"))[0] for seed in range(draws)])
            assert set(firsts) <= set(want)
            for token, p in want.items():
                sigma = math.sqrt(p * (1 - p) / draws)
                assert abs(firsts[token] / draws - p) < 5 * sigma + 1e-3, (type(gen).__name__, token, p)
    finally:
        await ref_gen.close()


# ---- the fused decode kernels (Triton's CPU interpreter here; tests/conftest.py) --------------------------------

needs_triton = pytest.mark.skipif(not decode_kernels.available(), reason="needs Triton (its CPU interpreter)")


@pytest.fixture(scope="module")
def wide_model() -> Qwen2ForCausalLM:
    """Heads of 16 values: the fused attention's smallest."""
    return _qwen(1, 64, 96)


@pytest.fixture(scope="module")
def wider_model() -> Qwen2ForCausalLM:
    """A down projection of 600 rows: several split-K runs."""
    return _qwen(2, 128, 600)


@needs_triton
@pytest.mark.parametrize("plan", [FusedPlan(), FusedPlan(o_split=1, down_split=1),
                                  FusedPlan(k_major=True, o_split=2, down_split=3, attend_chunk=32),
                                  FusedPlan(rope_in_attention=True, attend_chunk=32, down_split=2),
                                  FusedPlan(rope_in_attention=True),
                                  FusedPlan(k_major=True, o_split=2, down_split=3, rope_in_attention=True,
                                            preload=("qkv", "o", "gate_up", "down", "head")),
                                  FusedPlan(preload=("qkv", "gate_up")),
                                  FusedPlan(k_major=True, o_split=2, down_split=3, rope_in_attention=True,
                                            preload=("qkv", "o"), late_sum=True, attend_chunk=32,
                                            attend_preload=True)],
                         ids=repr)
def test_fused_step_equals_the_tensor_code(plan, wide_model, wider_model) -> None:
    """forward_fused + logits_fused == forward_rows + the head, for three rows (two where the plan sums partials
    late, which it does at few rows only) at different positions of their caches (each row attends over its own
    length; keys and values land where forward_rows puts them), whichever variant of the step runs."""
    static = StaticQwen2(wider_model if plan != FusedPlan() else wide_model, 128, "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    rows = min(3, decode_kernels.LATE_SUM_ROWS) if plan.late_sum else 3  # late sums run at few rows only
    ids, positions = torch.tensor([9906, 11, 1879])[:rows], torch.tensor([0, 37, 100])[:rows]
    caches = [static.new_rows_cache(4, 128) for _ in range(2)]
    for k, v in caches:  # the same earlier keys and values in both
        k.copy_(torch.randn(k.shape, generator=g) if k is caches[0][0] else caches[0][0])
        v.copy_(torch.randn(v.shape, generator=g) if v is caches[0][1] else caches[0][1])
    head = static.head_rows(torch.tensor(SEMANTIC_ONLY[:200]))
    with torch.inference_mode():
        want = static.forward_rows(ids, positions, 128, tuple(c[:, :rows] for c in caches[0])) @ head.T
        x = static.forward_fused(ids, positions, tuple(c[:, :rows] for c in caches[1]), plan)
        got = static.logits_fused(x, head.t() if plan.k_major else head.t().contiguous(), torch.zeros(200), plan)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for a, b in zip(*caches):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@needs_triton
async def test_fused_lane_streams_equal_the_plain_lane(wide_model) -> None:
    """Two streams side by side on a fused lane get the tokens the tensor-code lane gives them (greedy and
    seeded), through prefill, decode and the two-round top-k."""
    allowed = SEMANTIC_ONLY[:TOPK_CHUNKS * CANDIDATES]  # the smallest head taking two rounds: the interpreter is slow
    prompts = [Prompt(PROMPT.ids, allowed), Prompt(PROMPT.ids[:3] + (1879,) * 7 + PROMPT.ids[-2:], allowed)]

    async def run(fused: bool, plan: FusedPlan | None, tokens: int) -> list:
        opts = [SamplingOptions(temperature=0.0, max_tokens=tokens), SamplingOptions(seed=5, max_tokens=tokens)]
        lane = GraphLane(wide_model, IDS, allowed, device="cpu", dtype=torch.float32, max_len=128, rows=2,
                         fused=fused, plan=plan)
        assert lane.fused is fused
        got = await asyncio.gather(*(collect(lane, p, o, f"r{i}") for i, (p, o) in enumerate(zip(prompts, opts))))
        await lane.close()
        return got

    plain = await run(False, None, 24)
    assert all(len(t) == 24 for t in plain)
    # the tensor code's sampling after the fused step, then (the interpreter sorts slowly) a few steps of the plan
    # as the GPU runs it: its sampling kernel included
    assert await run(True, replace(decode_kernels.plan_for(), one_sample=False), 24) == plain
    assert decode_kernels.plan_for().one_sample
    assert await run(True, None, 4) == [t[:4] for t in plain]


@needs_triton
async def test_a_penalised_fused_lane_streams_equal_the_penalised_plain_lane(wide_model) -> None:
    """The fused step's logits, penalised, drawn by the tensor code's sampler (not the fused sampling kernel,
    which knows no penalty): the plain lane's tokens."""
    allowed = SEMANTIC_ONLY[:TOPK_CHUNKS * CANDIDATES]
    prompts = [Prompt(PROMPT.ids + allowed[:40:3], allowed), Prompt(PROMPT.ids[:3] + (1879,) * 7 + PROMPT.ids[-2:],
                                                                    allowed)]
    opts = [SamplingOptions(temperature=0.0, max_tokens=12, repetition_penalty=1.3),
            SamplingOptions(seed=5, max_tokens=12, repetition_penalty=1.3)]

    async def run(fused: bool) -> list:
        lane = GraphLane(wide_model, IDS, allowed, device="cpu", dtype=torch.float32, max_len=128, rows=2,
                         fused=fused, repetition_penalty=True)
        assert lane.fused is fused and (not fused or lane.runner.plan.one_sample)
        got = await asyncio.gather(*(collect(lane, p, o, f"r{i}") for i, (p, o) in enumerate(zip(prompts, opts))))
        await lane.close()
        return got

    assert await run(True) == await run(False)


@needs_triton
def test_a_lane_whose_every_step_is_fused_leaves_its_prefills_uncompiled(wide_model, monkeypatch) -> None:
    """compile_layers compiles the prefills only where some decode steps run the tensor code (Inductor would
    otherwise compile once per prefill shape, for prefills that replay from CUDA graphs anyway)."""
    calls = []
    monkeypatch.setattr(StaticQwen2, "compile_layers", lambda self, prefill=True: calls.append(prefill))

    def compiled(**kw) -> list[bool]:
        calls.clear()
        GraphLane(wide_model, IDS, SEMANTIC_ONLY[:TOPK_CHUNKS * CANDIDATES], device="cpu", dtype=torch.float32,
                  max_len=128, compile_layers=True, **kw)
        return list(calls)

    assert compiled(rows=2, fused=True) == []  # every step fused: nothing compiled, prefills eager
    assert compiled(rows=4, fused=True, fuse_rows=2) == [True]  # steps of 4 rows run the compiled tensor code
    assert compiled(rows=4, fused=True, fuse_rows=2, compile_prefill=False) == [False]
    assert compiled(rows=2, fused=True, compile_prefill=True) == [True]
    assert compiled(rows=2, fused=False) == [True]


def test_two_round_top_k_equals_one() -> None:
    logits = torch.randn(3, TOPK_CHUNKS * 516)
    logits[1, 5000:] = float("-inf")  # a padded head's tail
    values, index = top_candidates(logits)
    want_values, want_index = torch.topk(logits, CANDIDATES, dim=-1)
    assert torch.equal(values, want_values) and torch.equal(index, want_index)
    odd = torch.randn(2, 1000)  # not a multiple of the slices: one round
    assert torch.equal(top_candidates(odd)[1], torch.topk(odd, CANDIDATES, dim=-1)[1])


def test_a_lane_that_fails_to_build_compiled_is_rebuilt_plain(monkeypatch) -> None:
    """Inductor or Triton trouble while building the compiled, fused lane: one notice, and a second build with
    neither (factory._build_lane; the GPU parts are stood in for)."""
    from types import SimpleNamespace

    from engine import factory

    builds = []

    def new_lane(info, device, rows, compiled, background=False, between=None):
        builds.append(compiled)
        if compiled:
            raise RuntimeError("out of resource: shared memory\nmore detail")
        return SimpleNamespace(rows=2, capture_s=0.5)

    monkeypatch.setattr(factory, "_new_lane", new_lane)
    monkeypatch.setattr(factory, "_free_gpu_memory", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    notices = []
    lane = factory._build_lane(None, notices.append, device="cpu", rows=2)
    assert builds == [True, False] and lane.rows == 2
    said = [n.message for n in notices if not isinstance(n, factory.StartupPhase)]
    assert [n.name for n in notices if isinstance(n, factory.StartupPhase)] == ["lane"]
    assert said[0] == "graph lane without torch.compile or fused kernels (RuntimeError: out of resource: shared memory)"
    assert said[1].startswith("graph lane ready in")


def test_fused_lane_without_triton_is_refused_clearly(wide_model, monkeypatch) -> None:
    monkeypatch.setattr(decode_kernels, "available", lambda: False)
    with pytest.raises(ValueError, match="Triton"):
        GraphLane(wide_model, IDS, SEMANTIC_ONLY, device="cpu", dtype=torch.float32, max_len=128, rows=2, fused=True)
    lane = GraphLane(wide_model, IDS, SEMANTIC_ONLY, device="cpu", dtype=torch.float32, max_len=128, rows=2)
    assert not lane.fused  # the default quietly keeps the tensor code
