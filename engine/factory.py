"""Provides build_synthesizer(): the ONLY place that picks concrete backends (lazy device imports)."""
from __future__ import annotations

import itertools
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator, MutableMapping

from engine.config import DECODER_DTYPES, EngineConfig
from engine.cpu_pools import CPU_LLM_ROWS, CpuPools, cpu_decoder_dtype, cpu_pools, usable_cores
from engine.errors import GenerationError, VoiceError, one_line
from engine.events import EventSink, Notice, StartupPhase, ignore_events
from engine.families.base import ModelFamily
from engine.lane_scheduler import LaneSizing
from engine.pacing import Pacer
from engine.pipeline import Synthesizer
from engine.voices import GlobalsCache, VoiceBank
from engine.windowing import WindowSchedule


def gpu_decoder_dtype(config: EngineConfig, family: ModelFamily) -> str:
    """The codec decoder's precision on a GPU: the one asked for, else fp32 for a deterministic engine (an export is
    heard many times and has time for full precision), else the family's streaming one."""
    if config.decoder_dtype != "auto":
        return config.decoder_dtype
    return "fp32" if config.deterministic else family.gpu_decoder_dtype


ONE_LISTENER_DECODE_BATCHES = (1, 4)
"""Decoder graph batches captured for each window length for one listener (EngineConfig.one_listener; others
capture batching.DECODE_BATCHES), whose windows come from at most two sentences at once
(two replay the batch-4 graph): fewer graphs to capture make a fresh `voicectl say` done sooner, with the same
first audio."""
SLOW_GPU_DECODE_S = 0.05
"""A GPU decode of a first window slower than this (a normal GPU takes a few ms) is timed against the CPU."""


def build_synthesizer(config: EngineConfig = EngineConfig(), events: EventSink = ignore_events) -> Synthesizer:
    """Load the model and wire a Synthesizer. Raises VoiceError subclasses with user-facing messages."""
    if config.backend == "fake":
        return _build_fake(config, config.voices or VoiceBank(), events)
    from engine.families import detect
    from engine.model import resolve_model_dir

    with phase("checkpoint", events):
        root = resolve_model_dir(config.model)
        family = detect(root)
        info = family.read(root)
    config = replace(config, schedule=config.schedule or family.schedule)
    voices = config.voices or family.voices()
    with phase("tokenizer", events):
        encode = _load_encoder(info)
    _init_torch(events, gpu_device(config))
    decoder = _build_decoder(family, info, config, events)
    generator = _build_generator(info, config, events)
    cache = GlobalsCache(info.checkpoint_hash, root=_path(config.cache_dir))
    may_lag = _may_lag(config, decoder)
    schedule = _schedule(config, may_lag, family.schedule)
    synth = Synthesizer(generator, decoder, family.grammar(info, encode), voices, cache, schedule=schedule,
                        join=config.join, events=events,
                        eager_lookahead=generator.concurrent_streams,
                        decode_batch=_decode_batch(config), model_info=info,
                        pacer=Pacer(probe_first=may_lag, windows_s=windows_s(schedule, decoder),
                                    ahead_windows_s=windows_s(schedule.ahead(), decoder)),
                        devices=_devices(generator, decoder))
    _warm_up_if_asked(synth, config, events)
    if config.freeze_heap:
        with phase("freeze_heap", events):
            _freeze_heap()
    return synth


def gpu_device(config: EngineConfig) -> str:
    """The GPU this engine's parts go to where they run on one: EngineConfig.device where it names one ("cuda:1"),
    else the decoder's ("cuda:1"), else "cuda" (the current one, cuda:0 unless the process chose another)."""
    for device in (config.device, config.decoder_device):
        if device.startswith("cuda:"):
            return device
    return "cuda"


def _devices(generator, decoder) -> tuple[str, ...]:
    """Where the engine computes, for its status: the LLM's device (the graph lane's where one is in front) and
    the decoder's, each once."""
    lanes = _lanes(generator)
    llm = lanes[0].device if lanes else getattr(generator, "device", None)  # vLLM: the current GPU
    names = [str(llm) if llm is not None else "cuda", str(decoder.device)]
    return tuple(dict.fromkeys(names))


