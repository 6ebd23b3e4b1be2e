"""`voicectl serve` / `status` / `say` as processes: lifecycle, signals, one-line errors, automatic use by `say`."""
import asyncio
import json
import os
import signal
import socket
import stat
import threading
from pathlib import Path

import pytest

from engine.protocol import PROTOCOL_VERSION, encode_message, project_version
from tests.cli_helpers import one_line_error, serve_pids, voicectl
from tests.server.conftest import same_audio, start_serve, wait_for
from voiceapp.server.client import Connection, RemoteSynthesizer, ServerGone, server_status

LONG_TEXT = " ".join(f"Sentence number {i} goes on for a while." for i in range(60))


@pytest.fixture
def served(sock_path):
    """A fake-backend `voicectl serve` process on a private socket; say/status find it through VOICEAPP_SOCKET."""
    env = {"VOICEAPP_SOCKET": sock_path}
    proc = start_serve("--backend", "fake", env=env)
    yield proc, Path(sock_path), env
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def live_streams(path):
    status = asyncio.run(server_status(path))
    return len(status["streams"]) if status else -1


def audio_sent(path):
    """Seconds of audio the server has sent for its (only) live request."""
    status = asyncio.run(server_status(path))
    return status["streams"][0]["audio_s"] if status and status["streams"] else 0.0


def test_status_shows_the_server_and_none_after_sigterm(served):
    proc, path, env = served
    out = voicectl("status", env=env)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode()
    assert f"pid {proc.pid}" in text and "backend: fake" in text and str(path) in text and "0 live" in text
    assert "started by voicectl serve; idle timeout: none" in text
    status = json.loads(voicectl("status", "--json", env=env).stdout)
    assert status["pid"] == proc.pid and status["v"] == PROTOCOL_VERSION and status["version"] == project_version()
    assert status["idle_timeout_s"] == 0 and not status["auto_started"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not path.exists() and not Path(f"{path}.lock").exists()
    gone = voicectl("status", env=env)
    assert gone.returncode == 1 and gone.stdout.decode().startswith("no server running")


def test_sigterm_during_a_request_tells_the_client_and_removes_the_socket(served):
    proc, path, env = served

    async def run():
        remote = await RemoteSynthesizer.connect(path)
        chunks = remote.synthesize(__import__("engine.config", fromlist=["x"]).SynthesisRequest(LONG_TEXT))
        await chunks.__anext__()
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(Exception) as err:
            async for _ in chunks:
                pass
        await remote.close()
        return err.value

    err = asyncio.run(run())
    assert "stopped" in str(err)
    assert proc.wait(10) == 0 and not path.exists()


def test_second_server_is_refused_with_one_line(served):
    _, path, env = served
    err = one_line_error(voicectl("serve", "--backend", "fake", env=env, timeout=60))
    assert "already running" in err and str(path) in err
    assert live_streams(path) == 0  # the first one is unharmed


def test_sigkilled_server_leaves_a_stale_socket_that_the_next_server_replaces(served):
    proc, path, env = served
    proc.kill()
    proc.wait()
    assert path.exists()
    assert voicectl("status", env=env).returncode == 1
    again = start_serve("--backend", "fake", env=env)
    try:
        assert asyncio.run(server_status(path))["pid"] == again.pid
    finally:
        again.terminate()
        again.wait(10)


def test_default_socket_is_private_under_xdg_runtime_dir(tmp_path):
    runtime = tmp_path / "rt"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime), "VOICEAPP_SOCKET": ""}
    proc = start_serve("--backend", "fake", "--no-warm-up", env=env)
    try:
        sock = runtime / "voiceapp" / "engine.sock"
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert voicectl("status", env=env).returncode == 0
    finally:
        proc.terminate()
        proc.wait(10)


