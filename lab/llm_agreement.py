"""Provides the quality bound of a quantised LLM: its next-token distributions against the fp32 model's.

Both models are fed the same tokens (teacher forcing): real prompts (globals-prefixed, as the pipeline builds
them) and a continuation sampled from the reference with the default sampling options. At every position the
two distributions over the allowed ids (semantic + stop: what sampling chooses from) are compared: KL(reference
|| candidate) in nats, and how many of the reference's top-k ids are in the candidate's top k. Used by
lab/cpu_int8_probe.py (full-size checkpoint) and tests/model/test_int8_llm.py (tiny checkpoint).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch

from engine.config import SamplingOptions
from engine.prompt import Prompt, build_globals_prompt
from engine.tokens import GLOBAL_CODEBOOK, GLOBAL_COUNT, TokenIds

SENTENCES = (
    "In the year 1878 I took my degree of Doctor of Medicine of the University of London.",
    "Sherlock Holmes rose and lit his pipe, watching the rain on the window.",
    "Is it true that the train leaves at half past nine, or did I read the timetable wrong?",
    "She laughed, then whispered: we will be home before the lamps are lit.",
    "The results were clear: forty-two percent faster, and not a single error in the logs.",
)
"""Prompt texts: statements, a question, dialogue, numbers."""


FULL_BOUND = {"kl_mean": 1e-3, "kl_max": 2e-3, "topk_mean": 0.90, "topk_min": 0.75}
"""What the int8 LLM must keep on the full-size synthetic checkpoint (5 prompts x 200 positions); what it keeps,
and what the alternatives kept: docs/cpu.md."""
TINY_BOUND = {"kl_mean": 5e-6, "kl_max": 1e-5, "topk_mean": 0.97, "topk_min": 0.90}
"""The same on the tiny checkpoint (5 prompts x 40 positions: tests/model/test_int8_llm.py). Its logits are nearly
flat (2 layers of std-0.02 weights), so KL is small for any perturbation and the top-50 overlap among 8195 close
logits is the sharp test: layers rounded to a 4-bit grid instead fail it."""


@dataclass(frozen=True, slots=True)
class Agreement:
    """How close a candidate's next-token distributions are to the reference's."""

    positions: int
    kl_mean: float
    """Mean KL(reference || candidate), nats."""
    kl_max: float
    topk_mean: float
    """Mean share of the reference's top-k ids that are in the candidate's top k."""
    topk_min: float
    top1: float
    """Share of positions whose most likely id is the same."""
    k: int

    def within(self, bound: dict[str, float]) -> bool:
        """KL no larger and top-k overlap no smaller than `bound`'s (FULL_BOUND, TINY_BOUND)."""
        return (self.kl_mean <= bound["kl_mean"] and self.kl_max <= bound["kl_max"]
                and self.topk_mean >= bound["topk_mean"] and self.topk_min >= bound["topk_min"])

    def as_dict(self) -> dict[str, Any]:
        return {key: float(f"{v:.4g}") if isinstance(v, float) else v for key, v in asdict(self).items()}


def agreement(reference: torch.Tensor, candidate: torch.Tensor, k: int = 50) -> Agreement:
    """Compare logits [N, A] position by position (see the module docstring)."""
    ref, cand = reference.double().log_softmax(-1), candidate.double().log_softmax(-1)
    kl = (ref.exp() * (ref - cand)).sum(-1)
    top_ref, top_cand = reference.topk(k, -1).indices, candidate.topk(k, -1).indices
    overlap = (top_ref[:, :, None] == top_cand[:, None, :]).any(-1).double().mean(-1)
    top1 = (reference.argmax(-1) == candidate.argmax(-1)).double().mean()
    return Agreement(positions=reference.shape[0], kl_mean=float(kl.mean()), kl_max=float(kl.max()),
                     topk_mean=float(overlap.mean()), topk_min=float(overlap.min()), top1=float(top1), k=k)


def real_prompts(ids: TokenIds, encode: Callable[[str], list[int]], count: int = len(SENTENCES)) -> list[Prompt]:
    """Globals-prefixed prompts of SENTENCES (fixed pseudo-random globals per sentence: a voice of random weights
    is random codes either way)."""
    prompts = []
    for i in range(count):
        rng = random.Random(i)
        codes = [rng.randrange(GLOBAL_CODEBOOK) for _ in range(GLOBAL_COUNT)]
        prompts.append(build_globals_prompt(SENTENCES[i % len(SENTENCES)], codes, ids, encode))
    return prompts


