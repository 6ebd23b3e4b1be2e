"""TorchTokenGenerator on a tiny random Qwen2 (CPU): cached loop == generate(), seeding, masks, stops, cancel."""
from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, RepetitionPenaltyLogitsProcessor

from engine.backends.base import TokenGenerator
from engine.backends.torch_gen import TorchTokenGenerator, measure_throughput, sample_token, top_k_top_p
from engine.config import SamplingOptions
from engine.errors import ModelNotFound
from engine.prompt import Prompt, semantic_allowed_ids
from engine.tokens import SEMANTIC_CODEBOOK, TokenIds

IDS = TokenIds()
PROMPT = Prompt(ids=(IDS.structural["task_tts"], IDS.structural["start_content"], 9906, 11, 1879, 13,
                     IDS.structural["end_content"], IDS.structural["start_semantic_token"]))
SEMANTIC_ONLY = tuple(range(IDS.semantic_base, IDS.semantic_base + SEMANTIC_CODEBOOK))
"""Allowed ids with no stop id: streams run to max_tokens."""


def tiny_config() -> Qwen2Config:
    # initializer_range 0.2 (not the default 0.02): with tied embeddings and tiny weights the layers barely move
    # the residual, so greedy decoding just repeats the last prompt token and the generate() comparison is vacuous.
    return Qwen2Config(vocab_size=166000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True, initializer_range=0.2)


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_config()).eval()


@pytest.fixture
async def gen(model: Qwen2ForCausalLM):
    g = TorchTokenGenerator(model, IDS, device="cpu")
    yield g
    await g.close()


