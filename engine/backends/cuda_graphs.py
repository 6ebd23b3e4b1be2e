"""Provides capture_graph: one CUDA graph of a codec decoder's window batch, captured the same way by every decoder,
in the foreground before the engine serves or in the background while it serves (the graph lane captures its steps
in engine.backends.lane_runner, on a lane of its own that serves nothing yet).

A background capture runs on the tuning thread, not on the thread that serves decodes: building a new shape's kernels
(cuDNN plans the first time it sees a convolution shape, on the thread that runs it) is the slow part of a capture,
and a live stream's windows must not wait for it. So it warms up and captures on a stream of its own, in
thread_local mode (the serving threads' CUDA calls go on meanwhile), and does not replay: graphs that share a memory
pool must never run at the same time, and the serving thread replays the others.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

WARM_UPS = 2
"""Eager calls before a capture: lazy initialisation, cuDNN's algorithm choice and allocator growth happen there,
not inside the graph."""


def capture_graph(step: Callable[[], Any], *, pool: Any, stream: Any, background: bool = False
                  ) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, its output) of `step` captured on `stream` into `pool`. In the foreground the graph is replayed once
    (a graph's first launch uploads it: here, not in a request); `background`: see the module."""
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(WARM_UPS):
            step()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, pool=pool, stream=stream,
                                                  capture_error_mode="thread_local" if background else "global"):
        out = step()
    if not background:
        with torch.cuda.stream(stream):
            graph.replay()
    return graph, out
