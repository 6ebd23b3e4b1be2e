"""Time to first audio of `voicectl say`: through a warm `voicectl serve` vs the engine in-process.

    python lab/say_ttfa.py --backend fake
    python lab/say_ttfa.py --backend torch --tiny          # a tiny random checkpoint, written to a temp dir
    python lab/say_ttfa.py --backend auto --model DIR      # a real checkpoint (on a GPU: vLLM)

Each `voicectl say --out --json` run is a fresh process, as a user's is. Reported per mode (medians of --runs
runs, after one untimed run): the request's TTFA (from the request's start, i.e. after the engine is ready) and
the TTFA from launch (from the process's start: what a user waits for, model loading included in-process), and
the process's wall time. Everything is written under one temp dir, removed at the end; the server is stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="fake")
    p.add_argument("--model", help="checkpoint directory")
    p.add_argument("--tiny", action="store_true", help="write and use a tiny random-weight checkpoint")
    p.add_argument("--threads", type=int, help="CPU threads for torch (server and in-process alike)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--inproc-runs", type=int,
                   help="in-process runs (default --runs); on a GPU each one builds the engine (minutes), so "
                        "fewer, and they follow the server runs, whose first run already warmed the caches")
    p.add_argument("--text", default="Hello there, this is a quick test of the first audio.")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args()

    root = tempfile.mkdtemp(prefix="say-ttfa-")
    server = None
    try:
        engine = ["--backend", args.backend]
        if args.tiny:
            from engine.synthetic import write_checkpoint

            write_checkpoint(os.path.join(root, "tiny"), size="tiny", seed=0)
            engine += ["--model", os.path.join(root, "tiny")]
        elif args.model:
            engine += ["--model", args.model]
        if args.threads:
            engine += ["--threads", str(args.threads)]
        env = {**os.environ, "VOICEAPP_SOCKET": os.path.join(root, "s", "engine.sock"),
               "XDG_CACHE_HOME": os.path.join(root, "cache")}
        say = [sys.executable, "-m", "voiceapp.cli", "say", args.text, "--seed", "1", "--json",
               "--out", os.path.join(root, "out.wav"), *engine]

        results = {}
        if args.inproc_runs is None:  # the in-process runs first, each after one untimed run (as before)
            results["in-process"] = measure(say + ["--no-server"], env, args.runs)
        t = time.perf_counter()
        log = os.path.join(root, "serve.log")
        with open(log, "wb") as f:
            server = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "serve", *engine], env=env,
                                      stdout=subprocess.DEVNULL, stderr=f)
        wait_listening(server, log)
        startup = time.perf_counter() - t
        results["server"] = measure(say, env, args.runs, expect_server=server.pid)
        results["server"]["server_startup_s"] = startup
        if args.inproc_runs is not None:
            server.send_signal(signal.SIGTERM)  # its GPU memory goes back before the in-process engine starts
            server.wait(60)
            results["in-process"] = measure(say + ["--no-server"], env, args.inproc_runs, warm=False)
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
        shutil.rmtree(root, ignore_errors=True)

    if args.json:
        print(json.dumps(results))
        return 0
    print(f"voicectl say TTFA, backend {args.backend}{' (tiny checkpoint)' if args.tiny else ''}, "
          f"median of {args.runs} runs")
    print(f"{'mode':<11} {'request TTFA':>13} {'TTFA from launch':>17} {'process wall':>13}")
    for mode, r in results.items():
        print(f"{mode:<11} {r['ttfa_ms']:>10.0f} ms {r['process_ttfa_ms']:>14.0f} ms {r['wall_s']:>11.2f} s")
    print(f"(server start-up, once: {results['server']['server_startup_s']:.1f} s)")
    return 0


def measure(cmd: list[str], env: dict[str, str], runs: int, expect_server: int | None = None,
            warm: bool = True) -> dict:
    rows = []
    for i in range(runs + 1 if warm else runs):
        t = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
        wall = time.perf_counter() - t
        if out.returncode != 0:
            raise SystemExit(f"say failed: {out.stderr.decode().strip()}")
        lines = out.stdout.decode(errors="replace").splitlines()
        if len(lines) != 1:
            raise SystemExit(f"say --json printed {len(lines)} lines on stdout, expected one JSON line: {lines[:5]}")
        m = json.loads(lines[0])
        if m["server_pid"] != expect_server:
            raise SystemExit(f"expected server {expect_server}, got {m['server_pid']}: {out.stderr.decode()}")
        if i or not warm:  # the first run warms the OS file cache and the speaker-globals cache
            rows.append({"ttfa_ms": m["ttfa_ms"], "process_ttfa_ms": m["process_ttfa_ms"], "wall_s": wall})
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    summary["runs_ttfa_ms"] = [round(r["ttfa_ms"], 1) for r in rows]
    return summary


def wait_listening(proc: subprocess.Popen, log: str) -> None:
    while True:
        with open(log, "rb") as f:
            text = f.read()
        if b"listening on" in text:
            return
        if proc.poll() is not None:
            raise SystemExit(f"server did not start: {text.decode()}")
        time.sleep(0.02)

if __name__ == "__main__":
    sys.exit(main())
