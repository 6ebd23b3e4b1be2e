"""The repetition penalty's rule (engine.backends.torch_gen.repetition_penalty) on hand-made logits, against
transformers' RepetitionPenaltyLogitsProcessor and vLLM's documented rule; SamplingOptions' check; which family
asks for it, and what the vLLM generator hands vLLM. The generators' use of it: tests/model (test_torch_gen,
test_int8_llm, test_graph_lane)."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from engine.backends.torch_gen import repetition_penalty
from engine.config import SamplingOptions
from engine.prompt import Prompt

INF = float("inf")


def seen_mask(ids: list[int], width: int) -> torch.Tensor:
    seen = torch.zeros(width, dtype=torch.bool)
    seen[torch.tensor(ids, dtype=torch.long)] = True
    return seen


def test_the_rule_by_hand() -> None:
    """Seen and positive: divided; seen and negative: multiplied; zero and -inf stay; unseen ids untouched; an id
    seen twice is penalised once."""
    logits = torch.tensor([2.0, -1.0, 0.0, -INF, 3.0, -0.5, 0.25])
    seen = seen_mask([0, 1, 2, 3, 6, 6], 7)
    got = repetition_penalty(logits, seen, 2.0)
    assert got.tolist() == [1.0, -2.0, 0.0, -INF, 3.0, -0.5, 0.125]


def test_the_rule_is_transformers_repetition_penalty() -> None:
    """Over prompt + output ids (with repeats) on random logits of both signs: transformers' processor, which
    counts every id of its input once, as vLLM does over prompt and output."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    sequences = torch.randint(0, 50, (3, 30))
    for penalty in (1.3, 0.7, 2.5):
        want = RepetitionPenaltyLogitsProcessor(penalty)(sequences, logits.clone())
        seen = torch.stack([seen_mask(row.tolist(), 50) for row in sequences])
        torch.testing.assert_close(repetition_penalty(logits, seen, penalty), want, rtol=1e-6, atol=0)
        per_row = repetition_penalty(logits, seen, torch.full((3, 1), penalty))  # the lane's per-row form
        torch.testing.assert_close(per_row, want, rtol=1e-6, atol=0)


def test_the_rule_is_vllms_over_prompt_and_output() -> None:
    """vLLM's sampler: ids in the prompt or the output so far (a mask each, or'ed) get the penalty, a positive logit
    divided by it, any other multiplied (its torch fallback multiplies by 1 / penalty: the same up to rounding)."""
    prompt, output = [1, 4, 4, 7], [2, 7, 9]
    logits = torch.tensor([[0.5, 3.0, -2.0, 1.0, 4.0, -1.0, 0.0, -3.0, 2.0, 6.0]])
    prompt_mask, output_mask = seen_mask(prompt, 10)[None], seen_mask(output, 10)[None]
    penalties = torch.tensor([1.3])
    scale = torch.where(prompt_mask | output_mask, penalties[:, None], 1.0)
    vllm = logits * torch.where(logits > 0, 1.0 / scale, scale)
    ours = repetition_penalty(logits, prompt_mask | output_mask, penalties[:, None])
    torch.testing.assert_close(ours, vllm, rtol=1e-6, atol=0)
    assert ours[0, 9] < logits[0, 9] and ours[0, 2] < logits[0, 2] and ours[0, 0] == logits[0, 0]


def test_a_penalty_of_one_changes_no_bit() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 300) * 10
    logits[:, ::7] = -INF
    seen = torch.rand(4, 300) < 0.5
    assert torch.equal(repetition_penalty(logits, seen, 1.0), logits)
    assert torch.equal(repetition_penalty(logits, seen, torch.ones(4, 1)), logits)


def test_a_penalty_never_favours_a_seen_id() -> None:
    """Above 1, the odds of every seen id against every unseen one fall (stay, for a logit of exactly 0): a seen id's
    own probability may still rise when other seen ids lose more, but never against an unseen id."""
    torch.manual_seed(2)
    logits = torch.randn(200) * 3
    logits[5] = 0.0
    seen = torch.rand(200) < 0.3
    seen[5] = True
    after = repetition_penalty(logits, seen, 1.3)
    odds_before = logits[seen][:, None] - logits[~seen][None, :]  # log-odds, seen against unseen
    odds_after = after[seen][:, None] - after[~seen][None, :]
    moved = logits[seen] != 0
    assert bool((odds_after[moved] < odds_before[moved]).all())
    assert torch.equal(odds_after[~moved], odds_before[~moved])


@pytest.mark.parametrize("bad", [0, 0.0, -1.3, float("nan"), INF])
def test_sampling_options_refuse_a_penalty_that_is_not_a_positive_number(bad) -> None:
    with pytest.raises(ValueError, match="repetition_penalty must be a number > 0"):
        SamplingOptions(repetition_penalty=bad)


def test_sampling_options_default_to_no_penalty() -> None:
    assert SamplingOptions().repetition_penalty == 1.0
    assert SamplingOptions(repetition_penalty=1.3).repetition_penalty == 1.3


def test_orpheus_samples_with_upstreams_penalty_and_spark_with_none() -> None:
    """The family's grammar fills in 1.3 where the request kept the default, as it does temperature and top-p; a
    request's own penalty stays; Spark keeps the engine-wide 1.0."""
    from engine.families import family
    from engine.families.orpheus import OrpheusGrammar, grammar
    from engine.families.spark import SparkGrammar
    from engine.tokens import TokenIds

    orpheus = OrpheusGrammar(grammar.OrpheusIds(), lambda text: [])
    assert orpheus.sampling(SamplingOptions()).repetition_penalty == grammar.REPETITION_PENALTY == 1.3
    assert orpheus.sampling(SamplingOptions(repetition_penalty=1.1)).repetition_penalty == 1.1
    assert SparkGrammar(TokenIds(), lambda text: []).sampling(SamplingOptions()).repetition_penalty == 1.0
    assert family("orpheus").default_sampling.repetition_penalty == 1.3
    assert family("spark").default_sampling.repetition_penalty == 1.0


def test_only_a_family_with_a_penalty_gets_a_penalised_lane() -> None:
    from engine.factory import penalised

    assert penalised(SimpleNamespace(family="orpheus")) and not penalised(SimpleNamespace(family="spark"))


def test_the_vllm_generator_hands_vllm_the_penalty(monkeypatch) -> None:
    """SamplingParams gets the request's repetition_penalty (vLLM is not installed here: its two names are stood
    in for; tests/gpu runs the real one)."""
    from engine.backends.vllm_gen import VllmTokenGenerator

    made: list[dict] = []
    module = types.ModuleType("vllm.sampling_params")
    module.SamplingParams = lambda **kwargs: made.append(kwargs) or kwargs
    module.RequestOutputKind = SimpleNamespace(DELTA="delta")
    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm") or types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", module)
    gen = VllmTokenGenerator.__new__(VllmTokenGenerator)
    gen._stop_ids = [3]
    prompt = Prompt((1, 2), (5, 6, 7))
    gen._params(prompt, SamplingOptions(repetition_penalty=1.3, seed=4))
    gen._params(prompt, SamplingOptions())
    assert [m["repetition_penalty"] for m in made] == [1.3, 1.0]
    assert made[0]["seed"] == 4 and made[0]["temperature"] == 0.8
