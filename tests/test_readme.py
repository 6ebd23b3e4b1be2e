"""README's quick start is what CI runs: both commands appear verbatim in .ci/run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_quick_start():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", readme, re.S)
    assert block, "README has no quick-start block"
    commands = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert command in ci_lines, f"{command!r} is not run by .ci/run"
