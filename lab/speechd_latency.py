"""Where the time from a speech-dispatcher message to its first sound goes, through voiceapp's speechd module and a
warm engine server, heard at a private PulseAudio null sink's monitor (docs/integrations.md's table).

Each run, in turns:
- `engine`: the warm server's own first audio: a client's request sent to its first audio frame read
  (RemoteSynthesizer, as the module connects).
- `module`: the module's Speaker in this process, fed speechd's SPEAK as the protocol brings it; from the SPEAK's
  closing "." to: the server's first audio frame read (`first_audio`), the first write to the player (`queued`),
  the player's own prediction of when it reaches the speakers (`onset`, PortAudio's DAC time) and the first
  non-zero sample in the capture (`sound`); then the player's `underruns` (its ring ran dry mid-utterance) and
  `device_underruns` (PortAudio's output-underflow flags), counted from the SPEAK to the END.
- `spd_say`: `spd-say TEXT` launched against a real speech-dispatcher whose default module is ours, to its first
  non-zero sample in the capture.
The capture's own latency (parec, 5 ms fragments) is in `sound` and `spd_say` alike.

    python lab/speechd_latency.py --backend fake --runs 9          # the client's side: an engine of a GPU's speed
    python lab/speechd_latency.py --backend torch --runs 9         # the tiny checkpoint on this CPU
    python lab/speechd_latency.py --backend torch --model DIR      # a checkpoint of your own (lab/gpu_speechd.sh)

Starts (and stops) its own PulseAudio, speech-dispatcher and engine server in a temporary folder; prints JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

class Capture:
    """parec of the sink's monitor into a file, float32 at the sink's rate."""

    def __init__(self, path: Path, sink: str, rate: int) -> None:
        self.path, self.rate = path, rate
        self.proc = subprocess.Popen(["parec", "-d", f"{sink}.monitor", "--raw", "--format=float32le",
                                      f"--rate={rate}", "--channels=1", "--latency-msec=5", str(path)])
        time.sleep(0.4)

    def frames(self) -> int:
        return self.path.stat().st_size // 4 if self.path.exists() else 0

    def first_sound_ms(self, start: int, timeout_s: float = 10.0) -> float:
        """Milliseconds from frame `start` to the first non-zero sample after it (the file read from there on)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            heard = np.flatnonzero(np.fromfile(self.path, np.float32, offset=4 * start))
            if len(heard):
                return float(heard[0]) * 1000 / self.rate
            time.sleep(0.01)
        raise SystemExit("no sound")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class Hooks:
    """Times the module's steps through class-level wrappers (whatever the module's structure)."""

    def __init__(self) -> None:
        from engine.backends.sounddevice_sink import Player
        from voiceapp.server.client import RemoteSynthesizer

        self.first_audio: float | None = None
        self.queued: float | None = None
        self.player = None
        self.last_player = None
        hooks = self
        synthesize, write = RemoteSynthesizer.synthesize, Player.write

        async def timed_synthesize(remote, req, text_stream=None):
            async for chunk in synthesize(remote, req, text_stream):
                if hooks.first_audio is None and not chunk.pause:
                    hooks.first_audio = time.perf_counter()
                yield chunk

        async def timed_write(player, samples):
            if hooks.queued is None and len(samples):
                hooks.queued, hooks.player = time.perf_counter(), player
            await write(player, samples)

        RemoteSynthesizer.synthesize, Player.write = timed_synthesize, timed_write

    def reset(self) -> None:
        self.first_audio = self.queued = self.player = None


def ms(t: float | None, t0: float) -> float | None:
    return None if t is None else round((t - t0) * 1000, 1)


async def engine_first_audio_ms(socket: Path, text: str, voice: str, max_tokens: int) -> float:
    from engine.config import SamplingOptions, SynthesisRequest
    from voiceapp.server.client import RemoteSynthesizer

    remote = await RemoteSynthesizer.connect(socket)
    assert remote is not None, "no warm server"
    try:
        t0 = time.perf_counter()
        async for chunk in remote.synthesize(SynthesisRequest(text, voice=voice, options=SamplingOptions(
                seed=0, max_tokens=max_tokens))):
            if not chunk.pause:
                return (time.perf_counter() - t0) * 1000
        raise SystemExit("no audio from the server")
    finally:
        await remote.close()


def module_run(protocol, out: io.StringIO, hooks: Hooks, cap: Capture, text: str, timeout_s: float = 10.0) -> dict:
    """One SPEAK fed to the in-process module; its steps' milliseconds from the SPEAK's closing line, the pre-roll
    the player started with and the lead the pacer had measured before (engine.pacing, where the module has them)."""
    hooks.reset()
    pacer = (getattr(protocol.speaker, "_pacer", None) or (None, None))[1]
    lead = getattr(pacer, "lead_s", None)
    before = (hooks.last_player.output_underflows, hooks.last_player.underruns) if hooks.last_player else (0, 0)
    for line in ("SPEAK", text):
        protocol.feed(line)
    start = cap.frames()
    t0 = time.perf_counter()
    protocol.feed(".")
    sound = cap.first_sound_ms(start, timeout_s)
    deadline = time.monotonic() + 30
    while "702 END" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    player = hooks.player
    onset = player.last_onset_perf if player is not None else None
    if onset is None and player is not None:
        onset = player.onset_perf(1)
    if player is not None and player is not hooks.last_player:
        before, hooks.last_player = (0, 0), player
    preroll = getattr(player, "_preroll_frames", None)
    result = {"lead": None if lead is None else round(lead * 1000, 1),
              "preroll": None if preroll is None else round(preroll * 1000 / player.device_rate, 1),
              "first_audio": ms(hooks.first_audio, t0), "queued": ms(hooks.queued, t0), "onset": ms(onset, t0),
              "sound": round(sound, 1),
              "device_underruns": None if player is None else player.output_underflows - before[0],
              "underruns": None if player is None else player.underruns - before[1]}
    out.seek(0)
    out.truncate()
    return result


