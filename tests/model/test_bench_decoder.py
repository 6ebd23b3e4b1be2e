"""engine.bench.decoder_algorithms on the CPU (its GPU numbers come from `python -m lab.bench --decoder-only`)."""
import torch

from engine import bench


def test_decoder_algorithms_times_both_kinds_and_restores_cudnn(tiny_model):
    was = torch.backends.cudnn.deterministic
    rows = bench.decoder_algorithms(tiny_model / "BiCodec", lengths=(20, 32), batches=(1, 2), repeats=2,
                                    device="cpu")
    assert torch.backends.cudnn.deterministic == was
    assert [(r["algorithms"], r["codes"], r["batch"]) for r in rows] == [
        (a, n, b) for a in ("default", "fixed") for n in (20, 32) for b in (1, 2)]
    assert all(r["ms"] > 0 and r["capture_s"] >= 0 for r in rows)
