"""The reading benchmark: a minute's reading spoken by fresh `voicectl say` processes, one for each choice of
weights, so that a user can see whether this machine speaks the model live and what each choice costs.

Each process plays through the speakers with a ring the text cannot fill (`say --buffer`), so its wall time is the
engine's own while the real player plays, not the speakers' pace; with `--no-sound` it writes a WAV instead. The
runs go one after another in the order given, and each RTF is also given against the first run's. `report` and
`format_table` are pure; `read_runs` launches the processes. The table goes to stdout, the report to --json; the
exit status is non-zero (one line) when a run failed, the others' figures still reported. Run from the repository
root:

    python -m lab.read_bench --model $MODEL --weights int8,int4,none [--no-sound] --json $OUT/read.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from lab import lab_cli
from voiceapp.cmd_bench import checkpoint_for, command_line, log, write_json
from voiceapp.common import BUFFER_S

PROG = "python -m lab.read_bench"
DEVICE_TIMEOUT_S = 900.0
"""Longest the probe that names the device may take (it imports torch)."""

READ_TEXT = ("The morning train left the valley station a little after seven o'clock. Rain had fallen all night, and "
             "the fields beside the river were shining. Most of the passengers read quietly, or watched the hills "
             "drift slowly by. At the third stop a tall man with a violin case took the empty seat here. He smiled, "
             "opened a small notebook, and began to hum a very old melody.")
"""The default reading: five sentences of a similar length, about a minute of speech (docs/cpu.md)."""
RING_S_PER_CHAR = 0.2
"""Ring seconds per character of text: above the longest a sentence may speak (engine.text.sentence_token_cap: about
0.16 s a character plus 1 s a sentence), so the player never makes the engine wait."""
RING_S = (10.0, BUFFER_S[1])
"""The ring's least and most seconds (the most is what `say --buffer` takes)."""
MAX_TEXT_CHARS = int(RING_S[1] / RING_S_PER_CHAR)
"""--text's limit: the most the largest ring holds, so that the player never makes the engine wait."""
SEED = 1
"""Every run samples with this seed: the same text, the same weights, the same speech."""


@dataclass
class ReadRun:
    """One `voicectl say` process reading the text."""

    weights: str
    """Its --quantize value ("auto": the engine's own choice)."""
    rtf: float | None = None
    """Wall time from the request to the last audio made, per second of audio."""
    audio_s: float | None = None
    ttfa_s: float | None = None
    """From the request (engine ready) to the first audio made."""
    first_sound_s: float | None = None
    """From the request to the first sample the speakers played (None with --no-sound)."""
    underruns: int | None = None
    """Times the speakers ran dry inside a sentence (None with --no-sound)."""
    quiet_s: float | None = None
    """Silence the speakers played between the first sound and the last beyond the pauses between sentences (which
    count as audio): the waits of sentences held until they could play through (None with --no-sound)."""
    process_s: float | None = None
    """The process's launch to its exit: model loading, conversion and the whole playback included."""
    notices: tuple[str, ...] = ()
    """What the engine said (its weights, conversion, pacing)."""
    error: str | None = None
    """The process's last error line, when it failed."""


def ring_s(text: str) -> float:
    """The player's ring for `text`: more than it can speak, within RING_S."""
    return min(max(RING_S_PER_CHAR * len(text), RING_S[0]), RING_S[1])


def say_command(model: Path, weights: str, text: str, *, out: Path | None, backend: str = "auto",
                threads: int | None = None) -> list[str]:
    """The `voicectl say` command line of one run (in-process engine, metrics as JSON)."""
    command = [sys.executable, "-m", "voiceapp.cli", "say", "--no-server", "--json", "--model", str(model),
               "--seed", str(SEED), "--backend", backend, "--buffer", f"{ring_s(text):g}"]
    if weights != "auto":
        command += ["--quantize", weights]
    if threads is not None:
        command += ["--threads", str(threads)]
    if out is not None:
        command += ["--out", str(out)]
    return [*command, "--", text]


def read_runs(model: Path, weights: Sequence[str], text: str, *, sound: bool, backend: str = "auto",
              threads: int | None = None, timeout_s: float = 3600.0,
              log: Callable[[str], None] = lambda message: None) -> list[ReadRun]:
    """Read `text` once for each of `weights`, one fresh process after another. A run that fails keeps its error
    line; the others still run."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="voiceapp-read-") as work:
        for choice in weights:
            out = None if sound else Path(work) / f"{choice}.wav"
            log(f"reading with {choice} weights{'' if sound else ' (no sound)'}")
            started = time.perf_counter()
            try:
                proc = subprocess.run(say_command(model, choice, text, out=out, backend=backend, threads=threads),
                                      capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                runs.append(ReadRun(choice, error=f"took longer than {timeout_s:g} s"))
                continue
            runs.append(parse_run(choice, proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - started,
                                  sound))
    return runs


def parse_run(weights: str, returncode: int, stdout: str, stderr: str, process_s: float, sound: bool) -> ReadRun:
    """A ReadRun from a finished `say --json` process."""
    lines = stdout.strip().splitlines()
    if returncode != 0 or not lines:
        errors = [line.removeprefix("voicectl: ") for line in stderr.strip().splitlines() if line.strip()]
        return ReadRun(weights, process_s=process_s, error=errors[-1] if errors else f"exit status {returncode}")
    said = json.loads(lines[-1])
    first_sound, played = _seconds(said["onset_ms"]), _seconds(said.get("played_ms"))
    quiet = (played - first_sound - said["audio_s"] if sound and first_sound is not None and played is not None
             else None)
    return ReadRun(weights, rtf=said["rtf"], audio_s=said["audio_s"], ttfa_s=_seconds(said["ttfa_ms"]),
                   first_sound_s=first_sound if sound else None, underruns=said["underruns"] if sound else None,
                   quiet_s=quiet, process_s=process_s, notices=tuple(said["notices"]))


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def report(runs: Sequence[ReadRun], meta: dict) -> dict:
    """The JSON report: `meta` (device, date, command, model, ...), every run, and each RTF over the first's."""
    first = runs[0].rtf if runs else None
    return {**meta, "runs": [asdict(run) for run in runs],
            "rtf": {run.weights: run.rtf for run in runs},
            "rtf_over_first": {run.weights: None if run.rtf is None or not first else round(run.rtf / first, 3)
                               for run in runs},
            "errors": [f"{run.weights}: {run.error}" for run in runs if run.error]}


