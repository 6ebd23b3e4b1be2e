"""The real `voicectl tui` in a real terminal: tmux, detached, fixed size, driven by send-keys."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def voicectl() -> list[str]:
    script = Path(sys.executable).with_name("voicectl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "voiceapp.cli"]


class Tmux:
    """One private tmux server (its own socket) holding one session named `app`."""

    def __init__(self, socket: str) -> None:
        self.base = ["tmux", "-u", "-L", socket]
        # The server passes its environment on to the app. COLUMNS/LINES (set by the snapshot plugin) would
        # override the pane's real size in shutil.get_terminal_size, so they must not reach it.
        self.env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        self.socket = ""

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, check=check, env=self.env,
                              stdin=subprocess.DEVNULL, start_new_session=True, timeout=20)

    def start(self, *args: str) -> None:
        self.run("new-session", "-d", "-s", "app", *args)
        self.socket = self.run("display-message", "-p", "#{socket_path}", check=False).stdout.strip()

    def close(self) -> None:
        """Kill the server and remove its socket file (a server that exits leaves it behind)."""
        self.run("kill-server", check=False)
        if self.socket:
            Path(self.socket).unlink(missing_ok=True)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "app", check=False).stdout

    def wait_for(self, predicate, what: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}")
            time.sleep(0.1)


def test_voicectl_tui_in_tmux(tmp_path):
    out = tmp_path / "wavs"
    rc_file = tmp_path / "rc"
    command = " ".join(shlex.quote(a) for a in [*voicectl(), "tui", "--backend", "fake", "--out-dir", str(out)])
    shell = f"{command}; echo $? > {shlex.quote(str(rc_file))}"  # (Textual draws on stderr: keep it on the pane)
    tmux = Tmux(f"voiceapp-test-{tmp_path.name}")
    try:
        tmux.start("-x", "100", "-y", "30", "-c", str(tmp_path), shell)
        tmux.wait_for(lambda s: "ready" in s and "history" in s, "the app to be ready")
        time.sleep(0.5)                                  # let start-up finish before typing (doc: key races)
        tmux.run("send-keys", "-t", "app", "-l", "Hello from tmux.")
        tmux.wait_for(lambda s: "Hello from tmux." in s, "the typed text")
        tmux.run("send-keys", "-t", "app", "Enter")
        screen = tmux.wait_for(lambda s: any("done" in line and "Hello from tmux." in line
                                             for line in s.splitlines()), "the utterance in the history")
        assert "#1 done" in screen                       # the metrics panel
        assert [p.name for p in out.iterdir()] == ["utterance-0001.wav"]
        tmux.run("send-keys", "-t", "app", "C-q")
        deadline = time.monotonic() + 15
        while not rc_file.exists() or not rc_file.read_text().strip():
            assert time.monotonic() < deadline, f"the app did not exit; screen:\n{tmux.screen()}"
            time.sleep(0.1)
        assert rc_file.read_text().strip() == "0"
    finally:
        tmux.close()
