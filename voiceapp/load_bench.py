"""Drives `voicectl bench --load`: sends each rate's planned requests (engine.bench.load `schedule`) on time,
whether or not earlier ones have ended, and records every stream's timeline for engine.bench.load to judge.

Two targets: an engine in this process (`Synthesizer.synthesize`, its chunks timed as they are yielded), or a
running `voicectl serve --http` (`HttpTarget`: one connection per request over asyncio streams, the `pcm` response
read as it streams; each piece of body timed as it arrives). Standard library and the engine only.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import time
import urllib.parse
from typing import Any, Callable, Coroutine, Sequence

from engine.bench.load import PREROLL_S, Arrival, RateResult, StreamLog, summarize_rate
from engine.errors import InputError
from engine.pauses import GcPauses, HeldInterpreter, LoopLag

PCM_RATE = 24000
"""The rate asked of the HTTP API for its `pcm` responses (16-bit mono), so bytes convert to seconds."""
CONNECT_TIMEOUT_S = 10.0
"""How long a request's connection and response head may take before it counts as failed."""

Target = Callable[[Arrival, StreamLog], Coroutine[Any, Any, None]]
"""Sends one request and fills in its log (chunks, end, refused, error); raises nothing."""


async def drive(target: Target, arrivals: Sequence[Arrival], clock: Callable[[], float] = time.perf_counter
                ) -> list[StreamLog]:
    """Send every arrival at its time (open loop), then wait for all of them to end."""
    t0 = clock()
    tasks: list[asyncio.Task[None]] = []
    logs: list[StreamLog] = []
    for arrival in arrivals:
        wait = t0 + arrival.t - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        log = StreamLog(clock())
        logs.append(log)
        tasks.append(asyncio.create_task(target(arrival, log)))
    await asyncio.gather(*tasks)
    return logs