def test_say_uses_the_server_and_matches_in_process_bytes(served, tmp_path):
    proc, path, env = served
    args = ["--backend", "fake", "--seed", "4", "--voice", "leo", "--json"]
    via = voicectl("say", "Through the server. Twice!", "--out", str(tmp_path / "a.wav"), *args, env=env)
    local = voicectl("say", "Through the server. Twice!", "--out", str(tmp_path / "b.wav"), "--no-server", *args,
                     env=env)
    assert via.returncode == 0 and local.returncode == 0, via.stderr.decode() + local.stderr.decode()
    assert same_audio(tmp_path / "a.wav", tmp_path / "b.wav")
    assert json.loads(via.stdout)["ttfa_ms"] > 0 and json.loads(via.stdout)["sentences"] == 2
    piped = voicectl("say", "-", "--out", str(tmp_path / "c.wav"), *args, stdin=b"Through the server.\nTwice!",
                     env=env)
    assert piped.returncode == 0 and json.loads(piped.stdout)["sentences"] == 2
    assert asyncio.run(server_status(path))["served"] == 2


def test_say_errors_from_the_server_keep_their_exit_code(served, tmp_path):
    _, _, env = served
    fake = ("--backend", "fake")  # a fake server stands in only for a client asking for it
    err = one_line_error(voicectl("say", "Hello.", "--out", str(tmp_path / "a.wav"), "--voice", "nobody", *fake,
                                  env=env))
    assert "nobody" in err
    assert voicectl("say", "Hello.", "--out", str(tmp_path / "a.wav"), "--voice", "nobody", *fake,
                    env=env).returncode == 2
    err = one_line_error(voicectl("say", "-", "--out", str(tmp_path / "a.wav"), *fake, stdin=b"caf\xe9 bad",
                                  env=env))
    assert "UTF-8" in err and not (tmp_path / "a.wav").exists()


class HelloOnly:
    """A server that answers hello as `hello` says, then drops the connection once a request comes (it counts
    them)."""

    def __init__(self, path: Path, hello: dict) -> None:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen()
        self.requests = 0
        self.hello = hello
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(encode_message(self.hello))
                if conn.recv(4096):
                    self.requests += 1

    def close(self) -> None:
        self.sock.close()


ENGINE_HELLO = {"type": "hello", "v": PROTOCOL_VERSION, "version": project_version(), "pid": 1, "sample_rate": 16000,
                "backend": "torch", "model": {"path": "/nonexistent/model", "hash": "x"}}


@pytest.mark.parametrize("args,hello,notice", [
    (["--backend", "fake"], ENGINE_HELLO, "uses the torch backend, not fake; speaking in-process"),
    (["--backend", "fake", "--model", "elsewhere"], {**ENGINE_HELLO, "backend": "fake", "model": None},
     "serves no model, not elsewhere; speaking in-process"),
    (["--backend", "fake"], {"type": "error", "code": "version", "error": "VoiceError",
                             "message": "protocol version 1 is not supported"}, "not supported; speaking in-process"),
    (["--backend", "fake"], {**ENGINE_HELLO, "backend": "fake", "model": None, "version": "0.0.1"},
     f"is voiceapp 0.0.1, not {project_version()} like this voicectl; speaking in-process"),
    (["--backend", "fake"], {key: v for key, v in ENGINE_HELLO.items() if key != "version"} | {"backend": "fake"},
     "is voiceapp (an older version)"),
])
def test_say_runs_in_process_when_the_server_cannot_stand_in(sock_path, tmp_path, args, hello, notice):
    """Another backend or model asked for explicitly, or a server of another protocol or project version: a
    notice, then in-process; that server is neither used nor replaced (no second server is started)."""
    server = HelloOnly(Path(sock_path), hello)
    try:
        out = voicectl("say", "Hi.", "--out", str(tmp_path / "a.wav"), *args, "--json",
                       env={"VOICEAPP_SOCKET": sock_path})
    finally:
        server.close()
    assert out.returncode == 0, out.stderr.decode()
    assert notice in out.stderr.decode() and (tmp_path / "a.wav").stat().st_size > 1000
    assert server.requests == 0 and json.loads(out.stdout)["server_pid"] is None
    assert serve_pids(sock_path) == [] and not Path(f"{sock_path}.lock").exists()


