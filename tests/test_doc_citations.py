"""Code says what it does and why; the figures and their history live in docs/. So no line of engine/ or voiceapp/
cites the lab (docs/lab, its run log, a dated run), a run by number or letter, or a measured figure, and each file
cites a topic doc (docs/<topic>.md) at most once per decision, within an allowance per file that may only go down."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("engine", "voiceapp")

LAB = re.compile(r"docs/lab\b")
RUN = re.compile(r"\b[Rr]uns? (?:\d+|[A-Z])\b(?!\s?(?:s|ms|µs|min|x|%|times)\b)")
"""A run cited by name: "run 29", "runs 22", "run G" (not a length: "may run 1 s")."""
DATE = re.compile(r"(?<![\"'\w-])20\d\d-[01]\d-[0-3]\d\b")
"""A date such as 2026-11-25; a quoted one ("2024-03-15") is an example of text, not a run's date."""
FIGURE = re.compile(
    r"\b[Mm]easured\b[^.;:()\"]{0,40}?\d"  # "measured 4.1 ms", "measured on 2 cores"
    r"|\bMeasured:"  # "Measured: KL mean ..."
    r"|\b\d+(?:\.\d+)?\s?(?:x|times) (?:faster|slower)\b"  # "1.5x faster"
    r"|\b\d+(?:\.\d+)?\s?(?:ms|µs|us|s|tokens/s)\b (?:faster|slower|sooner|later|against|here)\b"  # "3 ms faster"
    r"|\bover \d+ (?:starts|runs|repeats|trials)\b"  # "46-150 ms over 15 starts"
    r"|\bon an? \d+-core machine\b")  # "0.6 ms each time on a 2-core machine"
"""A measured figure in prose; sample rates, sizes and constants in code are none of these."""
DOC = re.compile(r"docs/(?!lab\b)[\w./-]*\w(?:, \"[^\"]+\")?")
"""A topic doc cited, with the section it names if any ("docs/cpu.md, \"Many cores\"")."""

DOC_ALLOWANCE = {
    "engine/backends/decode_kernels.py": 1,
    "engine/backends/qwen2_checkpoint.py": 1,
    "engine/backends/qwen2_ort.py": 1,
    "engine/backends/torch_gen.py": 1,
    "engine/bench/summary.py": 1,
    "engine/config.py": 1,
    "engine/cpu_pools.py": 2,
    "engine/families/orpheus/__init__.py": 1,
    "engine/families/orpheus/checkpoint.py": 1,
    "engine/families/orpheus/grammar.py": 1,
    "engine/windowing.py": 1,
    "voiceapp/cli/__init__.py": 1,
    "voiceapp/cmd_bench.py": 1,
    "voiceapp/cli/export.py": 1,
    "voiceapp/cli/serve.py": 1,
    "voiceapp/cli/voice.py": 1,
    "voiceapp/common.py": 1,
    "voiceapp/http/formats.py": 1,
}
"""Lines citing a topic doc, per file: lower an entry when a citation goes (the test says so); never raise one."""


def code_lines() -> list[tuple[str, int, str]]:
    """(file relative to the root, line number, text) of every Python line in the code."""
    return [(path.relative_to(ROOT).as_posix(), number, line)
            for folder in CODE for path in sorted((ROOT / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]


def lab_run_date_or_figure(line: str) -> str | None:
    """What in `line` cites the lab, a run, a date or a measured figure, if anything."""
    for pattern in (LAB, RUN, DATE, FIGURE):
        found = pattern.search(line)
        if found:
            return found.group(0)
    return None


def test_the_patterns_flag_citations_and_pass_ordinary_code() -> None:
    cited = ["(docs/lab/run-log.md)", "measured 4.1 ms on 2 cores", "as run 32 showed", "in run G", "on 2026-11-25",
             "Measured: KL mean 4.7e-4", "1.5x faster than fp32", "19.6 tokens/s against 15.7", "runs 22 to 29",
             "about 50 ms here", "46-150 ms over 15 starts", "0.6 ms each time on a 2-core machine"]
    ordinary = ['SAMPLE_RATE = 16000', 'version = "0.1.0"', 'ISO "2024-03-15"', "the run's exit status",
                'datetime.date(2026, 11, 25)', "the measured speed s", "timeout_s: float = 1.5",
                "10 s of audio is 640 kB", "what unmeasured requests left behind", "docs/cpu.md", "may run 1 s (50 tokens)", "1 code = 20 ms of audio"]
    assert [line for line in cited if lab_run_date_or_figure(line) is None] == []
    assert [(line, lab_run_date_or_figure(line)) for line in ordinary if lab_run_date_or_figure(line)] == []
    assert DOC.findall('(docs/cpu.md, "Many cores").') == ['docs/cpu.md, "Many cores"']


def test_no_code_line_cites_the_lab_a_run_a_date_or_a_measured_figure() -> None:
    found = [f"{path}:{number}: {hit!r}" for path, number, line in code_lines()
             if (hit := lab_run_date_or_figure(line)) is not None]
    assert not found, ("say what the code does and why in a sentence; the figure and its run go to docs/:\n"
                       + "\n".join(found))


def test_each_file_cites_topic_docs_within_its_allowance_once_per_decision() -> None:
    lines: Counter[str] = Counter()
    citations: dict[str, Counter[str]] = {}
    for path, _, line in code_lines():
        cited = DOC.findall(line)
        if cited:
            lines[path] += 1
            citations.setdefault(path, Counter()).update(cited)
    over = {path: (count, DOC_ALLOWANCE.get(path, 0)) for path, count in lines.items()
            if count > DOC_ALLOWANCE.get(path, 0)}
    assert not over, f"(lines citing docs/, allowance) per file: {over}; cite a doc once, where the decision is"
    twice = {path: [doc for doc, n in counter.items() if n > 1] for path, counter in citations.items()
             if max(counter.values()) > 1}
    assert not twice, f"the same doc (and section) cited more than once in a file: {twice}"
    lower = {path: (lines[path], allowed) for path, allowed in DOC_ALLOWANCE.items() if lines[path] < allowed}
    assert not lower, f"fewer citations than allowed, (lines, allowance): {lower}; lower DOC_ALLOWANCE to match"
