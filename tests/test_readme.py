"""README's quick start: its first command installs the app for a user, its second is what CI runs verbatim."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    """The command of each sh block of README's quick start, in order."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)^## ", readme, re.S | re.M)
    assert section, "README has no quick-start section"
    blocks = re.findall(r"```sh\n(.*?)```", section.group(1), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_opens_with_the_user_install_then_the_development_command():
    assert quick_start_commands() == ["bash scripts/install.sh", "bash scripts/setup.sh --test"]
    assert (ROOT / "README.md").read_text().index("## Quick start") < 2000, "the quick start must open the README"


def test_ci_runs_the_readme_development_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert quick_start_commands()[1] in ci_lines, ".ci/run must run README's development command verbatim"
