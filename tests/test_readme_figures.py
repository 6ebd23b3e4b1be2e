"""README's performance table against `docs/benchmarks/*.json`: each figure the README shows is the headline it
names, so a new measurement cannot leave the README telling an older one."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FIGURES = {
    "first audio at 1 stream": [("latest", "ttfa_ms_p50_1", "{:.1f} ms")],
    "first audio at 32 streams": [("latest", "ttfa_ms_p95_32", "{:.1f} ms")],
    "streams in real time": [("latest", "max_realtime_streams", "{:d}")],
    "RTF at 1 stream": [("latest", "ours_rtf_1", "{:.4f}"), ("cpu", "rtf_2core_full", "{:.3f}")],
    "first audio p95 over HTTP": [("load", "rates.*.first_ms_p95", "{:.1f}")],
    "`say` through a warm server": [("startup", "say_server_s", "{:.2f} s"),
                                     ("startup", "cpu.tiny.say_server_s", "{:.2f} s")],
    "`say` in one process": [("startup", "say_inprocess_s", "{:.2f} s"),
                             ("startup", "cpu.tiny.say_inprocess_s", "{:.2f} s")],
    "`voicectl serve`": [("startup", "serve_ready_s", "{:.2f} s"), ("startup", "cpu.tiny.serve_ready_s", "{:.2f} s")],
    "`voicectl export`": [("export", "e2e_xrt", "{:.0f}x")],
}
"""A row of README's table (the start of its first cell) -> the figures it shows, in order: (benchmark file,
dotted key, format); `*` in a key takes every item of a list."""


def readme_rows() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Performance\n(.*?)^## ", readme, re.S | re.M)
    assert section, "README has no performance section"
    rows = [line.split("|")[1:-1] for line in section.group(1).splitlines() if line.startswith("| ")]
    return {cells[0].strip(): "|".join(cells[1:]) for cells in rows[2:]}  # after the header and its rule


def lookup(value, keys: list[str]) -> list:
    if not keys:
        return [value]
    head, rest = keys[0], keys[1:]
    if head == "*":
        return [found for item in value for found in lookup(item, rest)]
    return lookup(value[head], rest)


@pytest.mark.parametrize("row", sorted(FIGURES))
def test_each_readme_figure_is_the_benchmark_headline(row):
    matches = [cells for label, cells in readme_rows().items() if label.startswith(row)]
    assert len(matches) == 1, f"README's performance table has no single row starting {row!r}"
    expected = []
    for name, key, fmt in FIGURES[row]:
        data = json.loads((ROOT / "docs" / "benchmarks" / f"{name}.json").read_text())
        expected += [fmt.format(v) for v in lookup(data, key.split("."))]
    shown = matches[0]
    positions = [shown.find(text) for text in expected]
    assert -1 not in positions, f"{row}: README shows {shown.strip()!r}, the benchmarks say {expected}"
    assert positions == sorted(positions), f"{row}: README's figures are not in the benchmarks' order {expected}"


def test_every_row_of_the_table_is_checked():
    assert sorted(readme_rows()) and all(any(label.startswith(row) for row in FIGURES) for label in readme_rows())