def _may_lag(config: EngineConfig, decoder) -> bool:
    """The LLM or the decoder computes on the CPU (or on a GPU other than CUDA), where speech may come slower than
    real time: `speak` then learns the speed from a request's first sentence before playing it (engine.pacing)."""
    gpu_decoder = str(decoder.device).startswith("cuda")
    return not (gpu_decoder and (config.device == "auto" or config.device.startswith("cuda")) and _cuda())


def _schedule(config: EngineConfig, may_lag: bool, default: WindowSchedule = WindowSchedule()) -> WindowSchedule:
    """The user's schedule (the family's `default` where none is set); by default the finer one where an engine that
    may lag has its decoder on cores of its own (`cpu_pools`)."""
    if config.schedule is None:
        config = replace(config, schedule=default)
    schedule = config.schedule or default
    if may_lag and schedule == default and cpu_pools(config, usable_cores()).llm_spins:
        return schedule.finer()
    return schedule


def windows_s(schedule: WindowSchedule, decoder) -> tuple[float, ...]:
    """Audio of each window of a sentence under `schedule`, up to the first of `max_new` codes (which repeats)."""
    code_s = decoder.samples_per_code / decoder.sample_rate
    sizes = list(itertools.takewhile(lambda n: n < schedule.max_new, map(schedule.new_codes, itertools.count())))
    return tuple(n * code_s for n in sizes + [schedule.max_new])


def _decode_batch(config: EngineConfig) -> int | None:
    """One window per decoder call for a deterministic engine: a batch's rows may round differently from a lone
    window."""
    return 1 if config.deterministic else None


@contextmanager
def phase(name: str, events: EventSink) -> Iterator[None]:
    """Time one start-up step and report it as a StartupPhase (only when it finished)."""
    t = time.perf_counter()
    yield
    events(StartupPhase(name, time.perf_counter() - t))


COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor"}
"""Compile caches kept under the user's cache folder (unless the user points them elsewhere): Inductor's default is
in /tmp, which a reboot empties, and a server's crowd lane compiles for minutes on an empty one (Triton's own cache
is in the home folder already). Entries are keyed by GPU, software versions and code, so one folder serves every
checkpoint and upgrade."""


def keep_compile_caches(env: MutableMapping[str, str] | None = None) -> None:
    """Point the compile caches (COMPILE_CACHES) at the user's cache folder where the environment names none."""
    import os

    from engine.voices import user_cache_dir

    env = os.environ if env is None else env
    for name, folder in COMPILE_CACHES.items():
        env.setdefault(name, str(user_cache_dir() / "compile" / folder))


def _init_torch(events: EventSink, device: str = "cuda") -> None:
    """Import torch and, where there is a GPU, create the CUDA context on `device`, each timed as its own phase
    (both are paid once per process, by whichever step comes first). The compile caches are placed before anything
    compiles."""
    keep_compile_caches()
    with phase("torch_import", events):
        cuda = _cuda()
    if cuda:
        import torch

        with phase("cuda_init", events):
            if torch.device(device).index is not None:
                # this thread's current GPU: what the parts built here capture their graphs on (their own threads
                # replay them under the device guards torch puts around every call)
                torch.cuda.set_device(device)
            torch.zeros(1, device=device)


def _warm_up_if_asked(synth: Synthesizer, config: EngineConfig, events: EventSink) -> None:
    """`_warm_up` where EngineConfig.warm_up asks for it: True, or None and the decoder on the GPU."""
    if config.warm_up or (config.warm_up is None and str(synth.decoder.device).startswith("cuda")):
        _warm_up(synth, events)


def _warm_up(synth: Synthesizer, events: EventSink) -> None:
    """Synthesizer.warm_up on an event loop of its own, in a thread of its own (the caller may be inside a running
    loop; the engine's parts take whichever loop later requests come on). A failure is a notice, not an error:
    the first real request meets the same cause and reports it as its own."""
    import asyncio
    import threading

    seconds: list[float] = []
    errors: list[Exception] = []

    def run() -> None:
        try:
            seconds.append(asyncio.run(synth.warm_up()))
        except Exception as err:  # noqa: BLE001 - reported as a notice
            errors.append(err)

    thread = threading.Thread(target=run, name="warm-up")
    with phase("warm_up", events):
        thread.start()
        thread.join()
    if errors:
        events(Notice(f"warm-up request failed: {one_line(errors[0])}"))
    else:
        events(Notice(f"warmed up with one request in {seconds[0]:.2f} s"))


def _freeze_heap() -> None:
    """Collect what loading left as garbage, then move every surviving object to the collector's permanent
    generation: later full collections walk only what requests create. At exit they are handed back, so that
    shutdown frees them as before (extension modules report what is still alive then)."""
    import atexit
    import gc

    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # one hand-back at exit, however many engines this process built
    atexit.register(gc.unfreeze)


def _path(p: str | None):
    from pathlib import Path

    return Path(p) if p else None


def _build_fake(config: EngineConfig, voices: VoiceBank, events: EventSink) -> Synthesizer:
    from engine.fakes import ScriptedGenerator, ToneDecoder
    from engine.families.spark import SparkGrammar
    from engine.tokens import TokenIds
    from engine.voices import MemoryGlobalsCache

    ids = TokenIds()
    grammar = SparkGrammar(ids, lambda text: [ord(c) % 151643 for c in text])
    synth = Synthesizer(ScriptedGenerator(ids, delay_s=0.002), ToneDecoder(), grammar, voices, MemoryGlobalsCache(),
                        schedule=config.schedule or WindowSchedule(), join=config.join, events=events,
                        decode_batch=_decode_batch(config))
    _warm_up_if_asked(synth, config, events)
    return synth


def _load_encoder(info):
    """The checkpoint's tokenizer as text -> ids. tokenizer.json is read by the tokenizers library alone (the same
    ids as transformers' fast tokenizer, without importing transformers); transformers only where it is missing."""
    path = info.llm_dir / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        return lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    from engine.backends.torch_gen import import_transformers

    transformers = import_transformers(f"a tokenizer without {path}")
    auto = transformers.AutoTokenizer.from_pretrained(str(info.llm_dir))
    return lambda text: auto.encode(text, add_special_tokens=False)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _build_decoder(family, info, config: EngineConfig, events: EventSink = ignore_events):
    """The family's codec decoder on the GPU (own stream, CUDA graphs for the schedule's window shapes where it
    captures them) when there is one and it is not measurably slower than the CPU; else on the CPU. Built before
    vLLM so vLLM sizes itself around it."""
    from engine.batching import DECODE_BATCHES

    device = config.decoder_device
    if device == "auto":
        device = gpu_device(config) if _cuda() else "cpu"
    elif device == "cuda":
        device = gpu_device(config)
    if not device.startswith("cuda"):
        return _cpu_decoder(family, info, config, events)
    import torch

    from engine.batching import lengths_for

    dtype = gpu_decoder_dtype(config, family)
    lengths = lengths_for(config.schedule or family.schedule)  # build_synthesizer set the family's where none was

    def build(precision: str):
        return family.decoder(info, device, precision, threads=config.threads, deterministic=config.deterministic,
                              autotune=config.decoder_autotune)

    try:
        with phase("decoder", events):
            gpu = build(dtype)
            if dtype != "fp32" and config.decoder_dtype == "auto":  # before any graph is captured in it
                gpu, dtype = full_precision_if_lost(gpu, dtype, build, family.probe_item(lengths[-1]), events)
        batches = ONE_LISTENER_DECODE_BATCHES if config.one_listener else DECODE_BATCHES
        with phase("decoder_graphs", events):
            # a deterministic engine renders whole sentences, whose lengths no captured window matches
            seconds = 0.0 if config.deterministic else gpu.warmup(lengths, batches)
    except RuntimeError as err:  # out of memory, driver trouble
        if config.decoder_device.startswith("cuda"):
            raise GenerationError(f"cannot run the decoder on the GPU: {str(err).splitlines()[0]}") from err
        events(Notice(f"GPU decoder unavailable ({str(err).splitlines()[0]}); decoding on the CPU"))
        return _cpu_decoder(family, info, config, events)
    graphs = "no CUDA graphs" if config.deterministic or not seconds else f"CUDA graphs captured in {seconds:.1f} s"
    events(Notice(f"decoder on {torch.cuda.get_device_name(device)} ({device}, {DECODER_DTYPES[dtype]}, {graphs})"))
    if config.decoder_device == "auto":
        probe = family.probe_item(lengths[0])
        gpu_s = probe_decoder(gpu, probe)
        if gpu_s > SLOW_GPU_DECODE_S:
            cpu = _cpu_decoder(family, info, config, events)
            cpu_s = probe_decoder(cpu, probe)
            if cpu_s < gpu_s:
                events(Notice(f"the GPU decodes slower than the CPU here ({gpu_s * 1e3:.0f} vs "
                              f"{cpu_s * 1e3:.0f} ms per window); decoding on the CPU"))
                return cpu
    return gpu


