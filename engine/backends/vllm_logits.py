"""Provides a vLLM (V1 model runner) logits processor: AllowedRunsLogitsProcessor restricts a request to runs of
allowed token ids, named in `SamplingParams.extra_args[ALLOWED_RUNS_KEY]` as [[lo, hi), ...].

Why not `allowed_token_ids`: a semantic-only request allows 8195 ids. vLLM 0.26's V2 runner refuses more than
1024, and its V1 runner builds a bool row over the whole 166k vocabulary per request and copies the batch's
rows to the GPU whenever the batch changes, which made a crowd's time to first token many times longer than with
no restriction. Here a request costs a few numbers, and each step adds one
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

from engine.backends.vllm_gen import ALLOWED_RUNS_KEY

Runs = tuple[tuple[int, int], ...]


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
            for row, setting in self.rows.items():
                by_setting.setdefault(setting, []).append(row)
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
