"""Provides the measurements behind docs/orpheus.md: seam error vs context, and agreement with the `snac` package.

`python lab/orpheus_snac_measure.py --size full --seed 0` writes a synthetic SNAC of that size to a
temporary folder, decodes random frames one-shot and in windows, and prints markdown tables.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine.families.orpheus import grammar as g
from engine.backends.base import DecodeItem
from engine.families.orpheus.snac import SnacDecoder, fewest_context, measure_context_table, position_noise
from engine.families.orpheus.synthetic import write_snac


def random_frames(n: int, seed: int) -> tuple[tuple[int, ...], ...]:
    rng = np.random.default_rng(seed)
    return tuple(tuple(int(c) for c in rng.integers(0, g.CODEBOOK, g.FRAME_TOKENS)) for _ in range(n))


def package_error(snac_dir: Path, decoder: SnacDecoder, frames, device: str = "cpu") -> float | None:
    """Max |ours - snac package| on `frames`, the package's NoiseBlocks drawing our noise, the package's model on
    `device`; None without snac."""
    try:
        import snac
    except ImportError:
        return None
    model = snac.SNAC.from_config(str(snac_dir / "config.json"))
    model.load_state_dict(torch.load(snac_dir / "pytorch_model.bin", weights_only=True), strict=True)
    for index, layer in enumerate(model.decoder.model):
        if isinstance(layer, snac.layers.DecoderBlock):
            block = layer.block[2]

            def forward(x, index=index, block=block):
                starts = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
                return x + position_noise(decoder.seed, index, starts, x.shape[-1], x.dtype) * block.linear(x)

            block.forward = forward
    model = model.to(device).eval()
    with torch.inference_mode():
        levels = [torch.tensor([r], device=device) for r in g.split_levels(frames)]
        ref = model.decode(levels)[0, 0].cpu().numpy()
    ours = decoder.decode([DecodeItem(tuple(frames), ())])[0]
    return float(np.abs(ours - ref).max())


def first_chunk_table(decoder: SnacDecoder, frames, rights=(1, 2), keeps=(512, 1024, 1536, 2048)
                      ) -> dict[int, dict[int, float]]:
    """A sentence's first window (one kept frame, no left context, `right` frames of right context) against the
    one-shot decode of `frames`: dB of its error over its first `keep` samples, per right context."""
    ref = decoder.decode([DecodeItem(tuple(frames), ())])[0]
    rms = float(np.sqrt(np.mean(ref ** 2)))
    table = {}
    for right in rights:
        first = decoder.decode([DecodeItem(tuple(frames[:1 + right]), ())])[0]
        table[right] = {keep: 20 * float(np.log10(np.abs(first[:keep] - ref[:keep]).max() / rms)) for keep in keeps}
    return table


def row(label: str, table: dict[int, float]) -> str:
    return f"| {label} | " + " | ".join(f"{db:.1f}" for db in table.values()) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="full", choices=("tiny", "full"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--new", type=int, default=4, help="kept frames per window")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--first-chunk", action="store_true",
                        help="instead: where in a sentence's first window the error sits (8 frames)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        snac_dir = Path(tmp) / "snac"
        write_snac(snac_dir, args.size, args.seed)
        decoder = SnacDecoder(snac_dir, seed=args.seed)
        frames = random_frames(args.frames, args.seed)
        if args.first_chunk:
            for right, errs in first_chunk_table(decoder, frames[:8]).items():
                print(row(f"right {right}, first N samples {tuple(errs)}", errs))
            return
        full = decoder.decode([DecodeItem(frames, ())])[0]
        contexts = [0, 1, 2, 3, 4, 6]
        print(f"{args.size} SNAC, seed {args.seed}, {args.frames} random frames, windows of {args.new} kept frames; "
              f"one-shot RMS {float(np.sqrt(np.mean(full ** 2))):.3f}\n")
        print("| context (frames) | " + " | ".join(map(str, contexts)) + " |")
        print("|---" * (len(contexts) + 1) + "|")
        tables = {side: measure_context_table(decoder, frames, contexts, new=args.new, side=side, other=8)
                  for side in ("both", "left", "right")}
        for side, label in (("both", "both sides"), ("left", "left only (right 8)"), ("right", "right only (left 8)")):
            print(row(label, tables[side]))
        print(f"\ncontext for a seam below -40 dB: left {fewest_context(tables['left'])}, "
              f"right {fewest_context(tables['right'])} frames")
        err = package_error(snac_dir, decoder, frames[:16])
        print(f"max |ours - snac package| over 16 frames (fp32, same noise): {err:.2e}" if err is not None
              else "snac package not installed")
    print(f"({time.perf_counter() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
