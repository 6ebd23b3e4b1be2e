"""voicectl entry point: routing and error rendering."""
import subprocess
import sys

import pytest

import voiceapp.cli as cli


def test_bare_voicectl_flags_route_to_the_tui():
    seen = {}

    def fake_run(args):
        seen["command"], seen["backend"] = args.command, args.backend
        return 0

    parser = cli.build_parser()
    tui = parser._subparsers._group_actions[0].choices["tui"]
    tui.set_defaults(run=fake_run)
    original = cli.build_parser
    built = []
    cli.build_parser = lambda only=None: built.append(only) or parser
    try:
        assert cli.main(["--backend", "fake"]) == 0
    finally:
        cli.build_parser = original
    assert seen == {"command": "tui", "backend": "fake"} and built == ["tui"]


def test_a_command_imports_its_own_module_only():
    """`say` through a warm server should not pay for the benchmark's or the exporter's imports."""
    import subprocess
    import sys

    probe = ("import sys; from voiceapp import cli; cli.build_parser('say').parse_args(['say', 'Hi.']); "
             "print(sorted(m for m in sys.modules if m.startswith(('voiceapp.cli.', 'voiceapp.cmd_'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['voiceapp.cli.say']", out.stderr
    assert "bench" in cli.build_parser()._subparsers._group_actions[0].choices  # the full parser for help


def test_doctor_notes_a_missing_triton_without_failing(monkeypatch):
    import importlib.util

    from voiceapp.cli import doctor as cmd_doctor

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    monkeypatch.setattr(cmd_doctor, "_cuda", lambda: True)
    check = cmd_doctor.check_triton()
    assert not check.ok and not check.critical and "fused decode kernels" in check.detail
    assert check.fix == "pip install triton"


@pytest.mark.parametrize("name", ["vllm", "triton"])
def test_doctor_gives_a_cpu_machine_cpu_advice(monkeypatch, name):
    """Without a CUDA GPU neither vLLM nor Triton would be used: their absence is fine, and nothing suggests
    installing them."""
    import importlib.util

    from voiceapp.cli import doctor as cmd_doctor

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))
    monkeypatch.setattr(cmd_doctor, "_cuda", lambda: False)
    check = getattr(cmd_doctor, f"check_{name}")()
    assert check.ok and "not needed without a CUDA GPU" in check.detail and not check.fix


def test_version():
    proc = subprocess.run([sys.executable, "-m", "voiceapp.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("voicectl ") and proc.stdout.split()[1][0].isdigit()


RAISES = """import sys, time
from voiceapp import cli
parser = cli.build_parser('status')
def run(args):
    time.sleep(float(sys.argv[2]))  # the parent closes its end of stdout meanwhile, where it means to
    {raise_it}
parser._subparsers._group_actions[0].choices['status'].set_defaults(run=run)
cli.build_parser = lambda only=None: parser
sys.exit(cli.main(['status']))
"""


def _raising(raise_it: str, wait_s: float = 0.0, close_stdout: bool = False) -> tuple[int, str]:
    """voicectl's exit code and stderr when its command raises `raise_it` (after `wait_s`); `close_stdout`: the
    reader of its stdout has gone by then (`voicectl ... | head`)."""
    script = RAISES.format(raise_it=raise_it)
    proc = subprocess.Popen([sys.executable, "-c", script, "x", str(wait_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    if close_stdout:
        proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode()


def test_a_broken_pipe_is_said_unless_it_is_stdouts_reader_leaving():
    """A reader of voicectl's output that goes away ends it quietly; a pipe to another process that breaks (a worker
    gone) is said in one line, with where it broke."""
    code, err = _raising("raise BrokenPipeError(32, 'Broken pipe')")
    assert code == 1 and err.count("\n") == 1 and err.startswith("voicectl: a pipe to another process broke (")
    code, err = _raising("raise BrokenPipeError(32, 'Broken pipe')", wait_s=0.5, close_stdout=True)
    assert code == 1 and "voicectl:" not in err, err


def test_a_librarys_exit_is_said_with_where_it_came_from():
    """A library that ends the process with sys.exit(1) (Ray's signal handlers) leaves a line naming the status and
    the place; argparse's own exits stay as they are."""
    code, err = _raising("sys.exit(1)")
    assert code == 1 and err.strip().startswith("voicectl: stopped with status 1 by "), err
    assert "<string>:" in err
    proc = subprocess.run([sys.executable, "-m", "voiceapp.cli", "status", "--no-such-flag"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "stopped with status" not in proc.stderr
