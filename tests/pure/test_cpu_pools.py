"""How a CPU engine shares its cores (factory.cpu_pools), which windows it decodes in (WindowSchedule.finer) and the
audio of each window the pacer plans with (factory.windows_s)."""
import pytest

from engine.cpu_pools import SPLIT_CORES, CpuPools, cpu_pools
from engine.factory import EngineConfig, _schedule, windows_s
from engine.windowing import WindowSchedule


@pytest.mark.parametrize("cores", [1, 2, 4, SPLIT_CORES - 1])
def test_few_cores_are_shared_by_both_pools_which_sleep(cores):
    assert cpu_pools(EngineConfig(), cores) == CpuPools(None, None, False)


@pytest.mark.parametrize("cores, torch, llm", [(SPLIT_CORES, 4, 4), (9, 5, 4), (16, 8, 8), (64, 32, 32)])
def test_many_cores_are_split_and_the_llm_spins_on_its_half(cores, torch, llm):
    assert cpu_pools(EngineConfig(), cores) == CpuPools(torch, llm, True)


def test_an_fp32_llm_steps_in_torchs_pool_so_nothing_is_split():
    assert cpu_pools(EngineConfig(quantize="none"), 16) == CpuPools(None, None, False)
    assert cpu_pools(EngineConfig(quantize="none", threads=16), 16) == CpuPools(16, None, False)


def test_what_the_user_sets_wins_and_spins_only_without_overlap():
    assert cpu_pools(EngineConfig(threads=16), 16) == CpuPools(16, 16, False)
    assert cpu_pools(EngineConfig(threads=6, llm_threads=10), 16) == CpuPools(6, 10, True)
    assert cpu_pools(EngineConfig(threads=8, llm_threads=10), 16) == CpuPools(8, 10, False)
    assert cpu_pools(EngineConfig(llm_threads=1), 2) == CpuPools(None, 1, False)


def test_the_finer_schedule_only_where_the_decoder_has_cores_of_its_own(monkeypatch):
    monkeypatch.setattr("engine.factory.usable_cores", lambda: 16)
    assert _schedule(EngineConfig(), may_lag=True) == WindowSchedule().finer()
    assert _schedule(EngineConfig(), may_lag=False) == WindowSchedule()  # a GPU engine
    own = WindowSchedule(new=24)
    assert _schedule(EngineConfig(schedule=own), may_lag=True) == own  # the user's
    monkeypatch.setattr("engine.factory.usable_cores", lambda: 2)
    assert _schedule(EngineConfig(), may_lag=True) == WindowSchedule()


def test_windows_in_seconds_up_to_the_largest():
    class Decoder:
        samples_per_code, sample_rate = 320, 16000

    assert windows_s(WindowSchedule(), Decoder()) == pytest.approx((0.08, 0.24, 0.48, 0.96, 1.92))
    finer = windows_s(WindowSchedule().finer(), Decoder())
    assert finer[-1] == pytest.approx(64 * 0.02) and len(finer) > 5
    assert all(a <= b for a, b in zip(finer, finer[1:]))
