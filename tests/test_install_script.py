"""scripts/install.sh, the user install, in its --dry-run mode: the commands it would run, for a machine without a
GPU and for one with (a stand-in `nvidia-smi` on PATH says which). The real install is measured by hand
(docs/performance.md): it downloads PyTorch, too slow for every test run."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.sh"


def dry_run(tmp_path: Path, gpu: bool, *args: str, env: dict[str, str] | None = None) -> list[list[str]]:
    """The commands install.sh --dry-run prints, split into words, with the temp dir as the user's home."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    smi = tools / "nvidia-smi"
    if gpu:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
        smi.chmod(0o755)
    # PATH: the stand-in first, then only the system folders, so a real nvidia-smi elsewhere cannot answer
    path = f"{tools}:/usr/local/bin:/usr/bin:/bin"
    python_dir = Path(subprocess.run(["bash", "-c", "command -v python3"], capture_output=True, text=True,
                                     env={**os.environ}).stdout.strip()).parent
    full_env = {"HOME": str(tmp_path / "home"), "PATH": f"{path}:{python_dir}", **(env or {})}
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, env=full_env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "home").exists(), "a dry run must create nothing"
    return [shlex.split(line[2:]) for line in out.stdout.splitlines() if line.startswith("+ ")]


def pip_installs(commands: list[list[str]]) -> list[list[str]]:
    return [c for c in commands if c[1:4] == ["-m", "pip", "install"]]


def test_without_a_gpu_it_installs_cpu_torch_then_the_app_without_extras(tmp_path: Path) -> None:
    commands = dry_run(tmp_path, gpu=False)
    venv = tmp_path / "home" / ".local" / "share" / "voiceapp" / "venv"
    assert commands[0] == ["python3", "-m", "venv", str(venv)]
    torch_step, app_step = pip_installs(commands)[1:]
    cpu_build = platform.system() == "Linux" and platform.machine() == "x86_64"
    assert torch_step[-1] == ("torch==2.13.0+cpu" if cpu_build else "torch==2.13.0")
    assert app_step[-2:] == ["-e", str(ROOT)], "the app itself, from this checkout, with no [extras]"
    packages = [word for c in pip_installs(commands) for word in c[4:] if not word.startswith("-")]
    assert packages == ["pip", torch_step[-1], str(ROOT)], "nothing else: no extras, no test packages"
    assert commands[-1] == ["ln", "-sf", str(venv / "bin" / "voicectl"),
                            str(tmp_path / "home" / ".local" / "bin" / "voicectl")]


def test_a_torch_index_is_added_to_the_torch_step_only(tmp_path: Path) -> None:
    index = "file:///srv/torch-cpu/simple"
    torch_step, app_step = pip_installs(dry_run(tmp_path, gpu=False, env={"VOICEAPP_TORCH_INDEX": index}))[1:]
    assert torch_step[-3:-1] == ["--extra-index-url", index]
    assert "--extra-index-url" not in app_step


def test_with_an_nvidia_gpu_it_installs_the_default_torch_build_and_the_transformers_extra(tmp_path: Path) -> None:
    torch_step, app_step = pip_installs(dry_run(tmp_path, gpu=True))[1:]
    assert torch_step[-1] == "torch==2.13.0"
    assert app_step[-2:] == ["-e", f"{ROOT}[transformers]"]


def test_every_pip_step_skips_byte_compiling(tmp_path: Path) -> None:
    """pip's byte-compiling of every installed module is a fifth of the CPU install (docs/performance.md)."""
    for gpu in (False, True):
        (tmp_path / str(gpu)).mkdir()
        steps = pip_installs(dry_run(tmp_path / str(gpu), gpu=gpu))
        assert len(steps) == 3 and all("--no-compile" in step for step in steps), steps


def test_torch_pin_matches_the_development_setup() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '"torch==2.13.0"' in setup and "TORCH_VERSION=2.13.0" in SCRIPT.read_text()


def test_venv_and_bin_folders_can_be_chosen_and_unknown_options_fail(tmp_path: Path) -> None:
    commands = dry_run(tmp_path, False, "--venv", str(tmp_path / "v"), "--bin", str(tmp_path / "b"))
    assert commands[0][-1] == str(tmp_path / "v") and commands[-1][-1] == str(tmp_path / "b" / "voicectl")
    out = subprocess.run(["bash", str(SCRIPT), "--dry-rn"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == "install: unknown option --dry-rn (see --help)"


def test_where_pip_has_no_cpu_build_it_installs_the_default_one_and_says_so(tmp_path: Path) -> None:
    """PyPI has no `torch==X+cpu`: on a CPU machine the install falls back to the default build (it runs on a CPU,
    only larger) with a line saying how to get the small one, instead of stopping. A real run of the script, with a
    stand-in python3 whose venv's pip refuses every +cpu requirement and logs what it is asked."""
    tools, log = tmp_path / "tools", tmp_path / "pip.log"
    tools.mkdir()
    stub_python = (f"#!/bin/sh\necho \"$*\" >> {log}\n"
                   'case "$*" in *+cpu*) echo "ERROR: No matching distribution" >&2; exit 1;; esac\nexit 0\n')
    (tools / "python3").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        '  mkdir -p "$3/bin"\n'
        f"  cat > \"$3/bin/python\" <<'PY'\n{stub_python}PY\n"
        "  printf '#!/bin/sh\\nexit 0\\n' > \"$3/bin/voicectl\"\n"
        '  chmod +x "$3/bin/python" "$3/bin/voicectl"\n'
        "fi\nexit 0\n")
    (tools / "python3").chmod(0o755)
    env = {"HOME": str(tmp_path / "home"), "PATH": f"{tools}:/usr/local/bin:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(SCRIPT), "--no-model", "--no-say"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    asked = [line.split()[-1] for line in log.read_text().splitlines() if line.startswith("-m pip install")]
    cpu_build = platform.system() == "Linux" and platform.machine() == "x86_64"
    if cpu_build:
        assert asked == ["pip", "torch==2.13.0+cpu", "torch==2.13.0", str(ROOT)], asked
        assert "no CPU build of PyTorch in pip's package sources" in out.stdout
    else:
        assert asked == ["pip", "torch==2.13.0", str(ROOT)], asked
    assert (tmp_path / "home" / ".local" / "bin" / "voicectl").is_symlink()


def test_torchs_test_programs_go_and_without_a_gpu_its_headers_too(tmp_path: Path) -> None:
    """Between the torch step and the app step: libtorch's C++ test programs are removed everywhere, its C++ headers
    only without a GPU (the graph lane compiles on a GPU)."""
    for gpu in (False, True):
        (tmp_path / str(gpu)).mkdir()
        commands = dry_run(tmp_path / str(gpu), gpu=gpu)
        at = [i for i, c in enumerate(commands) if c[1:4] == ["-m", "pip", "install"]]
        removals = commands[at[1] + 1:at[2]]
        torch_dir = str(tmp_path / str(gpu) / "home" / ".local" / "share" / "voiceapp" / "venv" / "lib" /
                        "python3*" / "site-packages" / "torch")
        expected = [["rm", "-rf", f"{torch_dir}/test", f"{torch_dir}/bin/test_*", f"{torch_dir}/bin/*Test"]]
        assert removals == expected + ([] if gpu else [["rm", "-rf", f"{torch_dir}/include"]]), removals
