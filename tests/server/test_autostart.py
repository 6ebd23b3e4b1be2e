"""A warm engine without asking: `say` starts a background server when none runs, the next `say` uses it, it stops
itself once idle or on `voicectl stop`, two at once start one, and the opt-outs start none."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import one_line_error, serve_pids, voicectl
from tests.server.conftest import same_audio, start_serve, wait_for
from voiceapp.server.client import Connection

FAKE = ["--backend", "fake", "--seed", "3", "--voice", "leo", "--json"]


def say_json(text, out, *args, env):
    """`voicectl say TEXT --out OUT ARGS`: its JSON metrics and stderr, after checking it succeeded."""
    proc = voicectl("say", text, "--out", str(out), *args, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout), proc.stderr.decode()


def gone(path) -> bool:
    """No server process, socket or lock is left for the socket at `path`."""
    return not serve_pids(path) and not Path(path).exists() and not Path(f"{path}.lock").exists()


def test_first_say_starts_a_server_the_second_uses_it_and_stop_stops_it(sock_path, tmp_path):
    env = {"VOICEAPP_SOCKET": sock_path}
    first, err = say_json("Started here. Twice!", tmp_path / "a.wav", *FAKE, env=env)
    pid = first["server_pid"]
    assert first["server_started"] and serve_pids(sock_path) == [pid]
    assert f"voicectl: started a background engine server (pid {pid}); it stops after 1 min idle (voicectl stop)" \
        in err.splitlines()
    assert "voicectl: server: loading the engine (fake engine" in err  # its progress, relayed while waiting
    second, err = say_json("Started here. Twice!", tmp_path / "b.wav", *FAKE, env=env)
    assert second["server_pid"] == pid and not second["server_started"] and err == ""
    local, _ = say_json("Started here. Twice!", tmp_path / "c.wav", *FAKE, "--no-server", env=env)
    assert local["server_pid"] is None
    assert same_audio(tmp_path / "a.wav", tmp_path / "b.wav") and same_audio(tmp_path / "a.wav", tmp_path / "c.wav")
    status = voicectl("status", env=env).stdout.decode()
    assert f"pid {pid}" in status and "started by say or the TUI; idle timeout: 1 min" in status
    stop = voicectl("stop", env=env)
    assert stop.returncode == 0 and f"pid {pid}" in stop.stdout.decode(), stop.stderr.decode()
    assert wait_for(lambda: gone(sock_path))
    assert "no server running" in one_line_error(voicectl("stop", env=env))


def test_idle_timeout_stops_an_auto_started_server_and_frees_its_socket(sock_path, tmp_path):
    env = {"VOICEAPP_SOCKET": sock_path, "VOICEAPP_IDLE_TIMEOUT": "2"}
    metrics, err = say_json("Idle soon.", tmp_path / "a.wav", *FAKE, env=env)
    assert metrics["server_started"] and "it stops after 2 s idle" in err
    assert serve_pids(sock_path) == [metrics["server_pid"]]
    assert wait_for(lambda: gone(sock_path), timeout=20)
    assert "voicectl serve: no client for 2 s: stopping" in (Path(sock_path).parent / "engine.log").read_text()


def test_a_connected_client_keeps_an_idle_server_alive(sock_path):
    import asyncio

    env = {"VOICEAPP_SOCKET": sock_path}
    proc = start_serve("--backend", "fake", "--no-warm-up", "--idle-timeout", "1", env=env)
    try:
        async def hold(seconds):
            conn = await Connection.open(Path(sock_path))
            await asyncio.sleep(seconds)
            await conn.close()

        asyncio.run(hold(2.5))
        assert proc.poll() is None  # connected for longer than its idle timeout
        assert proc.wait(10) == 0  # idle once the client left
        assert "no client for 1 s: stopping" in proc.stderr.read().decode()
        assert not Path(sock_path).exists() and not Path(f"{sock_path}.lock").exists()
    finally:
        proc.kill()
        proc.wait()


def test_two_says_at_once_start_one_server(sock_path, tmp_path):
    env = {**os.environ, "VOICEAPP_SOCKET": sock_path}
    procs = [subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "say", "At the same moment.", "--out",
                               str(tmp_path / f"{n}.wav"), *FAKE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env) for n in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err.decode() for _, err in outs]
    metrics = [json.loads(out) for out, _ in outs]
    pid = metrics[0]["server_pid"]
    assert pid is not None and metrics[1]["server_pid"] == pid and serve_pids(sock_path) == [pid]
    assert sorted(m["server_started"] for m in metrics) == [False, True]
    assert same_audio(tmp_path / "0.wav", tmp_path / "1.wav")


@pytest.mark.parametrize("args,env", [(["--no-server"], {}), ([], {"VOICEAPP_NO_SERVER": "1"})])
def test_no_server_never_starts_nor_uses_one(sock_path, tmp_path, args, env):
    env = {"VOICEAPP_SOCKET": sock_path, **env}
    metrics, err = say_json("In this process.", tmp_path / "a.wav", *FAKE, *args, env=env)
    assert metrics["server_pid"] is None and not metrics["server_started"] and err == ""
    piped = voicectl("say", "-", "--out", str(tmp_path / "b.wav"), *FAKE, *args, stdin=b"Piped in.", env=env)
    assert piped.returncode == 0 and json.loads(piped.stdout)["server_pid"] is None
    assert serve_pids(sock_path) == [] and not Path(f"{sock_path}.lock").exists()
    proc = start_serve("--backend", "fake", "--no-warm-up", env=env)  # nor is a running one used
    try:
        metrics, _ = say_json("In this process.", tmp_path / "c.wav", *FAKE, *args, env=env)
        assert metrics["server_pid"] is None
    finally:
        proc.kill()
        proc.wait()


def test_say_from_stdin_starts_a_server_too(sock_path, tmp_path):
    env = {"VOICEAPP_SOCKET": sock_path}
    piped = voicectl("say", "-", "--out", str(tmp_path / "a.wav"), *FAKE, stdin=b"Piped. In two.", env=env)
    assert piped.returncode == 0, piped.stderr.decode()
    metrics = json.loads(piped.stdout)
    assert metrics["server_started"] and metrics["sentences"] == 2 and serve_pids(sock_path) == [metrics["server_pid"]]


def test_a_server_that_cannot_start_gives_one_line_and_in_process_speech(sock_path, tmp_path):
    Path(sock_path).parent.mkdir(mode=0o700)
    Path(sock_path).write_text("not a socket")  # the server refuses to replace it; say can still speak
    env = {"VOICEAPP_SOCKET": sock_path}
    for args, stdin in ((["Said anyway."], None), (["-"], b"Said anyway.")):
        proc = voicectl("say", *args, "--out", str(tmp_path / "a.wav"), *FAKE, stdin=stdin, env=env)
        assert proc.returncode == 0, proc.stderr.decode()
        failed = [line for line in proc.stderr.decode().splitlines() if "did not start" in line]
        assert failed == [f"voicectl: the background engine server did not start ({sock_path} exists and is not a "
                          f"socket; remove it or pass another --socket); speaking in-process"]
        assert json.loads(proc.stdout)["server_pid"] is None and (tmp_path / "a.wav").stat().st_size > 1000
    assert serve_pids(sock_path) == []


def test_a_bad_idle_timeout_is_one_line(sock_path, tmp_path):
    env = {"VOICEAPP_SOCKET": sock_path, "VOICEAPP_IDLE_TIMEOUT": "soon"}
    err = one_line_error(voicectl("say", "Hi.", "--out", str(tmp_path / "a.wav"), *FAKE, env=env))
    assert "VOICEAPP_IDLE_TIMEOUT=soon" in err and serve_pids(sock_path) == []
    assert "--idle-timeout -1" in one_line_error(voicectl("serve", "--backend", "fake", "--idle-timeout", "-1",
                                                          env=env))


@pytest.mark.slow
def test_auto_started_server_speaks_as_in_process_on_the_tiny_checkpoint(tiny_model, sock_path, tmp_path):
    env = {"VOICEAPP_SOCKET": sock_path}
    args = ["--model", str(tiny_model), "--backend", "torch", "--threads", "2", "--seed", "2", "--voice", "ava",
            "--max-tokens", "60", "--json"]
    first, _ = say_json("Short one.", tmp_path / "a.wav", *args, env=env)
    second, _ = say_json("Short one.", tmp_path / "b.wav", *args, env=env)
    local, _ = say_json("Short one.", tmp_path / "c.wav", *args, "--no-server", env=env)
    assert first["server_started"] and second["server_pid"] == first["server_pid"] and local["server_pid"] is None
    assert same_audio(tmp_path / "a.wav", tmp_path / "b.wav") and same_audio(tmp_path / "a.wav", tmp_path / "c.wav")


BLOCKED = ("import os, signal, sys\n"
           "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})\n"
           "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
"""Runs the rest of its command line with SIGTERM and SIGINT blocked and SIGTERM ignored, as speech-dispatcher's
generic module runs `voicectl speechd speak` (a mask and ignored signals survive exec, and pass to every child)."""


def signal_bits(pid: int, field: str) -> int:
    """The signal set `field` (SigBlk, SigIgn) of process `pid`, as a bit mask."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for pid {pid}")


