"""Provides two vLLM (V1 model runner) logits processors: AllowedRunsLogitsProcessor restricts a request to runs of
allowed token ids, named in `SamplingParams.extra_args[ALLOWED_RUNS_KEY]` as [[lo, hi), ...];
TopKTopPLogitsProcessor applies top-k/top-p batch-invariantly (extra_args[TOP_K_TOP_P_KEY], see its docstring).

Why not `allowed_token_ids`: a semantic-only request allows 8195 ids. vLLM 0.26's V2 runner refuses more than
1024, and its V1 runner builds a bool row over the whole 166k vocabulary per request and copies the batch's
rows to the GPU whenever the batch changes: measured on an H200, time to first token with 128 requests started
together went from 39 ms (no restriction) to 680 ms. Here a request costs a few numbers, and each step adds one
cached bias row (-inf outside the runs) to the logits of each group of requests with the same runs: when one
group is the whole batch (the usual case), as one in-place broadcast add instead of a gather and a scatter.

Loaded by vLLM in its engine process by name (`LOGITS_PROCESSOR`); imports vLLM, so only that process and the
vLLM backend import it.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from engine.backends.vllm_gen import ALLOWED_RUNS_KEY, TOP_K_TOP_P_KEY

Runs = tuple[tuple[int, int], ...]


def _runs(params: Any, _prompt: Any = None, _output: Any = None) -> Runs | None:
    raw = (params.extra_args or {}).get(ALLOWED_RUNS_KEY)
    if raw is None:
        return None
    return tuple((int(lo), int(hi)) for lo, hi in raw)


class AllowedRunsLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.rows: dict[int, Runs] = {}
        """Persistent-batch index -> that request's allowed runs."""
        self._bias: dict[tuple[Runs, int], torch.Tensor] = {}
        self._groups: list[tuple[list[int], Runs]] | None = None
        """Requests with the same runs: (sorted batch indices, runs); rebuilt when the batch changes."""
        self._index: dict[tuple[int, ...], torch.Tensor] = {}
        """Those indices on the device, for groups that cover only part of the batch."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        raw = (sampling_params.extra_args or {}).get(ALLOWED_RUNS_KEY)
        if raw is None:
            return
        try:
            ok = bool(raw) and all(0 <= int(lo) < int(hi) for lo, hi in raw)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{ALLOWED_RUNS_KEY} must be a non-empty list of [lo, hi) pairs, got {raw!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if process_dict_updates(self.rows, batch_update, _runs):
            self._groups = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        if self._groups is None:
            by_runs: dict[Runs, list[int]] = {}
            for index, runs in self.rows.items():
                by_runs.setdefault(runs, []).append(index)
            self._groups = [(sorted(idx), runs) for runs, idx in by_runs.items()]
            self._index = {}
        rows = logits.shape[0]
        for index, runs in self._groups:
            bias = self._bias_row(runs, logits)
            if len(index) == rows and index[-1] == rows - 1:
                logits += bias  # the usual case (every request restricted alike): one broadcast add, no gather
            else:
                logits[self._device_index(index)] += bias
        return logits

    def _device_index(self, index: list[int]) -> torch.Tensor:
        key = tuple(index)
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = torch.tensor(index, dtype=torch.long).to(self.device, non_blocking=True)
        return found

    def _bias_row(self, runs: Runs, logits: torch.Tensor) -> torch.Tensor:
        key = (runs, logits.shape[-1])
        row = self._bias.get(key)
        if row is None or row.dtype != logits.dtype:
            if len(self._bias) > 256:  # a few distinct restrictions exist (semantic, globals, pitch, speed)
                self._bias.clear()
            row = torch.full((logits.shape[-1],), float("-inf"), dtype=logits.dtype, device=logits.device)
            for lo, hi in runs:
                row[lo:min(hi, logits.shape[-1])] = 0
            self._bias[key] = row
        return row


TopKP = tuple[int, float]


def _top_k_top_p(params: Any, _prompt: Any = None, _output: Any = None) -> TopKP | None:
    raw = (params.extra_args or {}).get(TOP_K_TOP_P_KEY)
    if raw is None:
        return None
    return int(raw[0]), float(raw[1])


class TopKTopPLogitsProcessor(LogitsProcessor):
    """Top-k then top-p (nucleus) masking whose result for a row never depends on the other rows, for
    `VllmTokenGenerator.batch_invariant`. vLLM runs it where it runs its own top-k/top-p: after the temperature
    (argmax-invariant processors come after it), before sampling. Top-k keeps every logit >= the k-th largest
    (torch.topk selects exact values); top-p keeps the largest of those while the mass before them is < p, with
    the mass computed in float64 over the k survivors only (tiny, and far from any rounding boundary)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.rows: dict[int, TopKP] = {}
        """Persistent-batch index -> that request's (top_k, top_p)."""
        self._groups: list[tuple[list[int], TopKP]] | None = None
        self._index: dict[tuple[int, ...], torch.Tensor] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        raw = (sampling_params.extra_args or {}).get(TOP_K_TOP_P_KEY)
        if raw is None:
            return
        try:
            ok = len(raw) == 2 and int(raw[0]) >= 0 and 0 < float(raw[1]) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{TOP_K_TOP_P_KEY} must be [top_k >= 0, 0 < top_p <= 1], got {raw!r}")

    def is_argmax_invariant(self) -> bool:
        return True  # the most likely token always survives, so greedy requests may skip it

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if process_dict_updates(self.rows, batch_update, _top_k_top_p):
            self._groups = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        if self._groups is None:
            by_knobs: dict[TopKP, list[int]] = {}
            for index, knobs in self.rows.items():
                by_knobs.setdefault(knobs, []).append(index)
            self._groups = [(sorted(idx), knobs) for knobs, idx in by_knobs.items()]
            self._index = {}
        rows = logits.shape[0]
        for index, (k, p) in self._groups:
            if len(index) == rows and index[-1] == rows - 1:
                mask_top_k_top_p(logits, k, p)
            else:
                at = self._index.get(tuple(index))
                if at is None:
                    at = self._index[tuple(index)] = torch.tensor(index, dtype=torch.long).to(self.device)
                part = logits[at]
                mask_top_k_top_p(part, k, p)
                logits[at] = part
        return logits


def mask_top_k_top_p(logits: torch.Tensor, k: int, p: float) -> None:
    """In place: -inf for every logit outside each row's top-k, then outside its top-p nucleus."""
    vocab = logits.shape[-1]
    k = vocab if k <= 0 else min(k, vocab)
    if k == vocab and p >= 1.0:
        return
    top = torch.topk(logits, k, dim=-1).values  # [rows, k], descending
    if p < 1.0:
        x = top.double()
        e = torch.exp(x - x[:, :1])
        probs = e / e.sum(dim=-1, keepdim=True)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each one
        keep = (before < p).sum(dim=-1).clamp(min=1)  # the first token always stays
        threshold = top.gather(1, (keep - 1).unsqueeze(1))
    else:
        threshold = top[:, -1:]
    logits.masked_fill_(logits < threshold, float("-inf"))
