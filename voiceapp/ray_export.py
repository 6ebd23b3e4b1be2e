"""Provides `voicectl export --ray`: a book's sentences rendered on a Ray cluster by Ray Data, one engine per GPU (a
class-based `map_batches` stage, `SentenceRenderer`, whose actors each hold one GPU; CPU actors on a cluster
without GPUs), their audio written as parts by this process as it comes back (voiceapp.cmd_export assembles them
as ever).

A part's bytes are the same whichever worker renders it: the export's engine is deterministic (EngineConfig
.deterministic) and a sentence's request depends only on the plan and its index (ExportPlan.request). What the
bytes depend on besides, the engine's identity (backend, checkpoint, platform), comes back with every sentence; the
first is checked against the manifest before any part is written, and a worker whose identity differs (a cluster
of mixed GPUs) stops the export with one line rather than mixing two renderings in one book.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from engine.config import EngineConfig
from engine.errors import VoiceError

LOG = logging.getLogger("voiceapp.ray_export")
GPU_BATCH = 160
"""Sentences a GPU worker gets at once where --jobs does not say: a data-centre GPU's deterministic lanes and the
spare an export keeps (export_plan.GPU_SPARE_JOBS), so the lanes stay full between batches."""


@dataclass(frozen=True)
class Workers:
    """Where the sentences render: one actor per GPU of the cluster, or `count` CPU actors of `cpus` each."""

    gpus: int
    count: int | None = None
    cpus: float = 1.0
    jobs: int | None = None
    """Sentences a worker renders at once (a batch): --jobs, else its lane's rows and some spare (GPU) or CPU_JOBS."""

    @property
    def batch(self) -> int:
        """Sentences sent to a worker at once: `jobs`, else enough to fill a large GPU's lane (its rows and the
        spare an export keeps), or CPU_JOBS on CPUs."""
        from engine.export_plan import CPU_JOBS

        return self.jobs or (GPU_BATCH if self.gpus else CPU_JOBS)

    def options(self) -> dict[str, Any]:
        """map_batches' resources: a GPU each, or `cpus`; as many actors as GPUs, or `count`."""
        from ray.data import ActorPoolStrategy

        if self.gpus:
            return {"num_gpus": 1, "compute": ActorPoolStrategy(size=self.count or self.gpus)}
        return {"num_cpus": self.cpus, "compute": ActorPoolStrategy(size=self.count or 1)}


class SentenceRenderer:
    """The Ray Data stage's class: one engine per actor; a batch of sentence indices in, their audio out."""

    def __init__(self, plan: Any, config: EngineConfig, jobs: int | None) -> None:
        from engine.export_plan import default_jobs
        from engine.factory import build_synthesizer, lane_rows
        from engine.platform_info import export_identity

        self.plan = plan
        self.loop = asyncio.new_event_loop()  # one loop for the engine's life: its locks and threads keep it
        self.synth = build_synthesizer(config)
        rows = lane_rows(self.synth.generator)
        self.jobs = jobs or default_jobs(rows)
        self.identity = json.dumps(export_identity(self.synth), sort_keys=True)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        indices = [int(i) for i in batch["index"]]
        audio = self.loop.run_until_complete(self._render(indices))
        return {"index": indices, "samples": [np.asarray(a, dtype="<f4").tobytes() for a in audio],
                "identity": [self.identity] * len(indices)}

    async def _render(self, indices: list[int]) -> list[np.ndarray]:
        gate = asyncio.Semaphore(self.jobs)

        async def one(index: int) -> np.ndarray:
            async with gate:
                return await self.synth.render(self.plan.request(index))

        return await asyncio.gather(*(one(i) for i in indices))


class RayRenderer:
    """Renders an export's sentences on the cluster (the module's docstring). `start` runs the dataset and returns
    the first worker's identity; `render` writes every sentence's part as it comes back."""

    def __init__(self, plan: Any, config: EngineConfig, workers: Workers) -> None:
        self.plan, self.config, self.workers = plan, config, workers
        self.identity: dict[str, Any] | None = None
        self.started: float | None = None
        """When the dataset started (perf_counter): the export's speed counts from there."""
        self._rows: Iterator[dict[str, Any]] | None = None
        self._first: dict[str, Any] | None = None
        self._probe = False
        """The plan had nothing left to render: sentence 0 was rendered only for the identity, and is dropped."""

    @property
    def sample_rate(self) -> int:
        return self.identity["sample_rate"]

    @property
    def pause_s(self) -> float:
        return self.identity["pause_s"]

    def describe(self) -> dict[str, Any]:
        return self.identity["describe"]

    async def start(self, todo: list[int]) -> dict[str, Any]:
        """Start rendering `todo` (sentence 0 alone where it is empty: the identity comes with a sentence) and
        return the engine's identity once the first sentence is back."""
        self._probe = not todo
        self.started = time.perf_counter()
        self._rows = self._dataset(todo or [0])
        self._first = await asyncio.get_running_loop().run_in_executor(None, next, self._rows, None)
        if self._first is None:
            raise VoiceError("the Ray cluster returned no sentence")
        self.identity = json.loads(self._first["identity"])
        return self.identity

    async def render(self, parts: Any, todo: list[int], jobs: int | None, on_done: Callable[[int, int], None]) -> int:
        """Write each sentence's part as it comes back (then `on_done(index, samples)`), on a worker thread: the
        sentences `start` was given (`todo` names the same). Returns the sentences a worker took at once."""
        stop = threading.Event()

        def drain() -> None:
            rows = [] if self._probe else [self._first]
            for row in _chain(rows, self._rows):
                if stop.is_set():
                    return
                if row["identity"] != self._first["identity"]:
                    raise VoiceError(f"the cluster's workers render differently ({json.loads(row['identity'])['platform']} "
                                     f"vs {self.identity['platform']}): a book's sentences must all render on one "
                                     f"kind of machine for its bytes to match; use a cluster of one kind")
                samples = np.frombuffer(row["samples"], dtype="<f4")
                parts.write(int(row["index"]), samples)
                on_done(int(row["index"]), len(samples))

        try:
            await asyncio.get_running_loop().run_in_executor(None, drain)
        finally:
            stop.set()
        return self.workers.batch

    def _dataset(self, todo: list[int]) -> Iterator[dict[str, Any]]:
        import ray

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the export's own progress is on stderr
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        batch = self.workers.batch
        ds = ray.data.from_items([{"index": i} for i in todo], override_num_blocks=max(1, len(todo) // batch))
        ds = ds.map_batches(SentenceRenderer, fn_constructor_kwargs={"plan": self.plan, "config": self.config,
                                                                     "jobs": self.workers.jobs},
                            batch_size=batch, batch_format="numpy", **self.workers.options())
        return iter(ds.iter_rows())


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest
