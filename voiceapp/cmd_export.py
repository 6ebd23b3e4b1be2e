"""Provides `voicectl export INPUT -o OUT.wav`: render text to a WAV file, atomically, with progress."""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from voiceapp.common import add_engine_args, add_voice_args, engine_config, read_text_file, require_speakable
from voiceapp.wavout import check_output, write_wav


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="render text (file or - for stdin) to a WAV file")
    p.add_argument("input", help="text file, or - for stdin")
    p.add_argument("-o", "--out", required=True, help="output .wav path")
    p.add_argument("--max-mb", type=int, default=4, help="largest input accepted, in MB (default 4)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    add_voice_args(p, default_seed=0)
    add_engine_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.errors import InputError

    out = Path(args.out)
    check_output(out)
    if args.max_mb < 1:
        raise InputError("--max-mb must be at least 1")
    text = read_text_file(args.input, args.max_mb * 1024 * 1024)
    require_speakable(text, "stdin" if args.input == "-" else args.input)
    show = sys.stderr.isatty() and not args.no_progress
    stats = asyncio.run(export(text, out, args, show))
    print(f"wrote {out}: {stats['audio_s']:.1f} s of audio in {stats['wall_s']:.1f} s "
          f"({stats['xrt']:.1f}x real time, {stats['sentences']} sentences)", file=sys.stderr)
    return 0


async def export(text: str, out: Path, args: argparse.Namespace, show_progress: bool) -> dict:
    """Render to a temporary file beside `out`; rename only when complete (never a truncated WAV)."""
    from engine.config import SamplingOptions, SynthesisRequest
    from engine.events import RequestFinished, SentenceFinished
    from engine.factory import build_synthesizer
    from engine.text import is_speakable, normalize, split_sentences

    total = sum(1 for s in split_sentences(text) if is_speakable(normalize(s)))
    bar = _progress_bar(total) if show_progress else None
    done: dict = {}
    t0 = time.perf_counter()

    def on_event(event) -> None:
        if isinstance(event, SentenceFinished):
            done["sentences"] = done.get("sentences", 0) + 1
            if bar is not None:
                bar.update(1)
        elif isinstance(event, RequestFinished):
            done["finished"] = event

    synth = build_synthesizer(engine_config(args), events=on_event)

    def on_chunk(chunk) -> None:
        done["samples"] = done.get("samples", 0) + len(chunk.samples)
        if bar is not None:
            xrt = done["samples"] / synth.sample_rate / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{xrt:.1f}x real time")

    try:
        req = SynthesisRequest(text, voice=args.voice, options=SamplingOptions(seed=args.seed))
        samples = await write_wav(synth.synthesize(req), out, synth.sample_rate, on_chunk)
    finally:
        if bar is not None:
            bar.close()
        await synth.close()
    wall = time.perf_counter() - t0
    audio = samples / synth.sample_rate
    return {"audio_s": audio, "wall_s": wall, "xrt": audio / wall if wall else 0.0,
            "sentences": done.get("sentences", 0)}


def _progress_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="sentence", file=sys.stderr, dynamic_ncols=True)