def _cpu_decoder(family, info, config: EngineConfig, events: EventSink):
    dtype = cpu_decoder_dtype(config)
    with phase("decoder", events):
        decoder = family.decoder(info, "cpu", dtype, threads=config.threads)
    if dtype != "fp32":
        events(Notice(f"decoder on the CPU: {DECODER_DTYPES[dtype]} (float32 with --quantize none)"))
    return decoder


def full_precision_if_lost(decoder: Any, dtype: str, build: Callable[[str], Any], probe: Any,
                           events: EventSink) -> tuple[Any, str]:
    """`decoder`, in the family's lower precision `dtype`, where it decodes the probe window to finite audio; else a
    decoder `build` makes in fp32, said once. fp16's range ends at 65,504, and weights of one checkpoint may take a
    layer past it where the synthetic ones did not: the engine then speaks in full precision rather than fail every
    request on non-finite audio."""
    try:
        decoder.decode([probe])
        return decoder, dtype
    except GenerationError:
        events(Notice(f"the decoder's {dtype} overflows on this checkpoint (non-finite audio); decoding in fp32"))
        return build("fp32"), "fp32"


def probe_decoder(decoder, item, repeats: int = 3) -> float:
    """Median seconds of one decode of `item` (after one untimed call)."""
    import statistics

    decoder.decode([item])
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        decoder.decode([item])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _build_generator(info, config: EngineConfig, events: EventSink):
    """vLLM (with the graph lane in front) on a GPU; else the torch generator (with the lane in front on a GPU).
    One listener (`one_listener`, backend auto): the lane in front of the torch generator, no vLLM."""
    backend = config.backend
    want_lane = config.graph_lane and not config.deterministic
    lane, tried = None, False
    gpu = _cuda() and (config.device != "cpu" or backend == "vllm")  # --compute cpu: the LLM stays on the CPU
    device = gpu_device(config)
    if config.deterministic:
        return _deterministic_generator(info, config, events, gpu)
    if backend == "auto" and config.one_listener and want_lane and gpu:
        lane, tried = _build_lane(info, events, device, rows=config.lane_rows), True
        if lane is not None:  # else vLLM below, as ever
            events(Notice("one listener: the graph lane carries it, vLLM is not started (--backend vllm starts it)"))
            return _torch_generator(info, config, events, lane)
    if backend in ("auto", "vllm") and gpu:
        try:
            if not _current_gpu(device):
                raise ImportError(f"vLLM runs on the process's current GPU, not {device}; give each engine a process "
                                  f"whose CUDA_VISIBLE_DEVICES names its GPU")
            from engine.backends.vllm_gen import VllmTokenGenerator

            # no lane without vLLM (the torch generator below is the fallback)
            if not _vllm_installed():
                raise ImportError("vllm is not installed")
            lane = _build_lane(info, events, device, rows=config.lane_rows) if want_lane and not tried else None
            if backend == "auto" and lane is not None and holds_a_crowd(lane):
                events(Notice(f"the graph lane holds a crowd ({lane.rows} rows): vLLM is not started "
                              f"(--backend vllm starts it)"))
                return _torch_generator(info, config, events, lane)
            with phase("vllm", events):
                gen = VllmTokenGenerator(info, events=events)
            return gen if lane is None else lane_router(gen, lane, events)
        except (ImportError, VoiceError, RuntimeError) as err:
            if backend == "vllm":
                raise
            events(Notice(f"vLLM unavailable ({str(err).splitlines()[0]}); using the torch generator"))
    return _torch_generator(info, config, events, lane, build_lane=want_lane and not tried)


