"""The pure parts of starting a server on demand: the command line it gets, the opt-outs, the idle timeout, and
reading its log while it starts."""
from __future__ import annotations

import os

import pytest

from engine.errors import InputError
from engine.events import Notice
from voiceapp.server.autostart import ServerLog, idle_text, idle_timeout, serve_command, server_disabled
from voiceapp.cli import build_parser
from voiceapp.cli.serve import first_config
from voiceapp.common import engine_config


@pytest.mark.parametrize("flags", [
    [],
    ["--backend", "fake"],
    ["--model", "/models/tiny", "--backend", "torch", "--compute", "cpu", "--threads", "3"],
    ["--backend", "torch", "--compute", "cpu", "--quantize", "none"],
    ["--backend", "vllm", "--compute", "cuda", "--no-graph-lane", "--no-warm-up"],
    ["--compute", "cuda:1", "--decoder-dtype", "fp32"],
])
def test_the_started_server_builds_the_engine_say_would_have_built(flags, tmp_path):
    wanted = engine_config(build_parser().parse_args(["say", "Hi.", *flags]), one_listener=True)
    cmd = serve_command(tmp_path / "engine.sock", wanted, 600)
    assert cmd[1:4] == ["-m", "voiceapp.cli", "serve"]
    args = build_parser().parse_args(cmd[3:])
    assert first_config(args) == wanted
    assert args.auto_started and args.idle_timeout == 600 and args.socket == str(tmp_path / "engine.sock")


@pytest.mark.parametrize("flag,value,disabled", [(False, None, False), (False, "", False), (False, "0", False),
                                                 (False, "1", True), (False, "yes", True), (True, None, True)])
def test_no_server_flag_or_environment(flag, value, disabled):
    env = {} if value is None else {"VOICEAPP_NO_SERVER": value}
    assert server_disabled(flag, env) is disabled


def test_idle_timeout_from_the_environment():
    assert idle_timeout({}) == 600 and idle_timeout({"VOICEAPP_IDLE_TIMEOUT": ""}) == 600
    assert idle_timeout({"VOICEAPP_IDLE_TIMEOUT": "2.5"}) == 2.5 and idle_timeout({"VOICEAPP_IDLE_TIMEOUT": "0"}) == 0
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(InputError, match="VOICEAPP_IDLE_TIMEOUT"):
            idle_timeout({"VOICEAPP_IDLE_TIMEOUT": bad})
    assert [idle_text(s) for s in (600, 60, 90, 2, 0.5)] == ["10 min", "1 min", "90 s", "2 s", "0.5 s"]


def test_server_log_relays_its_own_complete_lines_from_where_it_started(tmp_path):
    path = tmp_path / "engine.log"
    path.write_text("voicectl serve: an older server's line\n")
    log = ServerLog.open(path)
    try:
        os.write(log.fd, b"voicectl serve: loading the engine\nsome library noise\nvoicectl serve: half a li")
        notices = []
        log.relay(notices.append)
        assert notices == [Notice("server: loading the engine", notices[0].t)] and log.last == "some library noise"
        os.write(log.fd, b"ne\rvoicectl serve: a line\nprogress 10%\rprogress 100%\n")
        log.relay(notices.append)
        assert [n.message for n in notices] == ["server: loading the engine", "server: a line"]
        assert log.last == "progress 100%"
    finally:
        log.close()
