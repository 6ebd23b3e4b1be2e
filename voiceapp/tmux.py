"""Provides Tmux: one program in a real terminal (a detached tmux session of a private tmux server), driven by
keystrokes and read back as screen text. The start-up benchmark times the TUI through it; the tmux tests use it."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping

TMUX_CALL_S = 20.0
"""Longest one tmux command may take."""
SCREEN_POLL_S = 0.1
"""How often wait_for reads the screen."""


class Tmux:
    """A private tmux server (its own socket name, so the user's sessions are never touched) holding one session,
    `app`. The server passes its environment on to the program: `env` (default: this process's)."""

    def __init__(self, name: str, env: Mapping[str, str] | None = None) -> None:
        self.base = ["tmux", "-u", "-f", "/dev/null", "-L", name]  # no user config: the same terminal everywhere
        # COLUMNS/LINES (set by pytest's snapshot plugin, for one) would override the pane's real size in
        # shutil.get_terminal_size, so they must not reach the program.
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in ("COLUMNS", "LINES")}
        self.socket = ""

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """One tmux command on this server."""
        return subprocess.run([*self.base, *args], capture_output=True, text=True, check=check, env=self.env,
                              stdin=subprocess.DEVNULL, start_new_session=True, timeout=TMUX_CALL_S)

    def start(self, command: str, width: int = 100, height: int = 30, cwd: str | Path | None = None) -> None:
        """Run the shell `command` in a new detached session of this size."""
        self.run("new-session", "-d", "-s", "app", "-x", str(width), "-y", str(height),
                 *(("-c", str(cwd)) if cwd is not None else ()), command)
        self.socket = self.run("display-message", "-p", "#{socket_path}", check=False).stdout.strip()

    def keys(self, *keys: str) -> None:
        """send-keys to the session (`-l TEXT` sends TEXT literally)."""
        self.run("send-keys", "-t", "app", *keys)

    def screen(self) -> str:
        """The visible screen as text ("" once the session is gone)."""
        return self.run("capture-pane", "-p", "-t", "app", check=False).stdout

    def alive(self) -> bool:
        """Whether the session (the program in it) still runs."""
        return self.run("has-session", "-t", "app", check=False).returncode == 0

    def wait_for(self, predicate: Callable[[str], bool], timeout: float) -> str | None:
        """The first screen `predicate` accepts, or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                return None
            time.sleep(SCREEN_POLL_S)

    def close(self) -> None:
        """Kill the server and remove its socket file (a server that exits leaves it behind)."""
        self.run("kill-server", check=False)
        if self.socket:
            Path(self.socket).unlink(missing_ok=True)