def _deterministic_generator(info, config: EngineConfig, events: EventSink, gpu: bool):
    """EngineConfig.deterministic's generator: on a GPU, the fixed-shape lane in front of the torch generator, which
    takes only what the lane cannot hold (decided by the request alone, never by load); else the torch generator."""
    from engine.errors import InputError

    if config.backend == "vllm":
        raise InputError("vLLM cannot reproduce a sentence's bytes across runs (its batches change the arithmetic); "
                         "leave --backend at auto or torch")
    from engine.families import family

    sizing = family(info.family).lane
    lanes = _build_fixed_lanes(info, sizing, events, gpu_device(config)) if gpu else []
    if not lanes:
        return _torch_generator(info, config, events)
    import torch

    fallback = _plain_torch_generator(info, config, events, torch.device(gpu_device(config)), lazy=True)
    return fixed_lane_chain(fallback, lanes, events, fit_budget=sizing.fit_budget)


def fixed_lane_chain(fallback, lanes: list, events: EventSink = ignore_events, fit_budget: bool = False):
    """`lanes` (shortest first) in front of `fallback`: a request runs on the first lane that holds it, else on
    `fallback`; decided by the request alone (never by load), and a lane's failure is the request's error. With
    `fit_budget` (LaneSizing.fit_budget) the longest lane takes every prompt it holds, its budget cut to fit."""
    from engine.backends.graph_gen import LaneRouter

    generator = fallback
    for lane in reversed(lanes):
        generator = LaneRouter(generator, lane, others_limit=None, handoff_at=None, overflow=False, failover=False,
                               fit_budget=fit_budget and lane is lanes[-1], events=events)
    return generator


def _build_fixed_lanes(info, sizing: LaneSizing, events: EventSink, device: str = "cuda") -> list:
    """The fixed-shape lanes of `sizing.fixed` (the family's GraphLane `fixed_shapes`), each sized to the GPU; none,
    with a notice, where they cannot run."""
    import torch

    from engine.backends.graph_gen import GraphLane, fixed_rows_for, row_bytes
    from engine.backends.qwen2_checkpoint import Qwen2Weights

    gpu = torch.device(device)
    if not _lane_runs_on(gpu, events, "; the torch generator renders one step per sentence"):
        return []
    t0 = time.perf_counter()
    model = Qwen2Weights.from_checkpoint(info.llm_dir)
    memory = torch.cuda.get_device_properties(gpu).total_memory
    shapes = [(fixed_rows_for(memory, row_bytes(model.config, max_len=positions), most, sizing.fixed_share), positions)
              for positions, most in sizing.fixed]
    try:
        lanes = [GraphLane(model, info.token_ids, info.token_ids.audio_ids, device=gpu, rows=rows, max_len=positions,
                           fixed_shapes=True, repetition_penalty=penalised(info))
                 for rows, positions in shapes]
    except torch.OutOfMemoryError as err:
        raise fixed_lanes_too_big(shapes, row_bytes(model.config, max_len=1), torch.cuda.mem_get_info(gpu)) from err
    events(Notice(f"graph lanes of fixed shapes ready in {time.perf_counter() - t0:.1f} s ("
                  f"{', '.join(f'{lane.rows} rows x {lane.max_len} positions' for lane in lanes)}; CUDA graphs "
                  f"captured in {sum(lane.capture_s for lane in lanes):.1f} s)"))
    events(StartupPhase("lane", time.perf_counter() - t0))
    return lanes


def fixed_lanes_too_big(shapes: list[tuple[int, int]], position_bytes: int, memory: tuple[int, int]) -> GenerationError:
    """The one line for fixed-shape lanes (rows, positions) that the GPU's free memory (free, total bytes) cannot
    hold. Their rows follow the card's total memory, not what is free, so that a sentence's bytes never depend on
    what else runs; the user frees the card instead."""
    need = sum(rows * positions for rows, positions in shapes) * position_bytes
    free, total = memory
    return GenerationError(f"out of GPU memory for the export's lanes ({need / 2**30:.1f} GiB of KV cache; "
                           f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free): stop what else runs on this GPU "
                           f"(a `voicectl serve`?) and run it again, or use --compute cpu")


