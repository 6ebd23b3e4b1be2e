"""`python -m tests.export.ray_overlap`: two batches of three sentences on ONE CPU worker of a local Ray cluster,
as voicectl export --ray runs them (Workers.options, the fake engine, two sentences at once); prints each
sentence's index, its start and end on the worker (monotonic seconds) and its samples' SHA-256, one JSON list.

The worker is SentenceRenderer with two additions: each call waits until the other one is in the worker too (Ray
running the calls one at a time would leave the first waiting for good: the run fails), so both batches meet the
gate together; and each sentence's start and end are kept. tests/export/test_export_ray.py reads the output."""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any

import numpy as np

from engine.factory import EngineConfig
from voiceapp.cli.export import export_config
from voiceapp.cluster.export import SentenceRenderer, Workers

MEET_S = 60.0
"""How long a call waits for the other to reach the worker."""


class Probe(SentenceRenderer):
    def __init__(self, plans: list[Any], config: EngineConfig, jobs: int | None) -> None:
        super().__init__(plans, config, jobs)
        self.meet = threading.Barrier(2)
        self.spans: dict[str, tuple[float, float]] = {}
        real = self.synth.render

        async def render(request: Any) -> np.ndarray:
            start = time.monotonic()
            audio = await real(request)
            self.spans[request.text] = (start, time.monotonic())
            return audio

        self.synth.render = render  # type: ignore[method-assign]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        self.meet.wait(MEET_S)
        out = super().__call__(batch)
        spans = [self.spans[self.plans[b].sentences[i].text] for b, i in zip(out["book"], out["index"])]
        return {"index": out["index"], "start": [s for s, _ in spans], "end": [e for _, e in spans],
                "sha": [hashlib.sha256(s).hexdigest() for s in out["samples"]]}


def main() -> None:
    import ray

    from tests.export.test_export_plan import make_plan

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    workers = Workers(0, count=1, jobs=2)
    ds = ray.data.from_items([{"book": 0, "index": i} for i in range(6)], override_num_blocks=2)
    ds = ds.map_batches(Probe, fn_constructor_kwargs={"plans": [make_plan()], "jobs": workers.jobs,
                                                      "config": export_config(EngineConfig(backend="fake"))},
                        batch_size=3, batch_format="numpy", **workers.options())
    rows = [{k: row[k] for k in ("index", "start", "end", "sha")} for row in ds.iter_rows()]
    print(json.dumps(sorted(rows, key=lambda r: r["index"]), default=lambda x: x.item()))
    ray.shutdown()


if __name__ == "__main__":
    main()
