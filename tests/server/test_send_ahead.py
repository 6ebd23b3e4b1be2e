"""`say` through a warm server sends its request before it imports its audio stack: the server generates while the
client imports numpy and asyncio and checks its input; what the client finds wrong then still ends in one line,
and the server is left serving."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.config import SynthesisRequest
from tests.cli_helpers import one_line_error, voicectl
from tests.server.conftest import same_audio
from voiceapp.server.rendezvous import send_say

FAKE = ["--backend", "fake", "--seed", "3", "--voice", "leo"]
HEAVY = ("numpy", "asyncio", "engine.text", "engine.factory", "engine.pipeline", "soundfile", "sounddevice", "uuid",
         "platform")
"""What must not be imported yet when the request goes out."""

SPY = textwrap.dedent("""
    import json, sys
    import voiceapp.server.rendezvous as rendezvous
    send = rendezvous.send_say
    def spy(*args, **kwargs):
        sent = send(*args, **kwargs)
        print(json.dumps({"heavy": [m for m in HEAVY if m in sys.modules], "sent": sent is not None}),
              file=sys.stderr)
        return sent
    rendezvous.send_say = spy
    from voiceapp.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def say_spied(sock_path, *args, stdin=None):
    """`voicectl say ARGS` in a process that reports, as its request goes out, which heavy modules it has imported."""
    code = f"HEAVY = {HEAVY!r}\n{SPY}"
    return subprocess.run([sys.executable, "-c", code, "say", *args], capture_output=True, text=True, timeout=120,
                          input=stdin, env={**os.environ, "VOICEAPP_SOCKET": sock_path})


def spied(proc) -> dict | None:
    """What the spy reported, or None when nothing was sent ahead (send_say was not called)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith('{"heavy"')]
    return json.loads(lines[0]) if lines else None


def test_the_request_goes_out_before_the_heavy_imports_and_speaks_the_same(fake_server, sock_path, tmp_path):
    proc = say_spied(sock_path, "Sent ahead. Then imported.", "--out", str(tmp_path / "a.wav"), "--json", *FAKE)
    assert proc.returncode == 0, proc.stderr
    assert spied(proc) == {"heavy": [], "sent": True}
    metrics = json.loads(proc.stdout)
    assert metrics["server_pid"] is not None and metrics["ttfa_ms"] is not None
    local = voicectl("say", "Sent ahead. Then imported.", "--out", str(tmp_path / "b.wav"), "--no-server", *FAKE)
    assert local.returncode == 0, local.stderr.decode()
    assert same_audio(tmp_path / "a.wav", tmp_path / "b.wav")


@pytest.mark.parametrize("args, error", [
    (["..."], "voicectl: the text has no speakable words (only punctuation, symbols or emoji)"),
    (["Hello.", "--voice", "nobody"], "voicectl: unknown voice 'nobody'"),
    (["Hello.", "--out", "/proc/no/such/dir/x.wav"], "voicectl: "),
])
def test_input_refused_after_sending_is_one_line_and_the_server_keeps_serving(fake_server, sock_path, tmp_path,
                                                                            args, error):
    env = {"VOICEAPP_SOCKET": sock_path}
    proc = voicectl("say", *args, *(["--out", str(tmp_path / "x.wav")] if "--out" not in args else []),
                    "--backend", "fake", env=env)
    assert one_line_error(proc).startswith(error)
    assert not (tmp_path / "x.wav").exists()
    again = voicectl("say", "Still here.", "--out", str(tmp_path / "y.wav"), "--json", *FAKE, env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["server_pid"] is not None, again.stderr.decode()


def test_nothing_is_sent_ahead_without_a_server_or_to_one_that_cannot_stand_in(fake_server, sock_path, tmp_path):
    req = SynthesisRequest("Hello.")
    assert send_say(tmp_path / "none.sock", "auto", None, req) is None
    assert send_say(Path(sock_path), "torch", None, req) is None  # the server is "fake"
    sent = send_say(Path(sock_path), "fake", None, req)
    assert sent is not None and sent.info["backend"] == "fake"
    sent.cancel()


def test_stdin_and_no_server_send_nothing_ahead(fake_server, sock_path, tmp_path):
    proc = say_spied(sock_path, "-", "--out", str(tmp_path / "a.wav"), "--json", *FAKE, stdin="From stdin.\n")
    assert proc.returncode == 0, proc.stderr
    assert spied(proc) is None and json.loads(proc.stdout)["server_pid"] is not None  # the usual road
    proc = say_spied(sock_path, "Hello.", "--no-server", "--out", str(tmp_path / "b.wav"), "--json", *FAKE)
    assert proc.returncode == 0, proc.stderr
    assert spied(proc) is None and json.loads(proc.stdout)["server_pid"] is None
