"""Provides `voicectl status`: is a `voicectl serve` running, and what is it doing."""
from __future__ import annotations

import argparse
import asyncio
import json

from voiceapp.common import add_socket_arg


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="show the running engine server (exit status 1 if none)")
    add_socket_arg(p)
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from voiceapp.server.client import lock_holder, server_status, socket_path

    path = socket_path(args.socket)
    status = asyncio.run(server_status(path))
    if status is None:
        holder = lock_holder(path)
        if holder is None:
            print(json.dumps(None) if args.json else f"no server running (socket {path})")
        else:  # loading its engine, or its socket file was deleted: either way `serve` there would be refused
            print(json.dumps({"pid": holder, "listening": False}) if args.json else
                  f"a server (pid {holder}) holds {path} but is not answering there: still loading its engine, or "
                  f"its socket was deleted (voicectl stop ends it)")
        return 1
    print(json.dumps(status) if args.json else "\n".join(describe(status)))
    return 0


def describe_device(device: dict) -> str:
    """One device the engine computes on: its memory where it is a GPU."""
    if "total_bytes" not in device:
        return f"device: {device['device']}"
    return (f"GPU memory: {device['used_bytes'] / 2**30:.1f} of {device['total_bytes'] / 2**30:.1f} GiB used "
            f"({device['device']}, {device['name']}; {device['allocated_bytes'] / 2**30:.2f} GiB allocated by the "
            f"engine)")


def describe_replicas(replicas: list[dict]) -> list[str]:
    """Engine replicas on a Ray cluster (voiceapp.cluster.serve): one line each, with its devices."""
    lines = [f"replicas: {len(replicas)} on Ray"]
    for r in replicas:
        devices = ", ".join(d["device"] for d in r.get("devices", [])) or "?"
        lines.append(f"  replica {r['replica']}: {r['live']} live of {r['capacity']}, on {devices}")
    return lines


def describe(status: dict) -> list[str]:
    from voiceapp.server.autostart import idle_text

    model = status.get("model")
    idle = status.get("idle_timeout_s")
    started = "started by say or the TUI" if status.get("auto_started") else "started by voicectl serve"
    lines = [f"server: pid {status['pid']} (voiceapp {status.get('version', '?')}), up "
             f"{_duration(status['uptime_s'])}, socket {status['socket']}",
             f"{started}; idle timeout: {idle_text(idle) if idle else 'none (runs until voicectl stop)'}",
             f"model: {model['path']} (hash {model['hash']})" if model else "model: none (fake backend)",
             f"backend: {status['backend']}, {status['sample_rate']} Hz"]
    lines += [describe_device(device) for device in status.get("devices", [])]
    if status.get("replicas") is not None:
        lines += describe_replicas(status["replicas"])
    lane = status.get("lane")
    if lane:
        state = "failed, off" if lane["failed"] else "on" if lane["on"] else "off"
        if lane.get("fused") and not lane["failed"]:
            state += " (fused decode kernels)"
        lines.append(f"graph lane: {state}; {lane['streams']} streams started there, {lane['handed_over']} moved "
                     f"to {status['backend']} when other streams arrived")
    if status.get("tuning"):
        lines.append(describe_tuning(status["tuning"]))
    lines.append(f"requests: {len(status['streams'])} live, {status['served']} served, {status['cancelled']} "
                 f"cancelled, {status['failed']} failed; {status['clients']} clients connected"
                 + (f"; {status['queued']} queued until the engine has room" if status.get("queued") else ""))
    if status.get("http"):
        lines.append(describe_http(status["http"]))
    for s in status["streams"]:
        ttfa = "-" if s["ttfa_ms"] is None else f"{s['ttfa_ms']:.0f} ms"
        who = s.get("client") or f"pid {s['client_pid']}"
        lines.append(f"  {who}: voice {s['voice']}, {s['chars']} chars, {s['audio_s']:.1f} s audio in "
                     f"{s['age_s']:.1f} s, TTFA {ttfa}")
    return lines


def describe_http(http: dict) -> str:
    """One line: where the HTTP API listens and what became of its requests."""
    key = "API key required" if http["api_key"] else "no API key"
    return (f"HTTP API: {http['url']} ({key}; {', '.join(http['formats'])}); {http['live']} live of at most "
            f"{http['max_streams']}, {http['served']} served, {http['cancelled']} cancelled, {http['failed']} "
            f"failed, {http['rejected']} rejected, {http['busy']} turned away busy"
            + (f"; connections at the cap ({http['max_connections']}): {http['evicted_connections']} idle ones "
               f"replaced, {http['refused_connections']} refused" if "max_connections" in http else "")
            + (f"; carries about {http['capacity_streams']:g} streams in real time"
               if http.get("capacity_streams") is not None else ""))


def describe_tuning(tuning: dict) -> str:
    """One line: what the server builds in the background, each step's state and time, and its longest piece of
    work (what a request arriving mid-piece waited for)."""
    def step(s: dict) -> str:
        took = "" if s["seconds"] is None else f" {s['seconds']:.0f} s"
        why = f" ({s['detail']})" if s["detail"] else ""  # why it failed or was skipped, or what it did
        return f"{s['name']} {s['state']}{took}{why}"

    head = "done" if tuning["done"] else "in progress"
    took = "" if tuning["seconds"] is None else f" after {tuning['seconds']:.0f} s"
    yielded = tuning.get("yielded_s") or 0
    longest = (tuning.get("pieces") or {}).get("longest_ms") or []
    return (f"tuning: {head}{took}" + (f" ({', '.join(step(s) for s in tuning['steps'])})" if tuning["steps"] else "")
            + (f"; waited {yielded:.1f} s for live streams" if yielded else "")
            + (f"; longest piece {longest[0][0]:.0f} ms ({longest[0][1]})" if longest else ""))


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"
