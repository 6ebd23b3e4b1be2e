"""Provides `voicectl doctor`: checks model, GPU, vLLM, Triton and audio, plays a short test signal, says what to
fix."""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    critical: bool = True
    """A failed critical check makes doctor exit non-zero."""


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check model, GPU, vLLM, Triton and audio; play a test tone")
    p.add_argument("--model", metavar="DIR", help="checkpoint directory to check")
    p.add_argument("--device", help="audio output device name or index")
    p.add_argument("--no-sound", action="store_true", help="do not play the test tone")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    checks = [check_model(args.model), check_torch(), check_gpu(), check_vllm(), check_triton(), *check_audio(args)]
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.critical else "note")
        print(f"[{mark}] {c.name:<10} {c.detail}")
        if not c.ok and c.fix:
            print(f"       fix: {c.fix}")
    failed = [c for c in checks if not c.ok and c.critical]
    print("all good" if not failed else f"{len(failed)} problem(s): see the fixes above")
    return 1 if failed else 0


def check_model(arg: str | None) -> Check:
    from engine.errors import VoiceError
    from engine.families import detect
    from engine.model import resolve_model_dir

    try:
        root = resolve_model_dir(arg)
        family = detect(root)
        info = family.read(root)
    except VoiceError as err:
        return Check("model", False, str(err), "voicectl model download   (or --model DIR / VOICEAPP_MODEL)")
    return Check("model", True, f"{info.root}: {family.name}, {info.sample_rate} Hz (hash {info.checkpoint_hash})")


def check_torch() -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check("torch", False, "PyTorch is not installed", "pip install torch")
    import torch

    return Check("torch", True, f"{torch.__version__}, {torch.get_num_threads()} CPU threads")


def check_gpu() -> Check:
    try:
        import torch
    except ImportError:
        return Check("gpu", False, "no torch", critical=False)
    if not torch.cuda.is_available():
        return Check("gpu", False, "no CUDA GPU: the LLM and decoder run on the CPU (slower than real time "
                     "for the full model)", "use a machine with an NVIDIA GPU for real-time speech", critical=False)
    free, total = torch.cuda.mem_get_info()
    return Check("gpu", True, f"{torch.cuda.get_device_name()} ({free / 2**30:.1f} of {total / 2**30:.1f} GiB free)")


def check_vllm() -> Check:
    if importlib.util.find_spec("vllm") is None:
        if not _cuda():  # vLLM serves crowds on a GPU; a CPU runs the int8 LLM, which needs nothing more
            return Check("vllm", True, "not installed, and not needed without a CUDA GPU (the LLM runs in int8 "
                         "through ONNX Runtime)")
        return Check("vllm", False, "not installed: the graph lane and the torch generator carry every stream",
                     "pip install -e '.[vllm]' (for crowds: many streams at once)", critical=False)
    from importlib.metadata import version

    return Check("vllm", True, version("vllm"))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def check_triton() -> Check:
    """Triton compiles the graph lane's fused decode kernels (CUDA wheels of PyTorch bring it)."""
    if importlib.util.find_spec("triton") is None and not _cuda():
        return Check("triton", True, "not installed, and not needed without a CUDA GPU")
    if importlib.util.find_spec("triton") is None:
        return Check("triton", False, "not installed: on a GPU the graph lane steps without its fused decode "
                     "kernels, so each token takes longer", "pip install triton", critical=False)
    from importlib.metadata import version

    return Check("triton", True, version("triton"))


def check_audio(args: argparse.Namespace) -> list[Check]:
    from engine.backends.sounddevice_sink import list_devices
    from engine.errors import AudioDeviceError

    try:
        devices = list_devices()
    except AudioDeviceError as err:
        return [Check("audio", False, str(err), "install libportaudio2 (Debian/Ubuntu) or use --out FILE.wav")]
    if not devices:
        return [Check("audio", False, "no output devices", "connect speakers, start PulseAudio/PipeWire, "
                      "or use --out FILE.wav")]
    default = next((d for d in devices if d.is_default), devices[0])
    checks = [Check("audio", True, f"{len(devices)} output device(s); default: {default.name} "
                    f"({default.hostapi}, {default.default_samplerate:.0f} Hz)")]
    if not args.no_sound:
        checks.append(play_test_tone(args.device))
    return checks


def play_test_tone(device: str | None) -> Check:
    """Half a second of 440 Hz through the real player: reports underruns and the audible onset."""
    import time

    import numpy as np

    from engine.backends.sounddevice_sink import Player
    from engine.crossfade import fade_edges
    from engine.errors import AudioDeviceError

    rate = 16000
    tone = (0.2 * np.sin(2 * np.pi * 440 * np.arange(rate // 2) / rate)).astype(np.float32)
    tone = fade_edges(tone, 160, 160)
    dev = int(device) if device and device.isdigit() else device

    async def play() -> tuple[int, float | None]:
        with Player(sample_rate=rate, device=dev) as player:
            t0 = time.perf_counter()
            player.mark_utterance_start()
            await player.write(tone)
            await player.drain()
            onset = player.last_onset_perf
            return player.underruns, (onset - t0) * 1000 if onset else None

    try:
        underruns, onset_ms = asyncio.run(play())
    except AudioDeviceError as err:
        return Check("playback", False, str(err), "check the device with `voicectl devices`; or use --out")
    onset = f"{onset_ms:.0f} ms" if onset_ms is not None else "unknown"
    ok = underruns == 0
    return Check("playback", ok, f"test tone played: audible onset {onset}, underruns {underruns}",
                 "" if ok else "the audio device cannot keep up: try --latency 0.2")
