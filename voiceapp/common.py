"""Provides what every voicectl command shares: engine options, engine construction, reading text input."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from engine.config import DECODER_DTYPES, QUANTIZE
from engine.errors import InputError

MAX_INPUT_BYTES = 4 * 1024 * 1024
"""Default cap on a text file read whole (a long novel is ~1 MB); --max-mb raises it."""


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", metavar="DIR", help="checkpoint directory (default: $VOICEAPP_MODEL, then the HF cache)")
    g.add_argument("--backend", choices=["auto", "torch", "vllm", "fake"], default="auto",
                   help="token generator (default: vLLM on a GPU, else torch)")
    g.add_argument("--compute", type=compute_device, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                   help="device for LLM and decoder (cuda:N: the GPU of that index)")
    g.add_argument("--threads", type=int, help="CPU threads for torch")
    g.add_argument("--quantize", choices=QUANTIZE,
                   help="the LLM's weights on the CPU: int8 (default there; converted once per checkpoint, "
                        "faster), int4 (faster still; its fidelity to the model is not verified: docs/cpu.md) "
                        "or none (fp32). A GPU's LLM is never quantised")
    g.add_argument("--decoder-dtype", choices=["auto", *DECODER_DTYPES], default="auto",
                   help="the codec decoder's precision. auto: on a GPU the model family's for streaming (fp32 "
                        "where that overflows on the checkpoint, and for an export), on the CPU bf16 where the "
                        "processor computes it natively (fp32 with --quantize none)")
    g.add_argument("--no-graph-lane", action="store_true",
                   help="on a GPU, run every stream on vLLM (or the torch generator): no in-process "
                        "CUDA-graph copy of the LLM (about 1 GB and its rows' KV cache less GPU memory, no graph "
                        "capture at start-up; a later first audio)")
    g.add_argument("--no-warm-up", action="store_true",
                   help="skip the short silent request that pays the process's first-use costs at start-up "
                        "(on a GPU the first audio then comes later)")


def compute_device(value: str) -> str:
    """--compute's value, checked (argparse turns the ValueError into its one-line usage error)."""
    from engine.config import is_device

    if not is_device(value):
        raise ValueError(value)
    return value


def add_socket_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", metavar="PATH", help="the server's socket (default: as `voicectl serve`)")


def add_server_args(p: argparse.ArgumentParser, front_end: str) -> None:
    """--no-server and --socket, for the front ends that use (and start) a background engine server."""
    p.add_argument("--no-server", action="store_true",
                   help=f"run the engine in this process: never use nor start a background engine server (also "
                        f"VOICEAPP_NO_SERVER=1). Without it, {front_end} uses the running server and starts one "
                        f"when none runs (it stops after $VOICEAPP_IDLE_TIMEOUT seconds idle, default 600)")
    add_socket_arg(p)


BUFFER_S = (0.5, 600.0)
"""--buffer's range in seconds: below it the pre-roll would not fit; above it the ring is hundreds of MB (the row
"buffer" of voiceapp.limits.OPTIONS checks it)."""
BUFFER_DEFAULT_S = 30.0
"""The player's ring unless --buffer says otherwise: an engine faster than the speakers makes up to this much ahead
instead of waiting on them, so --json's wall time is the engine's for anything shorter, and a fast stretch banks
audio for a slow one. A few MB of memory."""


def add_playback_args(p: argparse.ArgumentParser) -> None:
    """--device, --latency and --buffer: the speaker's options, for `say` and the speechd module."""
    p.add_argument("--device", help="output device name or index (see `voicectl devices`)")
    p.add_argument("--latency", type=float, default=0.1, help="output stream latency in seconds (default 0.1)")
    p.add_argument("--buffer", type=float, default=BUFFER_DEFAULT_S, metavar="SECONDS",
                   help=f"audio the player may hold ahead of what it plays (default {BUFFER_DEFAULT_S:g}): the "
                        f"engine makes speech ahead while it can instead of waiting on the speakers")


