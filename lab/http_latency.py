"""Device probe: time from an HTTP speech request to its first audio byte, with N clients streaming at once.

  python lab/http_latency.py URL [--clients N] [--rounds R] [--format pcm] [--text TEXT] [--key KEY]
  -> one JSON object: first-byte and whole-response latency (p50, p95, max, in ms) over clients x rounds requests

URL is the API's base (http://127.0.0.1:8000/v1, as `voicectl serve --http 127.0.0.1:8000` logs it). Each client
opens its own connection per request and writes a plain HTTP/1.1 POST /audio/speech; the clock runs from just
before the request is written to the first byte of audio in the (chunked) body, then on to the body's end. Every
client waits for all to be connected before its first request, so N requests really start together; one request
runs before them all, untimed. Standard library only: runs wherever the server's Python runs.

For the GPU numbers: `voicectl serve --backend auto --http 127.0.0.1:8000` (wait for "tuning: done" in
`voicectl status` when the crowd's engine matters), then this at --clients 1 and --clients 32.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from urllib.parse import urlsplit

TEXT = "The quick brown fox jumps over the lazy dog. It was not the first time, and it would not be the last."


def request_bytes(url: str, body: bytes, key: str | None) -> bytes:
    parts = urlsplit(url)
    head = [f"POST {parts.path.rstrip('/')}/audio/speech HTTP/1.1", f"Host: {parts.netloc}",
            "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"]
    if key:
        head.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def one_request(url: str, payload: bytes) -> dict:
    """One request: status, ms to the first audio byte and to the end, audio bytes."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        t0 = time.perf_counter()
        writer.write(payload)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            chunked |= line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
        if status != 200 or not chunked:
            return {"status": status, "error": (await reader.read())[:300].decode(errors="replace")}
        first, size = None, 0
        while (n := int((await reader.readline()).split(b";")[0], 16)) > 0:
            await reader.readexactly(n + 2)
            if first is None:
                first = time.perf_counter()
            size += n
        end = time.perf_counter()
        return {"status": status, "first_byte_ms": (first - t0) * 1e3, "total_ms": (end - t0) * 1e3, "bytes": size}
    finally:
        writer.close()


def summary(values: list[float]) -> dict:
    if not values:
        return {}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, round(q * (len(s) - 1)))]  # noqa: E731 - nearest rank
    return {"p50": round(pick(0.5), 2), "p95": round(pick(0.95), 2), "max": round(s[-1], 2), "n": len(s)}


async def run(args: argparse.Namespace) -> dict:
    body = json.dumps({"model": "tts-1", "input": args.text, "voice": args.voice,
                       "response_format": args.format}).encode()
    payload = request_bytes(args.url, body, args.key)
    warm = await one_request(args.url, payload)
    start = asyncio.Barrier(args.clients) if hasattr(asyncio, "Barrier") else None  # Python 3.11+

    async def client() -> list[dict]:
        results = []
        for _ in range(args.rounds):
            if args.seconds is not None and time.perf_counter() - t0 > args.seconds:
                break
            if args.stop_file and os.path.exists(args.stop_file):
                break
            if start is not None and args.seconds is None:
                await start.wait()
            results.append({**await one_request(args.url, payload), "at_s": round(time.perf_counter() - t0, 3)})
        return results

    t0 = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(client() for _ in range(args.clients))) for r in rs]
    ok = [r for r in results if r["status"] == 200]
    return {"url": args.url, "clients": args.clients, "rounds": args.rounds, "format": args.format,
            "voice": args.voice, "text_chars": len(args.text), "wall_s": round(time.perf_counter() - t0, 3),
            "warm_up": warm, "first_byte_ms": summary([r["first_byte_ms"] for r in ok]),
            "total_ms": summary([r["total_ms"] for r in ok]),
            "errors": [r for r in results if r["status"] != 200][:5], "failed": len(results) - len(ok),
            "series": [[r["at_s"], round(r["first_byte_ms"], 1)] for r in ok]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="the API's base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--clients", type=int, default=1, help="requests at once (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="requests per client, one after another (default 5)")
    p.add_argument("--seconds", type=float, help="stop sending after this long (each client's rounds are then at most "
                   "--rounds; e.g. for as long as a server tunes)")
    p.add_argument("--stop-file", help="stop sending once this file exists (e.g. made when the server is tuned)")
    p.add_argument("--format", default="pcm", help="response_format (default pcm)")
    p.add_argument("--voice", default="alloy")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--key", help="API key (a server on loopback needs none)")
    print(json.dumps(asyncio.run(run(p.parse_args()))))


if __name__ == "__main__":
    main()
