"""Provides `voicectl export --ray`: a book's sentences rendered on a Ray cluster by Ray Data, one engine per GPU (a
class-based `map_batches` stage, `SentenceRenderer`, whose actors each hold one GPU; CPU actors on a cluster
without GPUs), their audio written as parts by this process as it comes back (voiceapp.cli.export assembles them
as ever).

A part's bytes are the same whichever worker renders it: the export's engine is deterministic (EngineConfig
.deterministic) and a sentence's request depends only on the plan and its index (ExportPlan.request). What the
bytes depend on besides, the engine's identity (backend, checkpoint, platform), comes back with every sentence; the
first is checked against the manifest before any part is written, and a worker whose identity differs (a cluster
of mixed GPUs) stops the export with one line rather than mixing two renderings in one book.

A worker has its next batch under way while the current one's last sentences finish (CALLS_PER_WORKER), on the
same engine; the bytes stay the same, as a deterministic engine's do not depend on what renders beside them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from engine.config import EngineConfig
from engine.errors import VoiceError

LOG = logging.getLogger("voiceapp.cluster.export")
GPU_BATCH = 160
"""Sentences a GPU worker gets at once where --jobs does not say: a data-centre GPU's deterministic lanes and the
spare an export keeps (export_plan.GPU_SPARE_JOBS), so the lanes stay full between batches."""
CALLS_PER_WORKER = 2
"""Batches a worker has under way at once. With one, a worker took its next batch only once the last sentence of
the current one had ended, so every batch's tail left the engine's lanes nearly empty; with two, the next batch's
sentences wait at the worker's one gate (`jobs` at once, whichever batch they belong to) and take each row the
tail frees. More would only queue more sentences at the gate."""
CLOSE_S = 30.0
"""How long a worker's shutdown waits for its engine to close, then for its loop's thread to end."""


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
        """map_batches' resources: a GPU each, or `cpus`; as many actors as GPUs, or `count`; CALLS_PER_WORKER
        calls at once on each, CPU workers too (the same code path, the same load on the engine: the gate)."""
        from ray.data import ActorPoolStrategy

        # true multi-threading: without it Ray Data (2.60) runs a non-async class's calls one at a time whatever
        # the actor's concurrency, overlapping only the batching around them. No more calls in flight than run:
        # none waits in a busy worker's queue, so the book's last batches go to whichever worker frees first (a
        # block is only its batch's keys: there is nothing to fetch ahead)
        compute = ActorPoolStrategy(size=self.count or self.gpus or 1, max_concurrent_calls_per_actor=CALLS_PER_WORKER,
                                    max_tasks_in_flight_per_actor=CALLS_PER_WORKER, enable_true_multi_threading=True)
        return {"num_gpus": 1, "compute": compute} if self.gpus else {"num_cpus": self.cpus, "compute": compute}


class SentenceRenderer:
    """The Ray Data stage's class: one engine per actor; a batch of (book, sentence index) in, their audio out.

    Ray Data calls it from CALLS_PER_WORKER threads at once (Workers.options). Every call's sentences render on the
    one engine, on its one event loop, which runs in a thread of the actor's for the engine's life; one gate admits
    `jobs` sentences at once across the calls, first come first served, so a batch's sentences go before the next
    one's and the engine never has more than `jobs`."""

    def __init__(self, plans: list[Any], config: EngineConfig, jobs: int | None) -> None:
        from engine.export_plan import default_jobs
        from engine.factory import build_synthesizer, lane_rows
        from engine.platform_info import export_identity

        self.loop = asyncio.new_event_loop()  # one loop for the engine's life: its locks and threads keep it
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.plans = plans
        self.synth = build_synthesizer(config)
        self.jobs = jobs or default_jobs(lane_rows(self.synth.generator))
        self.identity = json.dumps(export_identity(self.synth), sort_keys=True)
        self.gate = asyncio.Semaphore(self.jobs)  # binds to self.loop when a sentence first waits on it
        self._thread.start()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        keys = [(int(b), int(i)) for b, i in zip(batch["book"], batch["index"])]
        audio = asyncio.run_coroutine_threadsafe(self._render(keys), self.loop).result()
        return {"book": [b for b, _ in keys], "index": [i for _, i in keys],
                "samples": [np.asarray(a, dtype="<f4").tobytes() for a in audio],
                "identity": [self.identity] * len(keys)}

    async def _render(self, keys: list[tuple[int, int]]) -> list[np.ndarray]:
        """The batch's audio, in its order; the first sentence that fails cancels the batch's others (their rows
        go to the other batch) and is raised."""
        async def one(book: int, index: int) -> np.ndarray:
            async with self.gate:
                return await self.synth.render(self.plans[book].request(index))

        tasks = [asyncio.ensure_future(one(b, i)) for b, i in keys]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        """Close the engine on its loop, then end the loop and its thread (once; Ray Data shuts an actor down
        after its calls have ended)."""
        if not self._thread.is_alive():  # closed already, or the engine never built
            if not self._thread.ident and not self.loop.is_closed():
                self.loop.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(self.synth.close(), self.loop).result(CLOSE_S)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(CLOSE_S)
            if not self._thread.is_alive():
                self.loop.close()

    def __del__(self) -> None:
        # Ray Data drops the actor's instance when it shuts the actor down gracefully (a killed one just ends)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - an engine that fails to close must not fail the actor's exit
            LOG.exception("the export worker's engine did not close")


