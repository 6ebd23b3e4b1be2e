"""Device probe for docs/benchmarks/orpheus.json's decoder figures: our SNAC on the GPU (fp32) against the `snac`
package on the same weights, codes and noise (`snac_max_abs_err`), the pipeline's own windows (the family's
schedule through engine.windowed_decode) against a one-shot decode (`seam_db`), and the decoder's time per window
at crowd batch sizes, eager and from captured graphs.

    python lab/orpheus_snac_gpu.py MODEL_DIR OUT.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from engine.backends.base import DecodeItem
from engine.families.orpheus import SCHEDULE
from engine.families.orpheus.snac import SnacDecoder
from engine.seams import seam_error_db
from engine.windowed_decode import WindowedDecode
from orpheus_snac_measure import package_error, random_frames as frames  # lab/, beside this script


def windowed(decoder: SnacDecoder, codes) -> np.ndarray:
    """The pipeline's windows over `codes` (all of them there, as when the LLM is ahead), joined."""
    windows = WindowedDecode(SCHEDULE, (), decoder.samples_per_code)
    parts = []
    while (window := windows.next_window(len(codes), True)) is not None:
        parts.append(windows.join(window, decoder.decode([windows.item(window, codes)])[0]))
    return np.concatenate(parts)


def one_shot(decoder: SnacDecoder, codes) -> np.ndarray:
    return decoder.decode([DecodeItem(tuple(codes), ())])[0]


def seam_db(decoder: SnacDecoder, codes) -> float:
    """The pipeline's windows over `codes` against a one-shot decode."""
    one, joined = one_shot(decoder, codes), windowed(decoder, codes)
    n = min(len(one), len(joined))
    return seam_error_db(joined[:n], one[:n])


def window_ms(decoder: SnacDecoder, length: int, batch: int, repeats: int = 5) -> float:
    items = [DecodeItem(frames(length, 10 + i), (), 3, length - 2, 100) for i in range(batch)]
    decoder.decode(items)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        decoder.decode(items)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeats * 1e3


def main() -> None:
    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    decoder = SnacDecoder(model / "snac", device="cuda", dtype=torch.float32)
    codes = frames(120, 0)
    result = {"device": torch.cuda.get_device_name(), "schedule": repr(SCHEDULE),
              "snac_max_abs_err": package_error(model / "snac", decoder, codes[:32], device="cuda"),
              "seam_db": max(seam_db(decoder, frames(120, seed)) for seed in range(3)),
              "window_ms_eager": {f"{length}x{batch}": round(window_ms(decoder, length, batch), 2)
                                  for length in (6, 13, 21) for batch in (1, 16, 64)}}
    result["graph_capture_s"] = round(decoder.warmup((6, 13, 21), (1, 16, 64)), 1)
    result["window_ms_graphs"] = {f"{length}x{batch}": round(window_ms(decoder, length, batch), 2)
                                  for length in (6, 13, 21) for batch in (1, 16, 64)}
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