def test_server_killed_mid_request_gives_one_line_and_nonzero(served, tmp_path):
    proc, path, env = served
    import subprocess
    import sys

    say = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "say", LONG_TEXT, "--out", str(tmp_path / "a.wav"),
                            "--backend", "fake"], stderr=subprocess.PIPE, env={**os.environ, **env})
    assert wait_for(lambda: audio_sent(path) > 1.0, timeout=20)  # before any audio, say would redo it in-process
    proc.kill()
    err = say.stderr.read().decode().strip()
    assert say.wait(30) == 1
    assert err.startswith("voicectl: the voicectl server") and "stopped in the middle" in err and "\n" not in err
    assert not (tmp_path / "a.wav").exists() and os.listdir(tmp_path) == []
    assert serve_pids(path) == []  # nor did say start another server to redo it


def test_server_dying_before_any_audio_falls_back_to_in_process(sock_path, tmp_path):
    # says hello, then drops the connection when asked to speak
    HelloOnly(Path(sock_path), {**ENGINE_HELLO, "backend": "fake", "model": None})
    env = {"VOICEAPP_SOCKET": sock_path}
    out = voicectl("say", "Hello there.", "--out", str(tmp_path / "a.wav"), "--backend", "fake", env=env)
    assert out.returncode == 0, out.stderr.decode()
    err = out.stderr.decode().strip()
    assert "before any audio" in err and "speaking in-process instead" in err and "\n" not in err
    assert (tmp_path / "a.wav").stat().st_size > 1000
    assert serve_pids(sock_path) == []  # in-process: no server is started to redo it
    piped = voicectl("say", "-", "--out", str(tmp_path / "b.wav"), "--backend", "fake", stdin=b"Hello.", env=env)
    assert "before any audio" in one_line_error(piped)  # stdin cannot be replayed


async def test_client_reports_server_gone_with_audio_started(served):
    proc, path, _ = served
    from engine.config import SynthesisRequest

    remote = await RemoteSynthesizer.connect(path)
    chunks = remote.synthesize(SynthesisRequest(LONG_TEXT))
    await chunks.__anext__()
    proc.kill()
    with pytest.raises(ServerGone) as err:
        async for _ in chunks:
            pass
    assert err.value.audio_started and f"pid {proc.pid}" in str(err.value)
    await remote.close()
    assert await Connection.open(path) is None


def test_serve_has_one_warm_up_flag():
    """--no-warm-up is the engine flag every command shares; serve's older --no-warmup is gone, refused in one
    line like any unknown option."""
    from voiceapp.cli import build_parser

    parser = build_parser("serve")
    help_text = voicectl("serve", "--help", text=True).stdout
    assert "--no-warm-up" in help_text and "--no-warmup" not in help_text
    proc = voicectl("serve", "--no-warmup", text=True, timeout=60)
    assert proc.returncode == 2 and "unrecognized arguments: --no-warmup" in proc.stderr
    assert parser.parse_args(["serve", "--no-warm-up"]).no_warm_up is True
    assert parser.parse_args(["serve"]).no_warm_up is False


def test_a_server_whose_socket_was_deleted_is_named_by_status_and_stopped_by_stop(served):
    """status and serve agree: a deleted socket leaves a server that holds the lock; status names it (exit 1, it
    cannot answer) and `voicectl stop` ends it."""
    proc, path, env = served
    path.unlink()
    out = voicectl("status", env=env)
    assert out.returncode == 1 and f"pid {proc.pid}" in out.stdout.decode() and "socket was deleted" in \
        out.stdout.decode(), out.stdout.decode()
    assert json.loads(voicectl("status", "--json", env=env).stdout) == {"pid": proc.pid, "listening": False}
    assert "already running" in one_line_error(voicectl("serve", "--backend", "fake", env=env, timeout=60))
    stopped = voicectl("stop", env=env)
    assert stopped.returncode == 0, stopped.stderr.decode()
    assert proc.wait(10) == 0


