"""`voicectl export` rendering its sentences last first: the export check's (lab.export_check) proof that the order
sentences are rendered in changes no byte of the result. The product always renders lowest index first; this
process swaps engine.export_plan.render_parts for one that takes the same sentences in reverse, then runs
`voicectl export ARGS` unchanged. Run from the repository root:

    python -m lab.reversed_export BOOK -o OUT.wav --jobs 50 --model $MODEL
"""
from __future__ import annotations

import sys

from engine import export_plan

_render_parts = export_plan.render_parts


async def reversed_parts(synth, plan, parts, todo: list[int], jobs: int, on_done) -> None:
    """render_parts with `todo` reversed."""
    await _render_parts(synth, plan, parts, todo[::-1], jobs, on_done)


def main(argv: list[str] | None = None) -> int:
    from voiceapp.cli import main as voicectl

    export_plan.render_parts = reversed_parts  # cmd_export looks it up when it renders
    return voicectl(["export", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
