"""Device probe: one engine per GPU in one process (EngineConfig.device "cuda:0", "cuda:1", ...). Each renders the
same request; prints each engine's status devices, the memory each GPU holds after each build, and whether the
renders agree (same length; the largest sample difference).

    python lab/gpu_device_probe.py [--model DIR] [--backend torch]   (default: a synthetic tiny checkpoint)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile

import numpy as np
import torch

from engine.config import SamplingOptions, SynthesisRequest
from engine.factory import EngineConfig, build_synthesizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--backend", default="torch")
    args = p.parse_args()
    model = args.model
    if model is None:
        from engine.synthetic import write_checkpoint

        model = tempfile.mkdtemp() + "/tiny"
        write_checkpoint(model, size="tiny", seed=0)
    result: dict = {"gpus": torch.cuda.device_count(), "engines": []}
    renders = []
    for index in range(torch.cuda.device_count()):
        device = f"cuda:{index}"
        synth = build_synthesizer(EngineConfig(model=model, backend=args.backend, device=device, decoder_device=device,
                                               one_listener=True))
        req = SynthesisRequest("One engine on each GPU. Does it stay there?", options=SamplingOptions(seed=1))
        audio = asyncio.run(synth.render(req))
        renders.append(audio)
        memory = {f"cuda:{i}": torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())}
        result["engines"].append({"device": device, "status": synth.status(), "allocated_after_build": memory,
                                  "samples": len(audio)})
    if len(renders) > 1:
        n = min(len(r) for r in renders)
        result["same_length"] = len({len(r) for r in renders}) == 1
        result["max_abs_diff"] = float(np.max(np.abs(renders[0][:n] - renders[1][:n]))) if n else None
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
