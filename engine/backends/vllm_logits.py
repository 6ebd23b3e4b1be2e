"""Provides two vLLM (V1 model runner) logits processors: AllowedRunsLogitsProcessor restricts a request to runs of
allowed token ids, named in `SamplingParams.extra_args[ALLOWED_RUNS_KEY]` as [[lo, hi), ...];
TopKTopPLogitsProcessor applies top-k/top-p batch-invariantly (extra_args[TOP_K_TOP_P_KEY], see its docstring).

Why not `allowed_token_ids`: a semantic-only request allows 8195 ids. vLLM 0.26's V2 runner refuses more than
1024, and its V1 runner builds a bool row over the whole 166k vocabulary per request and copies the batch's
rows to the GPU whenever the batch changes: measured on an H200, time to first token with 128 requests started
together went from 39 ms (no restriction) to 680 ms. Here a request costs a few numbers, and each step adds one
cached bias row (-inf outside the runs) to the logits of each group of requests with the same runs: when one
group is the whole batch (the usual case), as one in-place broadcast add instead of a gather and a scatter.

Loaded by vLLM in its engine process by name (`engine.backends.vllm_gen.LOGITS_PROCESSORS`); imports vLLM, so
only that process and the vLLM backend import it.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from engine.backends.vllm_gen import ALLOWED_RUNS_KEY, TOP_K_TOP_P_KEY

Runs = tuple[tuple[int, int], ...]
TopKP = tuple[int, float]


class _PerRequestProcessor(LogitsProcessor):
    """A processor whose requests each carry a small hashable setting in `extra_args[KEY]`; each step it works
    on the rows of each group of requests with the same setting, as one in-place operation over the whole
    batch when one group is the whole batch (the usual case), else through a cached device index."""

    KEY = ""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.rows: dict[int, Any] = {}
        """Persistent-batch index -> that request's setting."""
        self._groups: list[tuple[list[int], Any]] | None = None
        """Requests with the same setting: (sorted batch indices, setting); rebuilt when the batch changes."""
        self._index: dict[tuple[int, ...], torch.Tensor] = {}
        """Those indices on the device, for groups that cover only part of the batch."""

    @classmethod
    def setting(cls, raw: Any) -> Any:
        """The request's raw extra_args value as a hashable setting; raises ValueError if malformed."""
        raise NotImplementedError

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        raw = (sampling_params.extra_args or {}).get(cls.KEY)
        if raw is not None:
            cls.setting(raw)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def state(params: Any, _prompt: Any = None, _output: Any = None) -> Any:
            raw = (params.extra_args or {}).get(self.KEY)
            return None if raw is None else self.setting(raw)

        if process_dict_updates(self.rows, batch_update, state):
            self._groups = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        if self._groups is None:
            by_setting: dict[Any, list[int]] = {}
            for index, setting in self.rows.items():
                by_setting.setdefault(setting, []).append(index)
            self._groups = [(sorted(idx), setting) for setting, idx in by_setting.items()]
            self._index = {}
        rows = logits.shape[0]
        for index, setting in self._groups:
            if len(index) == rows and index[-1] == rows - 1:
                self.apply_rows(logits, setting)
            else:
                at = self._device_index(index)
                part = logits[at]
                self.apply_rows(part, setting)
                logits[at] = part
        return logits

    def apply_rows(self, logits: torch.Tensor, setting: Any) -> None:
        """In place, on rows that all have `setting`."""
        raise NotImplementedError

    def _device_index(self, index: list[int]) -> torch.Tensor:
        key = tuple(index)
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = torch.tensor(index, dtype=torch.long).to(self.device, non_blocking=True)
        return found


class AllowedRunsLogitsProcessor(_PerRequestProcessor):
    """-inf outside the request's allowed runs: one cached bias row per setting, added in place."""

    KEY = ALLOWED_RUNS_KEY

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self._bias: dict[tuple[Runs, int], torch.Tensor] = {}

    @classmethod
    def setting(cls, raw: Any) -> Runs:
        try:
            runs = tuple((int(lo), int(hi)) for lo, hi in raw)
        except (TypeError, ValueError):
            runs = ()
        if not runs or not all(0 <= lo < hi for lo, hi in runs):
            raise ValueError(f"{ALLOWED_RUNS_KEY} must be a non-empty list of [lo, hi) pairs, got {raw!r}")
        return runs

    def is_argmax_invariant(self) -> bool:
        return False

    def apply_rows(self, logits: torch.Tensor, setting: Runs) -> None:
        logits += self._bias_row(setting, logits)

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


class TopKTopPLogitsProcessor(_PerRequestProcessor):
    """Top-k then top-p (nucleus) masking whose result for a row never depends on the other rows, for
    `VllmTokenGenerator.batch_invariant`. vLLM runs it where it runs its own top-k/top-p: after the temperature
    (argmax-invariant processors come after it), before sampling. Top-k keeps every logit >= the k-th largest
    (torch.topk selects exact values); top-p keeps the largest of those while the mass before them is < p, with
    the mass computed in float64 over the k survivors only (tiny, and far from any rounding boundary)."""

    KEY = TOP_K_TOP_P_KEY

    @classmethod
    def setting(cls, raw: Any) -> TopKP:
        try:
            k, p = int(raw[0]), float(raw[1])
            ok = len(raw) == 2 and k >= 0 and 0 < p <= 1
        except (TypeError, ValueError, IndexError):
            ok = False
        if not ok:
            raise ValueError(f"{TOP_K_TOP_P_KEY} must be [top_k >= 0, 0 < top_p <= 1], got {raw!r}")
        return k, p

    def is_argmax_invariant(self) -> bool:
        return True  # the most likely token always survives, so greedy requests may skip it

    def apply_rows(self, logits: torch.Tensor, setting: TopKP) -> None:
        mask_top_k_top_p(logits, *setting)


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