def format_table(result: dict) -> str:
    """The report as a table, one row a run."""
    def cell(value, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = [f"{result.get('device', '')}; {result.get('model', '')}; ring {result.get('ring_s', 0):g} s"
             f"{'' if result.get('sound') else ', no sound (--no-sound)'}",
             f"{'weights':8} {'RTF':>7} {'vs first':>8} {'audio s':>8} {'TTFA s':>7} {'sound s':>8} "
             f"{'underruns':>9} {'quiet s':>7} {'process s':>9}"]
    for run in result["runs"]:
        if run["error"]:
            lines.append(f"{run['weights']:8} failed: {run['error']}")
            continue
        lines.append(f"{run['weights']:8} {cell(run['rtf']):>7} {cell(result['rtf_over_first'][run['weights']]):>8} "
                     f"{cell(run['audio_s'], 2):>8} {cell(run['ttfa_s'], 2):>7} {cell(run['first_sound_s'], 2):>8} "
                     f"{cell(run['underruns']):>9} {cell(run.get('quiet_s'), 2):>7} {cell(run['process_s'], 1):>9}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = lab_cli.parser(PROG, "a minute's reading spoken by a fresh `voicectl say` process for each --weights, "
                             "through the speakers with a ring it cannot fill, so RTF is the engine's own while it "
                             "plays")
    p.add_argument("--text", metavar="FILE", help="read this UTF-8 text instead of the built-in five sentences")
    p.add_argument("--weights", metavar="LIST", default="auto",
                   help="comma-separated --quantize values, one run each, in order (default auto; e.g. int8,int4,none: "
                        "each RTF is also given against the first's)")
    p.add_argument("--no-sound", action="store_true", help="write each reading to a WAV file instead of playing it")
    p.add_argument("--backend", choices=["auto", "torch", "vllm"], default="auto")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    return p


def run(args: argparse.Namespace) -> int:
    """Read the text once for each --weights; the table on stdout, the report to --json."""
    from engine.errors import GenerationError
    from lab.startup_cases import describe_device

    weights, text = read_options(args)
    if not args.no_sound:
        check_speakers()
    started = datetime.datetime.now().astimezone()
    with checkpoint_for(args, log) as (model, checkpoint):
        device, _ = describe_device(DEVICE_TIMEOUT_S)
        runs = read_runs(model, weights, text, sound=not args.no_sound, backend=args.backend, threads=args.threads,
                         log=log)
    meta = {"device": device, "date": started.date().isoformat(), "command": command_line(PROG), "model": checkpoint,
            "text_chars": len(text), "ring_s": ring_s(text), "sound": not args.no_sound}
    result = report(runs, meta)
    print(format_table(result))
    if args.json:
        write_json(Path(args.json), result)
    if result["errors"]:
        raise GenerationError(f"{len(result['errors'])} of {len(runs)} readings failed: {'; '.join(result['errors'])}")
    return 0


def check_speakers() -> None:
    """Fail before any model loads when there is no output device to read through (suggesting --no-sound)."""
    from engine.backends.sounddevice_sink import FILE_HINT, import_sounddevice, pick_device_rate
    from engine.errors import AudioDeviceError

    try:
        pick_device_rate(import_sounddevice(), None, 16000)
    except AudioDeviceError as err:
        reason = str(err).removesuffix(f"; {FILE_HINT}")
        raise AudioDeviceError(f"{reason}; --no-sound reads into WAV files instead") from None


def read_options(args: argparse.Namespace) -> tuple[tuple[str, ...], str]:
    """(weights, text) from --weights and --text; a bad one is a one-line InputError."""
    from engine.config import QUANTIZE
    from engine.errors import InputError
    from voiceapp.common import decode_text, read_input_bytes, require_speakable

    weights = tuple(w.strip() for w in args.weights.split(",") if w.strip())
    unknown = [w for w in weights if w not in ("auto", *QUANTIZE)]
    if not weights or unknown or len(set(weights)) < len(weights):
        raise InputError(f"--weights: expected distinct values of auto, {', '.join(QUANTIZE)}; got {args.weights!r}")
    if args.backend == "vllm" and weights != ("auto",):
        raise InputError("--weights: the CPU engine's choice; vLLM runs its own weights")
    text = READ_TEXT
    if args.text:
        too_long = InputError(f"--text {args.text}: more than {MAX_TEXT_CHARS} characters")
        data = read_input_bytes(args.text, 4 * MAX_TEXT_CHARS)  # UTF-8: at most 4 bytes a character
        if data is None:
            raise too_long
        text = decode_text(data, f"--text {args.text}")
        if len(text) > MAX_TEXT_CHARS:
            raise too_long
    require_speakable(text, f"--text {args.text}" if args.text else "the text")
    return weights, text.strip()


def main(argv: list[str] | None = None) -> int:
    return lab_cli.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