def _torch_generator(info, config: EngineConfig, events: EventSink, lane=None, build_lane: bool = False):
    """The torch generator, behind `lane` (or one built here with `build_lane`) on a GPU. Behind a lane it loads on
    its first request: it only takes what the lane cannot, which most processes never meet."""
    import torch

    from engine.backends.torch_gen import pick_device

    device = pick_device() if config.device == "auto" else torch.device(config.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device(gpu_device(config))
    if device.type == "cuda" and lane is None and build_lane:
        lane = _build_lane(info, events, device, rows=config.lane_rows)
    gen = _plain_torch_generator(info, config, events, device, lazy=lane is not None)
    return gen if lane is None else lane_router(gen, lane, events)


def _plain_torch_generator(info, config: EngineConfig, events: EventSink, device, lazy: bool):
    from engine.backends.torch_gen import TorchTokenGenerator
    from engine.voices import user_cache_dir

    quantize = _quantize(config, device)
    quantized_dir = user_cache_dir() / "llm" / info.checkpoint_hash if quantize != "none" else None
    pools = cpu_pools(config, usable_cores()) if device.type == "cpu" else CpuPools(config.threads, None, False)
    with phase("llm", events):
        return TorchTokenGenerator(str(info.llm_dir), info.token_ids, device=device, threads=pools.torch,
                                   lazy=lazy, quantize=quantize, quantized_dir=quantized_dir, events=events,
                                   llm_threads=pools.llm, llm_spins=pools.llm_spins,
                                   rows=1 if config.deterministic else CPU_LLM_ROWS)


def _quantize(config: EngineConfig, device) -> str:
    """EngineConfig.quantize for an LLM on `device`: auto is int8 on the CPU where ONNX Runtime is installed."""
    from engine.backends import qwen2_ort
    from engine.errors import InputError

    if device.type != "cpu":
        if config.quantize in qwen2_ort.QUANTIZED:
            raise InputError(f"--quantize {config.quantize} is the LLM's CPU path; add --compute cpu, or leave it "
                             f"out on a GPU")
        return "none"
    return ("int8" if qwen2_ort.supported() else "none") if config.quantize == "auto" else config.quantize


def _build_lane(info, events: EventSink, device=None, rows: int | None = None, background: bool = False,
                between: Callable[[str], None] | None = None):
    """The CUDA-graph lane on `device` (default: the current GPU), or None with a notice. Built before vLLM,
    which sizes its memory around what is left. The lane is optional: whatever goes wrong here is a notice.
    `between`: called before each graph capture with what it captures (background tuning waits there for live
    streams)."""
    import torch

    device = torch.device(device or "cuda")
    if not _lane_runs_on(device, events):
        return None
    t0 = time.perf_counter()
    if background:  # the live streams keep their cores while Inductor compiles this lane's steps
        from engine.backends.compile_pool import start_compile_pool

        start_compile_pool()
    try:
        lane = _new_lane(info, device, rows, compiled=True, background=background, between=between)
    except Exception as err:  # noqa: BLE001 - Inductor/Triton trouble: plain graphs may still work
        failure = one_line(err)
        lane = None
    if lane is None:  # retried outside the except block, so the failed attempt's GPU memory is gone first
        _free_gpu_memory()
        try:
            lane = _new_lane(info, device, rows, compiled=False, background=background, between=between)
            events(Notice(f"graph lane without torch.compile or fused kernels ({failure})"))
        except Exception as err:  # noqa: BLE001 - out of memory, capture failure, unreadable weights
            _free_gpu_memory()
            events(Notice(f"graph lane unavailable ({one_line(err)}); every stream runs on the other generator"))
            return None
    events(Notice(f"graph lane ready in {time.perf_counter() - t0:.1f} s ({lane.rows} rows, CUDA graphs "
                  f"captured in {lane.capture_s:.1f} s)"))
    events(StartupPhase("lane", time.perf_counter() - t0))
    return lane


def _lane_runs_on(device, events: EventSink, then: str = "") -> bool:
    """Whether a graph lane can run on `device` (bf16 needs compute capability 8.0); else a notice, ending `then`."""
    import torch

    from engine.backends.vllm_gen import MIN_COMPUTE_CAPABILITY

    if torch.cuda.get_device_capability(device) >= MIN_COMPUTE_CAPABILITY:
        return True
    events(Notice(f"no graph lane: it needs bf16 (a GPU of compute capability 8.0 or newer){then}"))
    return False


def _new_lane(info, device, most_rows: int | None, compiled: bool, background: bool = False,
              between: Callable[[str], None] | None = None):
    """`compiled`: Inductor-compiled layers and the fused Triton decode kernels (where Triton is there); without
    it, the plain tensor code in CUDA graphs, which needs neither compiler. `background`: built while the engine
    serves (its graph captures must not forbid other threads' CUDA calls)."""
    import torch

    from engine.backends.graph_gen import GraphLane, row_bytes, rows_for
    from engine.backends.qwen2_checkpoint import Qwen2Weights
    from engine.families import family

    sizing = family(info.family).lane
    model = Qwen2Weights.from_checkpoint(info.llm_dir)
    rows = rows_for(torch.cuda.get_device_properties(device).total_memory,
                    row_bytes(model.config, max_len=sizing.positions), most_rows, sizing.memory_share)
    # the compiled layers step faster than the plain tensor code, and the fused decode kernels faster still at the
    # few rows they take
    return GraphLane(model, info.token_ids, info.token_ids.audio_ids, device=device, rows=rows,
                     max_len=sizing.positions,
                     compile_layers=compiled, fused=None if compiled else False,
                     capture_mode="thread_local" if background else "global", between=between,
                     repetition_penalty=penalised(info))


def penalised(info) -> bool:
    """Whether the checkpoint's family samples with a repetition penalty by default (Orpheus): its graph lanes
    capture the penalty's ops, a lane for any other family (Spark) stays as it was and leaves a request that asks
    for one to the generator behind it."""
    from engine.families import family

    return family(info.family).default_sampling.repetition_penalty != 1.0


def _current_gpu(device: str) -> bool:
    """Whether `device` is the process's current GPU (what vLLM, which takes no device, runs on)."""
    import torch

    index = torch.device(device).index
    return index is None or index == torch.cuda.current_device()


def _free_gpu_memory() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def _lane_in_front(generator) -> bool:
    """A graph lane (so a GPU) carries this generator's streams."""
    import sys

    graph_gen = sys.modules.get("engine.backends.graph_gen")  # never imported: no lane was built
    return graph_gen is not None and isinstance(generator, graph_gen.LaneRouter)


def lane_rows(generator) -> int:
    """Rows of the graph lanes in front of this generator (0: none)."""
    return sum(lane.rows for lane in _lanes(generator))


def _lanes(generator) -> list:
    """The graph lanes in front of this generator, first first (a deterministic engine chains several)."""
    return [generator.lane, *_lanes(generator.primary)] if _lane_in_front(generator) else []


def _vllm_installed() -> bool:
    """find_spec, not import: importing vllm configures its logging, to stdout, before VllmTokenGenerator has
    pointed it at stderr."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def holds_a_crowd(lane) -> bool:
    """A lane of CROWD_ROWS rows or more keeps every stream (lane_router): vLLM behind it would take none, and its
    engine process would only share the GPU in time slices with this one."""
    from engine.backends.graph_gen import CROWD_ROWS

    return lane is not None and lane.rows >= CROWD_ROWS


def lane_router(primary, lane, events: EventSink = ignore_events):
    """The lane in front of `primary`: a crowd's lane keeps every stream (those beyond its rows wait for one); a
    small lane hands its streams to vLLM once vLLM is busy; a torch primary (slower than the lane) never takes a
    stream."""
    from engine.backends.graph_gen import LaneRouter
    from engine.backends.torch_gen import TorchTokenGenerator

    if isinstance(primary, TorchTokenGenerator):
        # the torch generator steps eagerly (several times the lane's time a token): the lane takes every
        # stream it can (those beyond its rows wait for one), and a stream never moves to the slower generator
        return LaneRouter(primary, lane, events=events, others_limit=None, handoff_at=None, overflow=False)
    if holds_a_crowd(lane):
        # the lane serves the crowd itself: a stream sent to vLLM would run in another process, and two processes
        # on one GPU take turns, stalling the lane and the decoder of every stream (lane_scheduler.CROWD_MEMORY_SHARE)
        return LaneRouter(primary, lane, others_limit=None, handoff_at=None, overflow=False, events=events)
    return LaneRouter(primary, lane, events=events)