def test_a_server_started_under_a_blocked_signal_mask_still_stops_at_once(sock_path, tmp_path):
    """A server spawned by a client whose SIGTERM was blocked ignored `voicectl stop`, which gave up after 10 s;
    the spawned server now starts with an empty mask and default dispositions, and `serve` unblocks them too."""
    import signal
    import time

    env = {"VOICEAPP_SOCKET": sock_path}
    proc = subprocess.run([sys.executable, "-c", BLOCKED, "-m", "voiceapp.cli", "say", "Blocked.",
                           "--out", str(tmp_path / "a.wav"), *FAKE], capture_output=True,
                          env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    pid = json.loads(proc.stdout)["server_pid"]
    terminating = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    assert not signal_bits(pid, "SigBlk") & terminating and not signal_bits(pid, "SigIgn") & terminating
    t0 = time.monotonic()
    stop = voicectl("stop", env=env)
    assert stop.returncode == 0, stop.stderr.decode()
    # a loaded CI machine launches voicectl slowly; a server deaf to SIGTERM made stop give up after 10 s
    assert time.monotonic() - t0 < 5.0 and wait_for(lambda: gone(sock_path), timeout=2)


def test_serve_run_under_a_blocked_signal_mask_stops_on_sigterm(sock_path):
    """`voicectl serve` started directly by a parent that blocks SIGTERM (a service manager's wrapper, a script
    run from speech-dispatcher) unblocks it before it loads anything."""
    import signal

    env = {**os.environ, "VOICEAPP_SOCKET": sock_path}
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED, "-m", "voiceapp.cli", "serve", "--backend", "fake"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: Path(sock_path).exists(), timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=2) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_processes_voicectl_starts_have_onnx_runtime_telemetry_off(sock_path, tmp_path):
    """voicectl turns ONNX Runtime's telemetry (and vLLM's and the Hub client's usage reports) off for itself and
    so for every process it starts (here a background server), before any of them loads those libraries."""
    env = {"VOICEAPP_SOCKET": sock_path}
    metrics, _ = say_json("Quiet.", tmp_path / "a.wav", *FAKE, env=env)
    environ = Path(f"/proc/{metrics['server_pid']}/environ").read_bytes().split(b"\0")
    assert {b"ORT_DISABLE_TELEMETRY=1", b"VLLM_NO_USAGE_STATS=1", b"HF_HUB_DISABLE_TELEMETRY=1"} <= set(environ)
    assert voicectl("stop", env=env).returncode == 0