@contextlib.contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count transformer forward passes while the block runs: `calls[0]` (the base model runs in every step,
    whether logits come from the full LM head or only the allowed rows)."""
    calls = [0]
    handle = model.base_model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        yield calls
    finally:
        handle.remove()


async def collect(g: TorchTokenGenerator, prompt: Prompt, opts: SamplingOptions, rid: str = "r") -> list[int]:
    return [i async for delta in g.stream(prompt, opts, rid) for i in delta]


async def test_is_a_token_generator(gen: TorchTokenGenerator) -> None:
    assert isinstance(gen, TokenGenerator)
    assert gen.model.dtype == torch.float32 and gen.device.type == "cpu"


async def test_greedy_cached_loop_equals_hf_generate(gen: TorchTokenGenerator, model: Qwen2ForCausalLM) -> None:
    n = 20
    ours = await collect(gen, PROMPT, SamplingOptions(temperature=0, max_tokens=n))
    with torch.inference_mode():
        prompt = torch.tensor([PROMPT.ids])
        ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                             eos_token_id=None, pad_token_id=0)[0, len(PROMPT.ids):].tolist()
    assert len(ref) == n and not set(ref) & IDS.stop_ids  # stops unreachable, so the 20 tokens compare
    assert ours == ref
    assert len(set(ours)) > 1  # not a degenerate constant stream


async def test_every_step_after_prefill_is_one_token_forward(gen: TorchTokenGenerator,
                                                             model: Qwen2ForCausalLM) -> None:
    lengths: list[int] = []
    handle = model.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        await collect(gen, PROMPT, SamplingOptions(temperature=0, max_tokens=6))
    finally:
        handle.remove()
    assert lengths == [len(PROMPT.ids), 1, 1, 1, 1, 1]  # prefill, then 5 cached decode steps (no re-prefill)


async def test_seeded_sampling_is_reproducible(gen: TorchTokenGenerator) -> None:
    opts = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, max_tokens=20, seed=1234)
    prompt = Prompt(PROMPT.ids, SEMANTIC_ONLY)
    a = await collect(gen, prompt, opts)
    b = await collect(gen, prompt, opts)
    c = await collect(gen, prompt, SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, max_tokens=20, seed=99))
    assert a == b
    assert a != c
    unseeded = [await collect(gen, prompt, SamplingOptions(temperature=1.0, top_k=0, max_tokens=20))
                for _ in range(2)]
    assert unseeded[0] != unseeded[1]


async def test_allowed_ids_respected(gen: TorchTokenGenerator) -> None:
    allowed = semantic_allowed_ids(IDS)
    out = await collect(gen, Prompt(PROMPT.ids, allowed),
                        SamplingOptions(temperature=1.5, top_k=0, top_p=1.0, max_tokens=60, seed=3))
    assert out and set(out) <= set(allowed)
    assert all(IDS.semantic_index(i) is not None or i in IDS.stop_ids for i in out)


async def test_max_tokens_respected(gen: TorchTokenGenerator, model: Qwen2ForCausalLM) -> None:
    with count_forwards(model) as calls:
        stream = gen.stream(Prompt(PROMPT.ids, SEMANTIC_ONLY), SamplingOptions(max_tokens=7, seed=0), "r")
        deltas = [d async for d in stream]
    assert len(deltas) == 7 and all(len(d) == 1 for d in deltas)
    assert calls[0] == 7  # prefill + 6 decodes: the 7th token is never fed back


async def test_stop_id_ends_the_stream(gen: TorchTokenGenerator, model: Qwen2ForCausalLM) -> None:
    """From the 5th forward pass on, a +1000 bias on <|im_end|>: it must be sampled there and end the stream."""
    steps = [0]

    def bias_im_end(_module: torch.nn.Module, _inputs: object, logits: torch.Tensor) -> torch.Tensor:
        steps[0] += 1
        if steps[0] >= 5:
            logits = logits.clone()
            logits[..., IDS.im_end] += 1000.0
        return logits

    handle = model.lm_head.register_forward_hook(bias_im_end)
    try:
        out = await collect(gen, PROMPT, SamplingOptions(temperature=0.8, max_tokens=100, seed=0))
    finally:
        handle.remove()
    assert len(out) == 5 and out[-1] == IDS.im_end
    assert not set(out[:-1]) & IDS.stop_ids
    assert steps[0] == 5  # nothing ran after the stop
    assert not gen._requests


async def test_consumer_break_stops_generation(gen: TorchTokenGenerator, model: Qwen2ForCausalLM) -> None:
    with count_forwards(model) as calls:
        seen = []
        async with contextlib.aclosing(gen.stream(PROMPT, SamplingOptions(max_tokens=1000, seed=0), "r")) as s:
            async for delta in s:
                seen += delta
                if len(seen) == 3:
                    break
        await asyncio.sleep(0.05)
        assert calls[0] == 3  # prefill + 2 decodes; nothing runs ahead of the consumer
    assert not gen._requests  # cache and state dropped


async def consume_until_three(gen: TorchTokenGenerator, seen: list[int]) -> asyncio.Task:
    """A task streaming request "victim" into `seen`, returned once it has received three tokens."""
    three = asyncio.Event()

    async def consume() -> None:
        async for delta in gen.stream(PROMPT, SamplingOptions(max_tokens=1000, seed=0), "victim"):
            seen.extend(delta)
            if len(seen) == 3:
                three.set()

    task = asyncio.create_task(consume())
    await three.wait()
    return task


async def test_abort_from_another_task(gen: TorchTokenGenerator, model: Qwen2ForCausalLM) -> None:
    seen: list[int] = []

    with count_forwards(model) as calls:
        task = await consume_until_three(gen, seen)
        at_abort = calls[0]
        await gen.abort("victim")
        await asyncio.wait_for(task, timeout=5)
        await asyncio.sleep(0.05)
        assert calls[0] <= at_abort + 1  # at most the forward pass already in flight
    assert len(seen) <= 4
    assert not gen._requests
    await gen.abort("no-such-request")  # unknown ids are ignored


async def test_cancelled_task_stops_generation(gen: TorchTokenGenerator, model: Qwen2ForCausalLM) -> None:
    seen: list[int] = []

    with count_forwards(model) as calls:
        task = await consume_until_three(gen, seen)
        at_cancel = calls[0]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.get_running_loop().run_in_executor(gen._executor, lambda: None)  # drain the worker
        assert calls[0] <= at_cancel + 1
    assert not gen._requests


async def test_concurrent_streams_interleave_and_stay_deterministic(gen: TorchTokenGenerator,
                                                                    model: Qwen2ForCausalLM) -> None:
    prompt = Prompt(PROMPT.ids, SEMANTIC_ONLY)
    a_opts, b_opts = (SamplingOptions(temperature=1.0, top_k=0, max_tokens=15, seed=s) for s in (11, 22))
    a_alone, b_alone = await collect(gen, prompt, a_opts, "a"), await collect(gen, prompt, b_opts, "b")
    order: list[int] = []
    handle = model.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: order.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        a, b = await asyncio.gather(collect(gen, prompt, a_opts, "a"), collect(gen, prompt, b_opts, "b"))
    finally:
        handle.remove()
    assert a == a_alone and b == b_alone
    assert a != b
    assert len(order) == 30 and order[:2] == [len(prompt.ids)] * 2  # both prefilled before either finished


async def test_reused_request_id_streams_independently_and_abort_hits_both(gen: TorchTokenGenerator) -> None:
    opts = SamplingOptions(max_tokens=1000, seed=0)
    first, second = gen.stream(PROMPT, opts, "dup"), gen.stream(PROMPT, opts, "dup")
    assert await first.__anext__() == await second.__anext__()  # same seed, same prompt
    await gen.abort("dup")
    assert [d async for d in first] == [] and [d async for d in second] == []
    assert not gen._requests


async def test_measure_throughput(gen: TorchTokenGenerator) -> None:
    rate = await measure_throughput(gen, Prompt(PROMPT.ids, SEMANTIC_ONLY), 10)
    assert math.isfinite(rate) and rate > 0


async def test_loads_from_a_directory(tmp_path, model: Qwen2ForCausalLM) -> None:
    model.save_pretrained(tmp_path)
    g = TorchTokenGenerator(str(tmp_path), IDS, threads=2)
    try:
        assert g.dtype == torch.float32  # fp32 on CPU, whatever the checkpoint says
        ours = await collect(g, PROMPT, SamplingOptions(temperature=0, max_tokens=5))
    finally:
        await g.close()
    g2 = TorchTokenGenerator(model, IDS, device="cpu")
    try:
        assert ours == await collect(g2, PROMPT, SamplingOptions(temperature=0, max_tokens=5))
    finally:
        await g2.close()


def test_missing_checkpoint_and_fp16_rejected(tmp_path, model: Qwen2ForCausalLM) -> None:
    with pytest.raises(ModelNotFound):
        TorchTokenGenerator(tmp_path / "nope", IDS)
    with pytest.raises(ValueError, match="float16"):
        TorchTokenGenerator(model, IDS, device="cpu", dtype=torch.float16)


# ---- sampling on hand-made logits ---------------------------------------------------------------------------

def test_top_k_keeps_the_k_largest() -> None:
    values, indices = top_k_top_p(torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0]), top_k=2, top_p=1.0)
    assert indices.tolist() == [1, 3] and values.tolist() == [5.0, 4.0]
    _, indices = top_k_top_p(torch.tensor([1.0, 5.0, 3.0]), top_k=0, top_p=1.0)
    assert indices.tolist() == [0, 1, 2]  # both disabled: everything, untouched
    _, indices = top_k_top_p(torch.tensor([1.0, 5.0, 3.0]), top_k=10, top_p=1.0)
    assert indices.tolist() == [0, 1, 2]


@pytest.mark.parametrize("top_p,kept", [(0.45, [2]), (0.7, [2, 0]), (0.85, [2, 0, 3]), (0.99, [2, 0, 3, 1]),
                                        (1e-6, [2])])
def test_top_p_keeps_smallest_prefix_reaching_mass(top_p: float, kept: list[int]) -> None:
    logits = torch.tensor([0.3, 0.05, 0.5, 0.15]).log()
    _, indices = top_k_top_p(logits, top_k=0, top_p=top_p)
    assert indices.tolist() == kept


def test_top_p_applies_to_the_top_k_renormalized() -> None:
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # top-2 renormalized: 0.571, 0.429 -> top_p 0.5 keeps only the first; over all 4 it would keep 2.
    assert top_k_top_p(logits, top_k=2, top_p=0.5)[1].tolist() == [0]
    assert top_k_top_p(logits, top_k=0, top_p=0.5)[1].tolist() == [0, 1]


def allowed_mask(allowed_ids: tuple[int, ...], vocab_size: int, device: torch.device) -> torch.Tensor:
    """Additive mask [V]: 0 on allowed ids, -inf elsewhere (what a restricted head must sample like)."""
    mask = torch.full((vocab_size,), float("-inf"), device=device)
    mask[torch.tensor(allowed_ids, device=device)] = 0.0
    return mask


def test_sample_token_never_picks_masked_or_filtered_ids() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([2.0, 9.0, 1.0, 1.5, 0.5, 8.0]) + allowed_mask((0, 2, 3, 4), 6, torch.device("cpu"))
    picks = {sample_token(logits, SamplingOptions(temperature=2.0, top_k=2, top_p=1.0), g) for _ in range(200)}
    assert picks == {0, 3}  # 1 and 5 masked out; top-2 of the rest
    picks = {sample_token(logits, SamplingOptions(temperature=1.0, top_k=0, top_p=1.0), g) for _ in range(500)}
    assert picks == {0, 2, 3, 4}
    assert sample_token(logits, SamplingOptions(temperature=0), g) == 0  # greedy = argmax after the mask


async def test_restricted_head_samples_like_a_masked_full_vocabulary(gen: TorchTokenGenerator) -> None:
    """Greedy over allowed rows only == greedy over the full logits with everything else masked out."""
    allowed = tuple(range(gen.token_ids.semantic_base, gen.token_ids.semantic_base + 8192)) + tuple(
        sorted(gen.token_ids.stop_ids))
    prompt = Prompt(PROMPT.ids, allowed_ids=allowed)
    got = await collect(gen, prompt, SamplingOptions(temperature=0, max_tokens=12))
    ids, mask = list(PROMPT.ids), allowed_mask(allowed, gen._vocab_size, gen.device)
    want = []
    with torch.inference_mode():
        for _ in range(12):
            logits = gen.model(input_ids=torch.tensor([ids])).logits[0, -1] + mask
            want.append(int(torch.argmax(logits)))
            ids.append(want[-1])
            if want[-1] in gen.token_ids.stop_ids:
                break
    assert got == want and all(t in allowed for t in got)


# ---- the repetition penalty (engine.backends.torch_gen.repetition_penalty; the rule: tests/pure) --------------

async def test_greedy_with_a_repetition_penalty_equals_hf_generate(gen: TorchTokenGenerator,
                                                                   model: Qwen2ForCausalLM) -> None:
    """Over the whole vocabulary: transformers' generate with repetition_penalty (prompt and output ids, as vLLM).
    Without the penalty this model's greedy stream falls into a loop; with it, the stream is another one."""
    n = 40
    ours = await collect(gen, PROMPT, SamplingOptions(temperature=0, max_tokens=n, repetition_penalty=1.3))
    plain = await collect(gen, PROMPT, SamplingOptions(temperature=0, max_tokens=n))
    with torch.inference_mode():
        prompt = torch.tensor([PROMPT.ids])
        ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                             eos_token_id=None, pad_token_id=0, repetition_penalty=1.3)[0, len(PROMPT.ids):].tolist()
    assert ours == ref and len(ref) == n
    assert ours != plain and len(set(ours)) > len(set(plain))


