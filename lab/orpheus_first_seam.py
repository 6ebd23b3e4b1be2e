"""Probe (CPU): what a smaller first window would cost Orpheus's first seam. The family's schedule (one frame, two of
lookahead: first audio after 21 tokens) against the same with one frame of lookahead (14 tokens), each joined
against a one-shot decode of the same codes; and how far to the right SNAC's decoder looks (error of a decode of
the first 2 or 3 frames, in the last 256 samples before each quarter of the first frame).

    python lab/orpheus_first_seam.py [SNAC_DIR]

SNAC_DIR: a `snac/` folder (default: a synthetic full-size one written to a temporary folder).
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from engine.backends.base import DecodeItem
from engine.families.orpheus import SCHEDULE
from engine.families.orpheus.snac import SnacDecoder
from engine.seams import seam_error_db
from engine.windowed_decode import WindowedDecode

sys.path.insert(0, str(Path(__file__).parent))
from orpheus_snac_measure import random_frames  # noqa: E402 - lab/ beside this script


def joined(decoder: SnacDecoder, schedule, codes) -> tuple[np.ndarray, int]:
    """The schedule's windows over `codes`, joined, and where the first seam is (samples)."""
    windows, parts = WindowedDecode(schedule, (), decoder.samples_per_code), []
    while (window := windows.next_window(len(codes), True)) is not None:
        parts.append(windows.join(window, decoder.decode([windows.item(window, codes)])[0]))
    return np.concatenate(parts), len(parts[0])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        snac = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "snac"
        if len(sys.argv) == 1:
            from engine.families.orpheus.synthetic import write_snac
            write_snac(snac, "full", 0)
        decoder = SnacDecoder(snac, device="cpu", dtype=torch.float32)
        for first_right in (None, 1):
            schedule = replace(SCHEDULE, first_right=first_right)
            worst = []
            for seed in range(3):
                codes = random_frames(60, seed)
                one = decoder.decode([DecodeItem(tuple(codes), ())])[0]
                audio, seam = joined(decoder, schedule, codes)
                lo, hi = max(0, seam - 2048), seam + 2048
                worst.append(seam_error_db(audio[lo:hi], one[lo:hi]))
            print(f"first window's lookahead {schedule.right_context(0)} frames: first seam "
                  f"{', '.join(f'{x:.1f}' for x in worst)} dB")
        for frames in (2, 3):
            row = []
            for end in (512, 1024, 1536, 2048):
                errs = []
                for seed in range(4):
                    codes = random_frames(20, seed)
                    one = decoder.decode([DecodeItem(tuple(codes), ())])[0]
                    part = decoder.decode([DecodeItem(tuple(codes[:frames]), ())])[0]
                    errs.append(seam_error_db(part[end - 256:end], one[end - 256:end]))
                row.append(f"{end}: {max(errs):.1f}")
            print(f"decoding the first {frames} frames, worst error before sample " + ", ".join(row) + " dB")


if __name__ == "__main__":
    main()