def logits(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits [A] of a hidden state [H] over `head` (a model's `head_rows`: rows [A, H], or a callable) as
    TorchTokenGenerator computes them."""
    return head(hidden) if callable(head) else (head @ hidden.to(head.dtype)).float()


@torch.inference_mode()
def teacher_forced_logits(model: Any, allowed: torch.Tensor, prompt: Sequence[int],
                          fed: Sequence[int]) -> torch.Tensor:
    """fp32 logits over the `allowed` ids [len(fed) + 1, A]: after the prompt, then after each id of `fed`, stepped
    one token at a time as the generator decodes (`model`: StaticQwen2 or OrtQwen2)."""
    head, n = model.head_rows(allowed), len(prompt)
    cache = model.new_cache(n + len(fed) + 1)
    rows = [logits(head, model.forward(torch.tensor(prompt), torch.arange(n), n, cache)[-1])]
    for i, token in enumerate(fed):
        pos = n + i
        rows.append(logits(head, model.forward(torch.tensor([token]), torch.tensor([pos]), pos + 1, cache)[0]))
    return torch.stack(rows)


@dataclass(frozen=True, slots=True)
class ReferenceRun:
    """One prompt as the reference model continued it."""

    prompt: tuple[int, ...]
    allowed: torch.Tensor
    fed: list[int]
    """The ids it sampled after the prompt (all but the last position's)."""
    logits: torch.Tensor
    """Its logits over `allowed` [len(fed) + 1, A]: after the prompt and after each id of `fed`."""


@torch.inference_mode()
def reference_runs(model: Any, prompts: Sequence[Prompt], length: int, seed: int = 0) -> list[ReferenceRun]:
    """Each prompt continued by the reference (StaticQwen2 in fp32): `length` positions each, the ids sampled with
    the default options, one step at a time as the generator decodes."""
    from engine.backends.torch_gen import sample_token

    runs = []
    for index, prompt in enumerate(prompts):
        allowed = torch.tensor(prompt.allowed_ids)
        head = model.head_rows(allowed)
        generator, fed, rows = torch.Generator().manual_seed(seed + index), [], []
        n = len(prompt.ids)
        cache = model.new_cache(n + length)
        hidden = model.forward(torch.tensor(prompt.ids), torch.arange(n), n, cache)[-1]
        while True:
            rows.append(logits(head, hidden))
            if len(rows) == length:
                break
            fed.append(int(allowed[sample_token(rows[-1], SamplingOptions(), generator)]))
            pos = n + len(fed) - 1
            hidden = model.forward(torch.tensor(fed[-1:]), torch.tensor([pos]), pos + 1, cache)[0]
        runs.append(ReferenceRun(prompt.ids, allowed, fed, torch.stack(rows)))
    return runs


@torch.inference_mode()
def rows_forced_logits(model: Any, runs: Sequence[ReferenceRun]) -> list[torch.Tensor]:
    """`teacher_forced_logits` of every run at once, as the generator steps requests together: each prompt alone into
    its row of one `new_rows` cache, then each position of every run in one `forward_rows` step (OrtQwen2). The runs
    must feed as many ids each."""
    if len({len(run.fed) for run in runs}) != 1:
        raise ValueError("rows_forced_logits steps runs of one length side by side")
    keys, values = model.new_rows(len(runs), max(len(run.prompt) + len(run.fed) + 1 for run in runs))
    heads = [model.head_rows(run.allowed) for run in runs]
    rows = []
    for r, run in enumerate(runs):
        n = len(run.prompt)
        hidden = model.forward(torch.tensor(run.prompt), torch.arange(n), n, (keys[:, r], values[:, r]))[-1]
        rows.append([logits(heads[r], hidden)])
    for i in range(len(runs[0].fed)):
        ids = torch.tensor([run.fed[i] for run in runs])
        hidden = model.forward_rows(ids, [len(run.prompt) + i + 1 for run in runs], (keys, values))
        for r, state in enumerate(hidden):
            rows[r].append(logits(heads[r], state))
    return [torch.stack(each) for each in rows]


def compare(candidate: Any, runs: Sequence[ReferenceRun], k: int = 50, side_by_side: bool = False) -> Agreement:
    """Agreement of `candidate` (StaticQwen2 / OrtQwen2 over the same checkpoint) with the reference's runs, fed
    the same ids: one run at a time, or (`side_by_side`, OrtQwen2) all of them stepping together."""
    if side_by_side:
        cands = rows_forced_logits(candidate, runs)
    else:
        cands = [teacher_forced_logits(candidate, run.allowed, run.prompt, run.fed) for run in runs]
    return agreement(torch.cat([run.logits for run in runs]), torch.cat(cands), k)
