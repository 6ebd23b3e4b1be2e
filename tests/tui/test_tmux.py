"""The real `voicectl tui` in a real terminal: tmux, detached, fixed size, driven by send-keys."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from voiceapp.tmux import Tmux
from voiceapp.tui.history import METRICS_LOG_ENV

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def voicectl() -> list[str]:
    script = Path(sys.executable).with_name("voicectl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "voiceapp.cli"]


def wait_for(tmux: Tmux, predicate, what: str, timeout: float = 20.0) -> str:
    screen = tmux.wait_for(predicate, timeout)
    assert screen is not None, f"timed out waiting for {what}; screen:\n{tmux.screen()}"
    return screen


def test_voicectl_tui_in_tmux(tmp_path):
    out = tmp_path / "wavs"
    rc_file = tmp_path / "rc"
    command = " ".join(shlex.quote(a) for a in [*voicectl(), "tui", "--backend", "fake", "--out-dir", str(out)])
    shell = f"{command}; echo $? > {shlex.quote(str(rc_file))}"  # (Textual draws on stderr: keep it on the pane)
    metrics = tmp_path / "metrics.jsonl"
    tmux = Tmux(f"voiceapp-test-{tmp_path.name}", {**os.environ, METRICS_LOG_ENV: str(metrics)})
    try:
        tmux.start(shell, width=100, height=30, cwd=tmp_path)
        wait_for(tmux, lambda s: "ready" in s and "history" in s, "the app to be ready")
        time.sleep(0.5)                                  # let start-up finish before typing (doc: key races)
        tmux.keys("-l", "Hello from tmux.")
        wait_for(tmux, lambda s: "Hello from tmux." in s, "the typed text")
        tmux.keys("Enter")
        screen = wait_for(tmux, lambda s: any("done" in line and "Hello from tmux." in line
                                              for line in s.splitlines()), "the utterance in the history")
        assert "#1 done" in screen                       # the metrics panel
        assert [p.name for p in out.iterdir()] == ["utterance-0001.wav"]
        record = json.loads(metrics.read_text())                 # one line: the start-up benchmark's observable
        assert record["status"] == "done" and record["process_ttfa_ms"] > record["ttfa_ms"] > 0
        tmux.keys("C-q")
        deadline = time.monotonic() + 15
        while not rc_file.exists() or not rc_file.read_text().strip():
            assert time.monotonic() < deadline, f"the app did not exit; screen:\n{tmux.screen()}"
            time.sleep(0.1)
        assert rc_file.read_text().strip() == "0"
    finally:
        tmux.close()
