"""AllowedRunsLogitsProcessor.apply on CPU tensors. vLLM is not installed here, so its two base names are stubbed
(the class only subclasses LogitsProcessor and uses process_dict_updates in update_state, not tested here);
tests/gpu runs the processor inside real vLLM."""
import sys
import types

import pytest
import torch


def _added_only(entries, update, new_state):
    """Stand-in for vLLM's process_dict_updates, for additions only (what these tests send)."""
    if not update:
        return False
    for index, params, prompt, output in update.added:
        entries[index] = new_state(params, prompt, output)
    return True


@pytest.fixture
def processor(monkeypatch):
    names = ["vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor",
             "vllm.v1.sample.logits_processor.builtin"]
    for name in names:
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    lp = sys.modules["vllm.v1.sample.logits_processor"]
    if not hasattr(lp, "LogitsProcessor"):
        monkeypatch.setattr(lp, "LogitsProcessor", object, raising=False)
        monkeypatch.setattr(lp, "BatchUpdate", object, raising=False)
        monkeypatch.setattr(sys.modules["vllm.v1.sample.logits_processor.builtin"], "process_dict_updates",
                            _added_only, raising=False)
    monkeypatch.delitem(sys.modules, "engine.backends.vllm_logits", raising=False)
    from engine.backends.vllm_logits import AllowedRunsLogitsProcessor

    yield AllowedRunsLogitsProcessor(None, torch.device("cpu"), False)
    sys.modules.pop("engine.backends.vllm_logits", None)  # it was bound to the stubs


@pytest.fixture
def module(processor):
    return sys.modules["engine.backends.vllm_logits"]


def _allowed(row: torch.Tensor) -> list[int]:
    return torch.nonzero(torch.isfinite(row)).flatten().tolist()


def test_whole_batch_restricted_alike(processor):
    processor.rows = {0: ((2, 5), (9, 10)), 1: ((2, 5), (9, 10)), 2: ((2, 5), (9, 10))}
    logits = torch.randn(3, 12)
    before = logits.clone()
    out = processor.apply(logits)
    for r in range(3):
        assert _allowed(out[r]) == [2, 3, 4, 9]
        assert torch.equal(out[r, [2, 3, 4, 9]], before[r, [2, 3, 4, 9]])


def test_mixed_batch_each_row_gets_its_own_runs(processor):
    processor.rows = {0: ((0, 3),), 2: ((5, 7),), 3: ((0, 3),)}  # row 1 is unrestricted
    logits = torch.randn(4, 8)
    before = logits.clone()
    out = processor.apply(logits)
    assert _allowed(out[0]) == [0, 1, 2] and _allowed(out[3]) == [0, 1, 2]
    assert _allowed(out[2]) == [5, 6]
    assert torch.equal(out[1], before[1])


def test_groups_follow_batch_changes(processor):
    processor.rows = {0: ((0, 2),), 1: ((0, 2),)}
    processor.apply(torch.randn(2, 6))
    processor.rows = {0: ((0, 2),), 1: ((4, 6),)}
    processor._groups = None  # what update_state does when the batch changed
    out = processor.apply(torch.randn(2, 6))
    assert _allowed(out[0]) == [0, 1] and _allowed(out[1]) == [4, 5]


def test_fewer_rows_than_logits_is_not_the_broadcast_case(processor):
    processor.rows = {0: ((0, 2),), 1: ((0, 2),)}
    logits = torch.randn(3, 4)
    before = logits.clone()
    out = processor.apply(logits)
    assert _allowed(out[0]) == [0, 1] and _allowed(out[1]) == [0, 1]
    assert torch.equal(out[2], before[2])


def test_settings_come_from_extra_args_and_bad_ones_are_refused(module):
    from engine.backends.vllm_gen import ALLOWED_RUNS_KEY

    params = types.SimpleNamespace(extra_args={ALLOWED_RUNS_KEY: [[2, 4]]})
    update = types.SimpleNamespace(added=[(0, params, [], [])], removed=[], moved=[])
    runs = module.AllowedRunsLogitsProcessor(None, torch.device("cpu"), False)
    runs.update_state(update)
    assert runs.rows == {0: ((2, 4),)}
    out = runs.apply(torch.tensor([[9.0, 0.0, 1.0, 2.0, 8.0]]))
    assert _allowed(out[0]) == [2, 3]
    for bad in ([[4, 2]], [], "x"):
        with pytest.raises(ValueError):
            module.AllowedRunsLogitsProcessor.validate_params(
                types.SimpleNamespace(extra_args={module.AllowedRunsLogitsProcessor.KEY: bad}))
    module.AllowedRunsLogitsProcessor.validate_params(types.SimpleNamespace(extra_args=None))  # not ours: accepted
