"""Records a real export's timeline for the ETA test (issue 38: "the ETA's error on a recorded run").

Exports A Study in Scarlet (tests/data) with a checkpoint (the tiny synthetic one by default, written to a temporary
folder) in this process, and writes, for every sentence in the order it finished, its index, its characters and
the seconds since the run's progress clock started: what `voiceapp.cli.export.Progress` saw. The test replays it
through Progress with that clock (tests/export/test_export_eta_recorded.py).

    python -m lab.eta_record OUT.json [--model DIR] [--jobs N] [--share S]

--share keeps the novel's first share of characters (whole paragraphs): the tiny checkpoint on 2 busy cores
renders the whole book in well over a quarter of an hour.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOVEL = ROOT / "tests" / "data" / "a-study-in-scarlet.txt.xz"


def first_share(text: str, share: float) -> str:
    """The text up to the first paragraph break past `share` of its characters (all of it for 1)."""
    if share >= 1:
        return text
    cut = text.find("\n\n", int(len(text) * share))
    return text if cut < 0 else text[:cut + 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", help="checkpoint (default: a tiny synthetic one)")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--share", type=float, default=1.0, help="first share of the novel's text (default: all)")
    args = ap.parse_args()
    from voiceapp.cli import export as cmd_export
    from voiceapp.cli import main as voicectl

    seen: list[tuple[int, int, float]] = []

    class Recording(cmd_export.Progress):
        def update(self, index: int, samples: int) -> None:
            super().update(index, samples)
            seen.append((index, self.chars[index], round(self.clock() - self.t0, 4)))
            if len(seen) % 100 == 0:
                print(f"eta_record: {len(seen)}/{self.total} at {seen[-1][2]:.0f} s", file=sys.stderr, flush=True)

    cmd_export.Progress = Recording  # type: ignore[misc]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from engine.synthetic import write_checkpoint

            model = str(write_checkpoint(work / "tiny", size="tiny", seed=0))
        book = work / "scarlet.txt"
        text = lzma.decompress(NOVEL.read_bytes()).decode()
        book.write_text(first_share(text, args.share))
        argv = ["export", str(book), "-o", str(work / "scarlet.wav"), "--model", model, "--no-progress"]
        argv += ["--jobs", str(args.jobs)] if args.jobs else []
        t0 = time.time()
        code = voicectl(argv)
    if code != 0 or not seen:
        print(f"eta_record: export failed (exit {code})", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps({
        "what": "A Study in Scarlet exported in one process; each sentence as it finished: [index, chars, seconds "
                "since the progress clock started]",
        "command": "python -m lab.eta_record" + (f" --jobs {args.jobs}" if args.jobs else "")
                   + (f" --share {args.share}" if args.share < 1 else "")
                   + ("" if args.model is None else " --model MODEL"),
        "model": "synthetic tiny, seed 0" if args.model is None else "given",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1),
        "sentences": len(seen), "finished": seen}, separators=(",", ":")) + "\n")
    print(f"eta_record: {len(seen)} sentences in {seen[-1][2]:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