async def test_greedy_with_a_penalty_over_allowed_ids_counts_the_prompts_allowed_ids(gen: TorchTokenGenerator,
                                                                                    model: Qwen2ForCausalLM) -> None:
    """A restricted head: each token is the argmax of the full logits after transformers' penalty over prompt and
    output, masked to the allowed ids. The prompt is the unpenalised stream up to its first repeat, so without the
    penalty the next id would be one of the prompt's own."""
    allowed = SEMANTIC_ONLY
    plain = await collect(gen, Prompt(PROMPT.ids, allowed), SamplingOptions(temperature=0, max_tokens=60))
    repeat = next(i for i, t in enumerate(plain) if t in plain[:i])
    prompt = Prompt(PROMPT.ids + tuple(plain[:repeat]), allowed)
    assert plain[repeat] in prompt.ids
    got = await collect(gen, prompt, SamplingOptions(temperature=0, max_tokens=30, repetition_penalty=1.3))
    rule, mask, ids, want = RepetitionPenaltyLogitsProcessor(1.3), allowed_mask(allowed, gen._vocab_size,
                                                                                gen.device), list(prompt.ids), []
    with torch.inference_mode():
        for _ in range(30):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1:]
            want.append(int(torch.argmax(rule(torch.tensor([ids]), logits)[0] + mask)))
            ids.append(want[-1])
    assert got == want and got[0] != plain[repeat]