class Pauses:
    """This process's long pauses while it is on, each of at least `least_ms`: runs of the cyclic garbage collector,
    its event loop late to wake a sleeping task, the interpreter held by another thread (engine.pauses). Entered on
    the event loop it watches."""

    def __init__(self, least_ms: float = 20.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock, self.t0 = clock, 0.0
        """`t0`: when it was entered."""
        self.gc = GcPauses(least_ms, clock)
        self.loop = LoopLag(least_ms, clock)
        self.held = HeldInterpreter(least_ms, clock)

    def __enter__(self) -> "Pauses":
        self.t0 = self.clock()
        self.gc.start()
        self.loop.start()
        self.held.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.held.stop()
        self.loop.stop()
        self.gc.stop()

    def since(self, t0: float) -> list[tuple[float, str, float]]:
        """(s since `t0`, on the clock's scale; "gc0".."gc2", "loop" or "held"; ms), in time order."""
        runs = [(at, f"gc{gen}", ms) for at, gen, ms in self.gc.recent]
        late = [(at, "loop", ms) for at, ms in self.loop.recent]
        held = [(at, "held", ms) for at, ms in self.held.recent]
        return [(round(at - t0, 4), kind, round(ms, 1)) for at, kind, ms in sorted(runs + late + held)]


async def run_rates(target: Target, sample_rate: int, plans: Sequence[tuple[float, float, list[Arrival]]],
                    log: Callable[[str], None] = print, preroll_s: float = PREROLL_S,
                    slow_calls: Callable[[], Sequence[tuple[float, float, int, tuple[int, ...]]]] | None = None
                    ) -> list[RateResult]:
    """Each (rate, seconds, arrivals) in turn, the engine idle again between them. `slow_calls`: an engine in this
    process, its slow decoder calls (engine.batching BatchStats.slow), listed among the rate's pauses as
    "decode BxL"."""
    results = []
    for rate, seconds, arrivals in plans:
        with Pauses() as pauses:
            logs = await drive(target, arrivals)
        result = summarize_rate(rate, seconds, logs, sample_rate, preroll_s)
        first = min((g.start for g in logs), default=pauses.t0)
        found = pauses.since(first)
        end = max((g.end for g in logs if not math.isnan(g.end)), default=first)
        calls = [(round(at - first, 4), f"decode {n}x{'/'.join(map(str, lengths))}", round(took * 1e3, 1))
                 for at, took, n, lengths in (slow_calls() if slow_calls else ()) if first <= at <= end]
        result.pauses = sorted(found + calls)
        log(f"  {rate:g} req/s: {result.streams} sent, {result.served} served, {result.refused} refused, first audio "
            f"p50 {result.first_ms_p50:.0f} ms p95 {result.first_ms_p95:.0f} ms, underran "
            f"{result.underran_share:.0%}, peak {result.peak_concurrency} in flight")
        for reason, count in result.refusal_reasons.items():
            log(f"    refused {count}: {reason}")
        if result.pauses:
            at, kind, ms = max(result.pauses, key=lambda p: p[2])
            log(f"    {len(result.pauses)} pauses of this process, the longest {ms:.0f} ms ({kind}) at {at:.2f} s")
        results.append(result)
    return results


def engine_target(synth: Any, voice: str, clock: Callable[[], float] = time.perf_counter) -> Target:
    """Requests to an engine in this process."""
    from engine.config import SamplingOptions, SynthesisRequest

    count = 0

    async def send(arrival: Arrival, log: StreamLog) -> None:
        nonlocal count
        count += 1
        req = SynthesisRequest(arrival.text, voice=voice, options=SamplingOptions(), request_id=f"load-{count}")
        try:
            async for chunk in synth.synthesize(req):
                log.chunks.append((clock(), len(chunk.samples)))
        except Exception as err:  # noqa: BLE001 - a failed request is a result, not the end of the benchmark
            log.error = f"{type(err).__name__}: {err}"
        log.end = clock()
    return send


class HttpTarget:
    """Requests to `voicectl serve --http` at `url` (http://HOST:PORT, with or without /v1)."""

    def __init__(self, url: str, api_key: str | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise InputError(f"--http {url}: expected http://HOST:PORT (the address `voicectl serve --http` prints)")
        try:
            self.port = parts.port or 80
        except ValueError:
            raise InputError(f"--http {url}: the port is not a number from 0 to 65535") from None
        self.host = parts.hostname
        self.path = parts.path.rstrip("/").removesuffix("/v1") + "/v1/audio/speech"
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self.api_key = api_key if api_key is not None else os.environ.get("VOICEAPP_API_KEY") or None
        self.clock = clock

    async def __call__(self, arrival: Arrival, log: StreamLog) -> None:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), CONNECT_TIMEOUT_S)
            writer.write(self.request(arrival.text))
            status, headers = await asyncio.wait_for(read_head(reader), CONNECT_TIMEOUT_S)
            if status == 429:
                log.refused = True
                log.retry_after_s = retry_after(headers.get("retry-after"))
                log.refusal = error_message(await asyncio.wait_for(reader.read(4096), CONNECT_TIMEOUT_S))
            elif status != 200:
                body = await reader.read(4096)
                log.error = f"HTTP {status}: {error_message(body)}"
            else:
                await self._read_audio(reader, headers, log)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
            log.error = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        finally:
            log.end = self.clock()
            if writer is not None:
                writer.close()

    def request(self, text: str) -> bytes:
        body = json.dumps({"model": "tts-1", "input": text, "response_format": "pcm",
                           "sample_rate": PCM_RATE}).encode()
        head = [f"POST {self.path} HTTP/1.1", f"Host: {self.host_header}", "Content-Type: application/json",
                f"Content-Length: {len(body)}", "Connection: close"]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    async def _read_audio(self, reader: asyncio.StreamReader, headers: dict[str, str], log: StreamLog) -> None:
        """The body's bytes as 16-bit samples, each piece timed as it arrives (an odd byte waits for the next)."""
        held = 0
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        async for data in (dechunk(reader) if chunked else plain(reader)):
            held += len(data)
            if held >= 2:
                log.chunks.append((self.clock(), held // 2))
                held %= 2


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """A response's status and headers (names lower-cased)."""
    status_line = (await reader.readuntil(b"\r\n")).decode("latin-1").split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise ValueError(f"not an HTTP response: {' '.join(status_line)[:80]!r}")
    headers = {}
    while (line := (await reader.readuntil(b"\r\n")).decode("latin-1").strip()):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line[1]), headers


async def dechunk(reader: asyncio.StreamReader):
    """A chunked body's pieces as they arrive."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)


async def plain(reader: asyncio.StreamReader):
    """A body without chunks: what arrives until the connection closes."""
    while data := await reader.read(65536):
        yield data


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (its delay form; an HTTP date or anything else: None)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def error_message(body: bytes) -> str:
    """An OpenAI-style error body's message, or the body's start."""
    try:
        return str(json.loads(body)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")
