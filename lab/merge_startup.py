"""Join the per-group JSON files of lab/gpu_startup_bench.sh into one start-up report.

  python lab/merge_startup.py OUT.json GROUP.json ...
"""
import json
import sys


def merge(paths: list[str]) -> dict:
    merged: dict = {"cases": [], "runs": {}, "errors": {}, "commands": []}
    for path in paths:
        part = json.load(open(path))
        for key, value in part.items():
            if key in ("cases", "runs", "errors"):
                getattr(merged[key], "extend" if key == "cases" else "update")(value)
            elif key == "command":
                merged["commands"].append(value)
            elif value is not None or key not in merged:
                merged[key] = value
    return merged


if __name__ == "__main__":
    json.dump(merge(sys.argv[2:]), open(sys.argv[1], "w"), indent=2)