def test_out_of_descriptors_the_server_logs_one_line_and_recovers(sock_path, tmp_path):
    """Under a 48-descriptor limit, 80 clients at once: the server cannot accept them all, logs that once (not a
    traceback per refused accept), and answers again once they have gone."""
    import resource
    import socket
    import subprocess
    import sys
    import time

    env = {**os.environ, "VOICEAPP_SOCKET": sock_path}
    log = tmp_path / "serve.log"

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "serve", "--backend", "fake"], env=env,
                                stderr=err, preexec_fn=limit)
    try:
        assert wait_for(lambda: "listening on" in log.read_text(), timeout=60), log.read_text()
        clients = []
        for _ in range(80):
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            clients.append(s)
        time.sleep(2)
        for s in clients:
            s.close()
        assert wait_for(lambda: voicectl("status", env=env).returncode == 0, timeout=20)
        text = log.read_text()
        assert "Traceback" not in text and text.count("cannot accept connections") == 1, text[-2000:]
    finally:
        proc.kill()
        proc.wait()


def test_stop_leaves_an_unrelated_process_that_reuses_a_dead_servers_pid_alone(sock_path, tmp_path):
    """A SIGKILLed server leaves its lock file, pid inside. Once that pid is reused, `stop` used to SIGTERM
    whoever had it (and `status` named it). A pid counts only while its process holds the lock."""
    import subprocess
    import sys

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Path(sock_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        Path(sock_path + ".lock").write_text(f"{bystander.pid}\n")  # what the killed server left, pid reused
        env = {"VOICEAPP_SOCKET": sock_path}
        err = one_line_error(voicectl("stop", env=env))
        assert "no server running" in err, err
        assert voicectl("status", env=env).returncode != 0
        assert bystander.poll() is None, "stop killed a process that was never a server"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("key", ["clé-secrète", "two words", " padded", "tab\tinside", "line\nbreak", "\u00a0nbsp"])
def test_an_api_key_no_client_can_send_is_refused_at_start_up(key, tmp_path):
    """An Authorization header carries printable ASCII without spaces (a client cannot send 'Bearer clé', and
    servers strip the spaces around it): such a key locked every client out of a server that started fine."""
    env = {"VOICEAPP_SOCKET": str(tmp_path / "s.sock"), "VOICEAPP_API_KEY": ""}
    for how in (["--api-key", key], []):
        extra = {} if how else {"VOICEAPP_API_KEY": key}
        err = one_line_error(voicectl("serve", "--backend", "fake", "--http", "127.0.0.1:0", *how,
                                      env={**env, **extra}, timeout=60))
        assert "API key" in err and "printable ASCII" in err, err
    assert not (tmp_path / "s.sock").exists()


async def test_a_clean_stop_mid_request_is_not_called_a_kill(served):
    """A client that reads as it plays has audio waiting in the socket when `voicectl stop` comes: the server's
    "stopped" frame queued behind it was dropped when the connection closed, and the client said the server was
    "killed or crashed?". It now tells a stop (the server removed its lock) from a death (the lock left behind)."""
    proc, path, env = served
    from engine.config import SynthesisRequest

    remote = await RemoteSynthesizer.connect(path)
    chunks = remote.synthesize(SynthesisRequest(LONG_TEXT * 3))
    await chunks.__anext__()
    await asyncio.sleep(1.0)  # the fake engine runs far ahead: the socket's buffers fill while we do not read
    stopped = await asyncio.to_thread(voicectl, "stop", env=env)
    assert stopped.returncode == 0, stopped.stderr.decode()
    with pytest.raises(ServerGone) as err:
        async for _ in chunks:
            pass
    assert err.value.audio_started and "was stopped" in str(err.value) and "crashed" not in str(err.value), err
    await remote.close()