async def test_a_penalty_of_one_draws_what_no_penalty_draws_and_another_draws_otherwise(
        gen: TorchTokenGenerator) -> None:
    prompt = Prompt(PROMPT.ids, SEMANTIC_ONLY)
    plain = await collect(gen, prompt, SamplingOptions(max_tokens=60, seed=3))
    assert await collect(gen, prompt, SamplingOptions(max_tokens=60, seed=3, repetition_penalty=1.0)) == plain
    penalised = await collect(gen, prompt, SamplingOptions(max_tokens=60, seed=3, repetition_penalty=1.3))
    assert penalised != plain
    assert await collect(gen, prompt, SamplingOptions(max_tokens=60, seed=3, repetition_penalty=1.3)) == penalised


# ---- the static forward (engine.backends.qwen2_static), the default for checkpoints loaded on the CPU -------

async def test_static_forward_gives_the_transformers_loop_tokens(tmp_path, model: Qwen2ForCausalLM) -> None:
    """Greedy over 300 tokens (the request's cache grows past its first 8 + 256 positions) and seeded sampling,
    alone and interleaved: the checkpoint through the static forward gives the same tokens as the transformers
    forward of the model it was saved from."""
    model.save_pretrained(tmp_path)
    hf, static = TorchTokenGenerator(model, IDS, device="cpu"), TorchTokenGenerator(str(tmp_path), IDS, device="cpu")
    prompt = Prompt(PROMPT.ids, SEMANTIC_ONLY)
    try:
        assert hf.static is None and static.static is not None
        greedy = SamplingOptions(temperature=0, max_tokens=300)
        assert await collect(static, prompt, greedy) == await collect(hf, prompt, greedy)
        seeded = [SamplingOptions(max_tokens=40, seed=s) for s in (3, 4)]
        ref = [await collect(hf, prompt, o, f"r{i}") for i, o in enumerate(seeded)]
        assert await asyncio.gather(*(collect(static, prompt, o, f"s{i}") for i, o in enumerate(seeded))) == ref
    finally:
        await hf.close()
        await static.close()


async def test_a_checkpoint_loaded_on_the_cpu_is_held_once(tmp_path, model: Qwen2ForCausalLM) -> None:
    """Read straight into the static model (no transformers model at all); a given model is left as it is, and
    a lazy generator loads on its first request."""
    model.save_pretrained(tmp_path)
    g = TorchTokenGenerator(str(tmp_path), IDS, threads=2)
    try:
        assert g.static is not None and g.model is None
        assert len(await collect(g, PROMPT, SamplingOptions(max_tokens=12, seed=0))) == 12
    finally:
        await g.close()
    assert TorchTokenGenerator(model, IDS, device="cpu").static is None  # a caller's model is left as it is
    lazy = TorchTokenGenerator(str(tmp_path), IDS, threads=2, lazy=True)
    try:
        assert lazy.static is None
        assert len(await collect(lazy, PROMPT, SamplingOptions(max_tokens=3, seed=0))) == 3 and lazy.static is not None
    finally:
        await lazy.close()