def test_a_socket_path_under_a_file_is_one_line_for_serve_and_in_process_speech_for_say(tmp_path):
    """A socket whose folder cannot be made (a file stands where a folder should be) was a FileExistsError
    traceback from `serve` and from `say` starting a server; now serve says so in one line, and say speaks
    in-process after one notice, like any server that cannot start."""
    (tmp_path / "afile").write_text("a file, not a folder")
    sock = str(tmp_path / "afile" / "engine.sock")
    err = one_line_error(voicectl("serve", "--backend", "fake", "--socket", sock, timeout=60))
    assert "afile" in err, err
    proc = voicectl("say", "Said anyway.", "--out", str(tmp_path / "a.wav"), *FAKE, "--socket", sock)
    assert proc.returncode == 0, proc.stderr.decode()
    notes = [line for line in proc.stderr.decode().splitlines() if "afile" in line]
    assert len(notes) == 1 and notes[0].startswith("voicectl: ") and "in-process" in notes[0], notes
    assert (tmp_path / "a.wav").stat().st_size > 1000 and "Traceback" not in proc.stderr.decode()


def test_a_socket_folder_squatted_by_another_user_is_refused_and_say_speaks_in_process(tmp_path):
    """The default socket's folder (here under $XDG_RUNTIME_DIR; /tmp/voiceapp-UID without it) made first by
    another user: nothing of ours goes in it and no server there is used. `say` said so and stopped; it now
    speaks in-process after that one line, as for any server that cannot start. `serve` refuses in one line."""
    import shutil

    runtime = tmp_path / "runtime"
    squatted = runtime / "voiceapp"
    squatted.mkdir(parents=True)
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    shutil.chown(squatted, 65534, 65534)
    env = {"XDG_RUNTIME_DIR": str(runtime), "VOICEAPP_SOCKET": ""}
    proc = voicectl("say", "Mine alone.", "--out", str(tmp_path / "a.wav"), *FAKE, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    notes = [line for line in proc.stderr.decode().splitlines() if str(squatted) in line]
    assert len(notes) == 1 and "not a directory owned by you" in notes[0] and "in-process" in notes[0], notes
    assert json.loads(proc.stdout)["server_pid"] is None and (tmp_path / "a.wav").stat().st_size > 1000
    assert list(squatted.iterdir()) == []
    assert "owned by you" in one_line_error(voicectl("serve", "--backend", "fake", env=env, timeout=60))


def test_a_stopped_server_is_given_up_on_at_once_and_say_speaks_in_process(sock_path, tmp_path):
    """A server that holds its socket but does not answer (SIGSTOP, as Ctrl-Z would; or stuck): `say` waited on it
    for 600 s, trying to start another, without a word. Now: one notice within seconds, then in-process speech,
    for a text argument and for stdin (none of which was read yet); the server left alone."""
    import signal
    import time

    env = {"VOICEAPP_SOCKET": sock_path}
    server = start_serve("--backend", "fake", "--socket", sock_path, env=env)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        for args, stdin in ((["Spoken anyway."], None), (["-"], b"Spoken anyway.")):
            t = time.monotonic()
            proc = voicectl("say", *args, "--out", str(tmp_path / "a.wav"), *FAKE, stdin=stdin, env=env, timeout=60)
            took = time.monotonic() - t
            assert proc.returncode == 0, proc.stderr.decode()
            assert proc.stderr.decode().splitlines() == [
                f"voicectl: the voicectl server (pid {server.pid}) has not answered in 2 s (stopped or stuck?); "
                f"speaking in-process"]
            assert json.loads(proc.stdout)["server_pid"] is None and (tmp_path / "a.wav").stat().st_size > 1000
            assert took < 10  # 2 s for the hello, the rest the in-process engine
        assert serve_pids(sock_path) == [server.pid]
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(10)


class SilentAfterHello:
    """A server that answers its first connection's hello, then nothing more, and accepts no other connection:
    what a client sees of a server stopped (SIGSTOP, Ctrl-Z) just after it said hello."""

    def __init__(self, path):
        import socket
        import threading

        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.conns = []
        threading.Thread(target=self.answer_once, daemon=True).start()

    def answer_once(self):
        from engine.protocol import HEADER, PROTOCOL_VERSION, encode_message, parse_header, project_version

        conn, _ = self.listener.accept()
        self.conns.append(conn)
        _, length = parse_header(conn.recv(HEADER.size, 0x100))  # MSG_WAITALL
        conn.recv(length, 0x100)
        conn.sendall(encode_message({"type": "hello", "v": PROTOCOL_VERSION, "version": project_version(),
                                     "pid": os.getpid(), "sample_rate": 16000, "backend": "fake", "model": None,
                                     "paced_start": False, "paced_windows_s": [], "paced_ahead_windows_s": []}))

    def close(self):
        for sock in (*self.conns, self.listener):
            sock.close()


def test_a_server_that_goes_silent_after_its_hello_is_given_up_on(sock_path, tmp_path):
    """Stopped just after its hello, the server answered nothing more and `say` waited for good. Now its first reply
    is waited on for 2 s, then the server is asked for a hello again (2 s): a text argument is spoken in-process
    after one notice; stdin, already sent, cannot be replayed: one line, non-zero exit."""
    import time

    Path(sock_path).parent.mkdir(mode=0o700)
    env = {"VOICEAPP_SOCKET": sock_path}
    said = f"voicectl: the voicectl server at {sock_path} has not answered in 2 s (stopped or stuck?)"
    for args, stdin in ((["Spoken anyway."], None), (["-"], b"Not replayed.")):
        server = SilentAfterHello(sock_path)
        try:
            t = time.monotonic()
            proc = voicectl("say", *args, "--out", str(tmp_path / "a.wav"), *FAKE, stdin=stdin, env=env, timeout=60)
            took = time.monotonic() - t
        finally:
            server.close()
            os.unlink(sock_path)
        assert took < 12
        if stdin is None:
            assert proc.returncode == 0, proc.stderr.decode()
            assert proc.stderr.decode().splitlines() == [f"{said}; speaking in-process instead"]
            assert json.loads(proc.stdout)["server_pid"] is None and (tmp_path / "a.wav").stat().st_size > 1000
        else:
            assert one_line_error(proc) == said