def spd_say_ms(env: dict, cap: Capture, text: str) -> float:
    start = cap.frames()
    subprocess.run(["spd-say", "-l", "en", text], env=env, check=True, timeout=60)
    sound = cap.first_sound_ms(start)
    subprocess.run(["spd-say", "-w", "-l", "en", "-C"], env=env, timeout=60)
    return sound


def median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 1) if values else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["fake", "torch"], default="fake")
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--text", default="Hello there.")
    p.add_argument("--no-spd", action="store_true", help="skip the spd-say runs")
    p.add_argument("--latency", help="the module's --latency (default: its own)")
    p.add_argument("--model", help="a checkpoint for --backend torch (default: a tiny synthetic one)")
    p.add_argument("--voice", default="ava", help="the voice asked for (an Orpheus model's: tara)")
    p.add_argument("--rate", type=int, default=16000, help="the null sink's rate: the engine's (Orpheus: 24000)")
    p.add_argument("--max-tokens", type=int, default=40, help="a message's LLM tokens (random weights never stop)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sdl."))
    for d in ("config", "home", "run", "engine", "data", "cache", "pa"):
        (root / d).mkdir(mode=0o700)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.audio.conftest import start_pulse

    sink = f"tts{args.rate // 1000}"
    pulse = start_pulse({sink: args.rate})
    os.environ.update(pulse.env)
    socket = root / "engine" / "engine.sock"
    env = {k: v for k, v in os.environ.items() if k not in ("VOICEAPP_NO_SERVER", "LANGUAGE", "LC_ALL")}
    env.update(pulse.env)
    env.update(XDG_CONFIG_HOME=str(root / "config"), HOME=str(root / "home"), XDG_RUNTIME_DIR=str(root / "run"),
               XDG_DATA_HOME=str(root / "data"), XDG_CACHE_HOME=str(root / "cache"), LANG="C.UTF-8",
               VOICEAPP_SOCKET=str(socket), VOICEAPP_IDLE_TIMEOUT="600")
    os.environ.update(env)
    engine_args = ["--backend", args.backend]
    if args.backend == "torch":
        from engine.synthetic import write_checkpoint

        model = args.model
        if model is None:
            model = root / "tiny"
            write_checkpoint(model, size="tiny", seed=0)
        engine_args = ["--model", str(model), "--backend", "torch", "--max-tokens", str(args.max_tokens)]
    if args.latency:
        engine_args += ["--latency", args.latency]
    speechd = cap = None
    try:
        from voiceapp.speechd.module import ModuleConfig, ModuleProtocol, Output, Speaker

        out = io.StringIO()
        output = Output(out)
        speaker = Speaker(ModuleConfig(args=[*engine_args, "--socket", str(socket)]), output, lambda line: None)
        protocol = ModuleProtocol(output, speaker)
        hooks = Hooks()
        protocol.feed("INIT")
        cap = Capture(root / "cap.f32", sink, args.rate)
        module_run(protocol, out, hooks, cap, "Warm up.", timeout_s=600)  # starts the server
        if not args.no_spd:
            subprocess.run([sys.executable, "-m", "voiceapp.cli", "speechd", "install", "--default", "--voice", args.voice,
                            *engine_args], env=env, check=True, capture_output=True)
            speechd = subprocess.Popen(["speech-dispatcher", "--run-single", "--timeout", "0"], env=env,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while not (root / "run" / "speech-dispatcher" / "speechd.sock").exists():
                assert time.monotonic() < deadline, "speech-dispatcher did not start"
                time.sleep(0.05)
            subprocess.run(["spd-say", "-w", "-l", "en", "Warm up."], env=env, check=True, timeout=120)
        rows = []
        for _ in range(args.runs):
            row = {"engine": round(asyncio.run(engine_first_audio_ms(socket, args.text, args.voice, args.max_tokens)), 1)}
            time.sleep(0.2)
            row.update(module_run(protocol, out, hooks, cap, args.text))
            time.sleep(0.2)
            if not args.no_spd:
                row["spd_say"] = round(spd_say_ms(env, cap, args.text), 1)
                time.sleep(0.2)
            rows.append(row)
        protocol.feed("QUIT")
        keys = ["engine", "first_audio", "queued", "onset", "sound", "spd_say"]
        summary = {k: median_of(rows, k) for k in keys}
        summary["sound_beyond_engine"] = round(statistics.median(r["sound"] - r["engine"] for r in rows), 1)
        if not args.no_spd:
            summary["spd_say_beyond_engine"] = round(statistics.median(r["spd_say"] - r["engine"] for r in rows), 1)
        print(json.dumps({"backend": args.backend, "load": os.getloadavg()[0], "median_ms": summary, "runs": rows}))
    finally:
        if cap is not None:
            cap.close()
        if speechd is not None:
            speechd.terminate()
            speechd.wait(5)
        subprocess.run([sys.executable, "-m", "voiceapp.cli", "stop", "--socket", str(socket)], env=env,
                       capture_output=True, timeout=30)
        pulse.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