class RayRenderer:
    """Renders the sentences of one or more books' exports on the cluster, in one dataset (the module's
    docstring). `start` runs it and returns the first worker's engine identity; once the caller has checked it
    against every book's manifest, `book(k)` renders book k for voiceapp.cli.export.render_and_assemble. A thread
    writes every part as it comes back, whichever book it belongs to (memory stays one batch), and tells the book's
    renderer."""

    def __init__(self, plans: list[Any], config: EngineConfig, workers: Workers) -> None:
        self.plans, self.config, self.workers = plans, config, workers
        self.identity: dict[str, Any] = {}
        self.started: float | None = None
        """When the dataset started (perf_counter): the export's speed counts from there."""
        self._rows: Iterator[dict[str, Any]] | None = None
        self._first: dict[str, Any] | None = None
        self._probe = False
        """Nothing was left to render: one sentence was rendered only for the identity, and is dropped."""
        self._parts: list[Any] = []
        self._written: list[queue.Queue] = [queue.Queue() for _ in plans]
        """Per book: (index, samples) of each part written, then None at the end (or the exception that ended it)."""
        self._pump: threading.Thread | None = None
        self._stop = threading.Event()

    async def start(self, parts: list[Any], todos: list[list[int]]) -> dict[str, Any]:
        """Start rendering each book's `todos` into its `parts` (sentence 0 of the first book alone where nothing
        is left: the identity comes with a sentence); returns the engine's identity once a sentence is back."""
        keys = [(b, i) for b, todo in enumerate(todos) for i in todo]
        self._parts, self._probe = parts, not keys
        self.started = time.perf_counter()
        self._rows = self._dataset(keys or [(0, 0)])
        self._first = await asyncio.get_running_loop().run_in_executor(None, next, self._rows, None)
        if self._first is None:
            raise VoiceError("the Ray cluster returned no sentence")
        self.identity = json.loads(self._first["identity"])
        return self.identity

    def book(self, index: int) -> "BookRenderer":
        return BookRenderer(self, index)

    def close(self) -> None:
        """Stop writing parts (an export that failed or was interrupted)."""
        self._stop.set()

    def _start_pump(self) -> None:
        if self._pump is None:
            self._pump = threading.Thread(target=self._write_parts, name="ray-parts", daemon=True)
            self._pump.start()

    def _write_parts(self) -> None:
        ended: BaseException | None = None
        first, rows = self._first, self._rows
        if first is None or rows is None:
            raise RuntimeError("start() comes before the parts are written")
        try:
            for row in _chain([] if self._probe else [first], rows):
                if self._stop.is_set():
                    return
                if row["identity"] != first["identity"]:
                    raise VoiceError(f"the cluster's workers render differently ({json.loads(row['identity'])['platform']} "
                                     f"vs {self.identity['platform']}): a book's sentences must all render on one "
                                     f"kind of machine for its bytes to match; use a cluster of one kind")
                book, index = int(row["book"]), int(row["index"])
                samples = np.frombuffer(row["samples"], dtype="<f4")
                self._parts[book].dir.mkdir(exist_ok=True)
                self._parts[book].write(index, samples)
                self._written[book].put((index, len(samples)))
        except BaseException as err:  # noqa: BLE001 - handed to the books waiting for their parts
            ended = err
        for written in self._written:
            written.put(ended)

    def _dataset(self, keys: list[tuple[int, int]]) -> Iterator[dict[str, Any]]:
        import ray

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the export's own progress is on stderr
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        batch = self.workers.batch
        ds = ray.data.from_items([{"book": b, "index": i} for b, i in keys],
                                 override_num_blocks=max(1, len(keys) // batch))
        ds = ds.map_batches(SentenceRenderer, fn_constructor_kwargs={"plans": self.plans, "config": self.config,
                                                                     "jobs": self.workers.jobs},
                            batch_size=batch, batch_format="numpy", **self.workers.options())
        return iter(ds.iter_rows())


class BookRenderer:
    """One book of a RayRenderer, as voiceapp.cli.export.render_and_assemble renders it."""

    def __init__(self, renderer: RayRenderer, index: int) -> None:
        self.renderer, self.index = renderer, index
        self.sample_rate: int = renderer.identity["sample_rate"]
        self.pause_s: float = renderer.identity["pause_s"]
        self.started = renderer.started

    async def render(self, parts: Any, todo: list[int], jobs: int | None, on_done: Callable[[int, int], None]) -> int:
        """Wait until every sentence of `todo` is written (`on_done(index, samples)` for each); returns the
        sentences a worker took at once."""
        self.renderer._start_pump()
        wanted, loop = set(todo), asyncio.get_running_loop()
        written = self.renderer._written[self.index]
        while wanted:
            item = await loop.run_in_executor(None, written.get)
            if isinstance(item, BaseException):
                raise item
            if item is None:
                raise VoiceError(f"the Ray cluster stopped with {len(wanted)} sentences of the book not rendered; "
                                 f"run it again with --resume")
            index, samples = item
            if index in wanted:
                wanted.discard(index)
                on_done(index, samples)
        return self.renderer.workers.batch


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest
