"""Issue 37's budget for `voicectl say` through a warm server on the 2-core CPU with the tiny checkpoint: from the
launch of a fresh process to its first sound in the PulseAudio null sink, 0.2 s at most (the median of several, so
that one run slowed by the machine does not decide). docs/startup.md has the breakdown behind it.

Each run is a fresh `python -m voiceapp.cli say` (what the `voicectl` script runs), timed at the sink's monitor: the
capture's position when the process is launched to its first non-zero sample. The capture lags the sink by its
fragment (10 ms), so the figure is if anything too large. The processes compile no bytecode at launch: one untimed
run first writes it (to a private cache folder, PYTHONPYCACHEPREFIX), as an installed package has it from pip; that
run is also the warm server's first request, as the `say` that started it would have been.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

from tests.audio.test_lean_say import warm_server  # noqa: F401  (the lean road's warm server)

BUDGET_S = 0.2
"""Launch to first sound, the median of RUNS fresh processes (issue 37's target on the 2-core CPU)."""
HEARD_AFTER_QUEUED_S = 0.05
"""The first sound after the client queued its first audio (its `--json` phase "queued"), median: the stream starts
on its pre-roll, primed from it, where a stream started at open had up to its latency (0.1 s) of silence ahead of it.
Loose: "queued" counts from the process's start as /proc gives it (10 ms steps)."""
ENGINE_S = 0.07
"""The budget describes the 2-core machine at its usual speed, where the warm tiny checkpoint's own first audio (the
client's `ttfa_ms`, request to first audio) is 34-45 ms (docs/integrations.md). Where it is past this, the host is
slower than that machine (a shared host under load has doubled it, with every launch slowed alike), and the budget
is not judged there: the test says so as a skip naming the figures. `python -m lab.startup --synthetic tiny --cases
say_autostart` measures the same on any host (docs/startup.md)."""
RUNS = 5
TEXT = "The quick brown fox jumps over the lazy dog."
SAY = ["--seed", "3", "--max-tokens", "60", "--json"]
"""A short utterance (the tiny checkpoint speaks noise until its token cap): each run ends soon after its start."""
RATE = 16000
"""The default sink's rate (tests/audio/conftest.py), the tiny checkpoint's."""


def launch_to_first_sound_s(cap, argv: list[str], env: dict[str, str]) -> tuple[float, dict]:
    """Seconds from launching `argv` to its first non-zero sample in the capture, and its `--json` line."""
    start = cap.frames_so_far()
    proc = subprocess.run(argv, capture_output=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    heard = np.flatnonzero(np.fromfile(cap.path, np.float32, offset=4 * start))
    assert len(heard), "no sound reached the sink"
    return heard[0] / RATE, json.loads(proc.stdout.decode().strip().splitlines()[-1])


@pytest.mark.audio
@pytest.mark.serial  # a launch-to-first-sound budget
def test_say_through_a_warm_server_is_heard_within_the_budget(pulse_server, record_monitor, tiny_model,
                                                              warm_server, tmp_path):
    env, server_pid = warm_server
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **env,
           "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    argv = [sys.executable, "-m", "voiceapp.cli", "say", TEXT, "--model", str(tiny_model), *SAY]
    runs, after_queued, engine = [], [], []
    with record_monitor("tts16") as cap:
        launch_to_first_sound_s(cap, argv, env)  # untimed: the bytecode, and the server's first request
        for _ in range(RUNS):
            seconds, stats = launch_to_first_sound_s(cap, argv, env)
            assert stats["server_pid"] == server_pid, stats
            assert stats["underruns"] == 0 and stats["device_underruns"] == 0, stats  # no gap bought the speed
            runs.append(seconds)
            after_queued.append(seconds - stats["phases"]["queued"])
            engine.append(stats["ttfa_ms"] / 1000)
    median = statistics.median(runs)
    assert statistics.median(after_queued) <= HEARD_AFTER_QUEUED_S, ("first sound after the first audio queued (ms): "
                                                                     f"{[round(s * 1000) for s in after_queued]}")
    if statistics.median(engine) > ENGINE_S:
        pytest.skip(f"this host is slower than the budget's machine: the server's own first audio took "
                    f"{statistics.median(engine) * 1000:.0f} ms (usual: 34-45), launch to first sound "
                    f"{median * 1000:.0f} ms; the 0.2 s budget is not judged here")
    assert median <= BUDGET_S, (f"launch to first sound {median * 1000:.0f} ms (median of {RUNS}; runs "
                                f"{', '.join(f'{s * 1000:.0f}' for s in runs)} ms; load {os.getloadavg()[0]:.1f})")