def add_voice_args(p: argparse.ArgumentParser, default_seed: int | None) -> None:
    p.add_argument("--voice", default="default", help="voice preset (see `voicectl voices`)")
    p.add_argument("--seed", type=int, default=default_seed,
                   help=f"sampling seed; same text, voice, seed and model give the same audio (default: "
                        f"{'random' if default_seed is None else default_seed})")
    p.add_argument("--max-tokens", type=int, default=3000, metavar="N",
                   help="cap on semantic tokens per sentence (3000 = 60 s of audio); each sentence is also "
                        "capped by its length (~0.16 s per character + 1 s)")


def sampling_options(args: argparse.Namespace):
    """SamplingOptions from --seed/--max-tokens; bad values become a one-line InputError."""
    from engine.config import SamplingOptions

    try:
        return SamplingOptions(seed=args.seed, max_tokens=args.max_tokens)
    except ValueError as err:
        raise InputError(str(err)) from None


def engine_config(args: argparse.Namespace, one_listener: bool = False):
    """The engine flags as an EngineConfig; `one_listener` for front ends that serve one (say, the TUI)."""
    from engine.factory import EngineConfig

    return EngineConfig(model=args.model, backend=args.backend,
                        device="auto" if args.compute == "auto" else args.compute,
                        decoder_device=args.compute, threads=checked_threads(args.threads),
                        quantize=getattr(args, "quantize", None) or "auto",
                        decoder_dtype=getattr(args, "decoder_dtype", None) or "auto",
                        graph_lane=not getattr(args, "no_graph_lane", False), one_listener=one_listener,
                        warm_up=False if getattr(args, "no_warm_up", False) else None)


def checked_threads(threads: int | None) -> int | None:
    """--threads as given, or None for torch's default; InputError unless it is at least 1."""
    if threads is not None and threads < 1:
        raise InputError(f"--threads {threads}: must be 1 or more (leave it out for torch's default)")
    return threads


def decode_text(data: bytes, source: str) -> str:
    """Bytes from a file or stdin -> text; binary or non-UTF-8 input is refused with one line."""
    if b"\x00" in data[:65536]:
        raise InputError(f"{source} looks like a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"{source} is not valid UTF-8 text (byte {err.start}); convert it with iconv") from None


def read_input_bytes(path: str, max_bytes: int, kind: str = "text file") -> bytes | None:
    """Up to `max_bytes` + 1 bytes of a file (or `-` for stdin); None means more than `max_bytes`.
    Missing, unreadable or directory paths become one-line InputErrors naming the `kind` expected."""
    source = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            p = Path(path)
            if p.is_dir():
                raise InputError(f"{path} is a directory, not a {kind}")
            with p.open("rb") as f:
                data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(f"no such file: {path}") from None
    except PermissionError:
        raise InputError(f"cannot read {path}: permission denied") from None
    except OSError as err:
        raise InputError(f"cannot read {source}: {err.strerror or err}") from None
    return None if len(data) > max_bytes else data


def read_text_file(path: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """Read a whole text file (or `-` for stdin), with the size cap and binary checks."""
    source = "stdin" if path == "-" else path
    data = read_input_bytes(path, max_bytes)
    if data is None:
        raise InputError(f"{source} is larger than {max_bytes // (1024 * 1024)} MB; "
                         f"pass --max-mb N to allow more, or split it")
    return decode_text(data, source)


def require_speakable(text: str, source: str) -> None:
    """Fail fast (before loading a model) on input with nothing to say."""
    from engine.text import is_speakable, normalize

    if not text.strip():
        raise InputError(f"{source} is empty: nothing to say")
    if not is_speakable(normalize(text)):
        raise InputError(f"{source} has no speakable words (only punctuation, symbols or emoji)")


def require_voice(name: str, model: str | None = None) -> None:
    """Fail fast (before loading a model or starting a server) on a voice the model's family does not have (a preset
    or, where the family takes them, one of the user's voices): VoiceNotFound lists those there are."""
    from engine.families import family_of

    family_of(model).voices().get(name)


_PROCESS_START: float | None = None


def process_start_perf() -> float:
    """This process's start on the time.perf_counter() clock (Linux: from /proc, to 10 ms; elsewhere: when it was
    first asked)."""
    global _PROCESS_START
    if _PROCESS_START is None:
        now = time.perf_counter()
        try:
            with open("/proc/self/stat") as f:
                start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
            _PROCESS_START = now - max(age, 0.0)
        except (OSError, ValueError, IndexError, AttributeError):
            _PROCESS_START = now
    return _PROCESS_START
