"""Provides `voicectl devices`: list the audio output devices PortAudio can see."""
from __future__ import annotations

import argparse

from engine.errors import AudioDeviceError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("devices", help="list audio output devices",
                                   description="List audio output devices (index, name, host API, default "
                                               "rate); '*' marks the default. Pass the index or name to "
                                               "--device.")
    parser.set_defaults(run=run)


def format_devices(devices: list) -> list[str]:
    """One line per device: marker, index, name, host API, default rate."""
    width = max(len(d.name) for d in devices)
    return [f"{'*' if d.is_default else ' '} {d.index:>3}  {d.name:<{width}}  {d.hostapi:<12} "
            f"{d.default_samplerate:>7.0f} Hz" for d in devices]


def run(args: argparse.Namespace) -> int:
    from engine.backends.sounddevice_sink import list_devices

    devices = list_devices()
    if not devices:
        raise AudioDeviceError("no audio output devices found; use --out FILE.wav to write a file instead")
    print("\n".join(format_devices(devices)))
    return 0
