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
