"""The load benchmark against an engine of known capacity: the fake engine with its tokens taking turns
(ScriptedGenerator serial), fast enough for CAPACITY streams in real time. Below that load its listeners hear no
gap; well above it most of them do, and first audio waits."""
import asyncio

import pytest

from engine.bench.load import SENTENCES, Arrival, schedule, summarize_rate
from engine.factory import EngineConfig, build_synthesizer
from engine.fakes import ScriptedGenerator, fixed_throughput
from voiceapp.load_bench import drive, engine_target

CAPACITY = 4
"""Streams the engine keeps up with in real time."""
HOST_SHARE = 0.85
"""The fake's tokens are sleeps, but the pipeline's own work per token adds to them: alone and warm the engine runs
a little under CAPACITY times real time. Where it runs under this share of it, the host is too slow for the engine to
be the one of known capacity the test judges (a shared host under load has made it so); the test says so as a skip
naming the speed."""


def fake_engine(capacity: int):
    synth = build_synthesizer(EngineConfig(backend="fake"))
    tokens_per_s = synth.sample_rate / synth.decoder.samples_per_code * synth.grammar.tokens_per_code
    synth.swap_generator(fixed_throughput(synth.grammar.token_ids, tokens_per_s, capacity))
    return synth


@pytest.mark.serial
def test_the_load_bench_finds_the_fake_engines_capacity():
    async def main():
        synth = fake_engine(CAPACITY)
        target = engine_target(synth, synth.voices.default)
        try:
            await drive(target, [Arrival(0.0, SENTENCES[2])])  # warm
            one = (await drive(target, [Arrival(0.0, SENTENCES[2])]))[0]
            audio_s = sum(n for _, n in one.chunks) / synth.sample_rate
            busy = one.end - one.start
            assert busy < audio_s, (busy, audio_s)  # alone, faster than real time (by CAPACITY when idle)
            if audio_s / busy < HOST_SHARE * CAPACITY:
                return audio_s / busy, None
            capacity_rate = CAPACITY / audio_s  # requests a second whose audio the engine makes in real time
            results = []
            for share, seconds in ((0.3, 3.0), (2.0, 2.0)):
                rate = share * capacity_rate
                logs = await drive(target, schedule(rate, seconds, seed=7))
                results.append(summarize_rate(rate, seconds, logs, synth.sample_rate))
            return audio_s / busy, results
        finally:
            await synth.close()

    speed, results = asyncio.run(main())
    if results is None:
        pytest.skip(f"alone and warm the fake engine ran at {speed:.2f}x real time on this host, under "
                    f"{HOST_SHARE:g} of its capacity of {CAPACITY}: the host is too slow to judge the capacity")
    below, above = results
    assert below.served == below.streams >= 3 and above.served == above.streams > below.streams, (below, above)
    assert below.underran_share == 0, below
    assert above.underran_share > 0.5, above
    assert above.underrun_s > 1.0
    assert above.first_ms_p95 > 2 * below.first_ms_p95
    assert above.peak_concurrency > CAPACITY


@pytest.mark.parametrize("streams", [1, 4])
def test_the_serial_fake_shares_one_throughput(streams):
    """k streams at once each get 1/k of the tokens a second: the capacity the test above relies on."""
    from engine.config import SamplingOptions
    from engine.prompt import Prompt

    async def main():
        synth = build_synthesizer(EngineConfig(backend="fake"))
        gen = ScriptedGenerator(synth.grammar.token_ids, tokens_per_sentence=40, delay_s=0.005, serial=True)
        loop = asyncio.get_running_loop()

        async def one(i):
            t = loop.time()
            async for _ in gen.stream(Prompt(ids=(i,)), SamplingOptions(seed=i), f"r{i}"):
                pass
            return loop.time() - t

        took = await asyncio.gather(*(one(i) for i in range(streams)))
        await synth.close()
        return max(took)

    took = asyncio.run(main())
    assert took == pytest.approx(41 * 0.005 * streams, rel=0.35)


def test_pauses_records_the_collector_a_held_loop_a_held_interpreter_and_nothing_while_idle():
    import gc
    import random
    import time

    from voiceapp.load_bench import Pauses

    async def main():
        with Pauses(least_ms=0.0) as pauses:
            gc.collect()
            await asyncio.sleep(0.02)
        with Pauses(least_ms=40.0) as blocked:
            await asyncio.sleep(0.02)
            time.sleep(0.1)  # a blocking call on the loop
            await asyncio.sleep(0.02)
        rng = random.Random(0)
        numbers = [rng.random() for _ in range(10**6)]
        with Pauses(least_ms=40.0) as held:
            await asyncio.sleep(0.02)
            sorted(numbers)  # C code that keeps the interpreter the whole time
            await asyncio.sleep(0.02)
        with Pauses(least_ms=40.0) as quiet:
            await asyncio.sleep(0.1)
        return pauses, blocked, held, quiet

    pauses, blocked, held, quiet = asyncio.run(main())
    assert "gc2" in {kind for _, kind, _ in pauses.since(pauses.t0)}
    assert "loop" in {kind for _, kind, _ in blocked.since(blocked.t0)}
    assert "held" in {kind for _, kind, _ in held.since(held.t0)}
    assert quiet.since(quiet.t0) == []  # an idle loop and a sleeping thread hold nothing


def test_run_rates_reports_each_rates_pauses_from_its_first_request():
    """The engine's slow decoder calls made while a rate ran are among its pauses, timed from its first request;
    one from before it is not."""
    import time

    from voiceapp.load_bench import run_rates

    calls: list[tuple[float, float, int, tuple[int, ...]]] = [(time.perf_counter() - 60.0, 0.5, 1, (20,))]

    async def main():
        synth = fake_engine(CAPACITY)
        target = engine_target(synth, synth.voices.default)

        async def send(arrival, log):
            await target(arrival, log)
            calls.append((log.start + 0.01, 0.08, 3, (20, 32)))  # as a decoder call of the request would be

        try:
            return await run_rates(send, synth.sample_rate, [(2.0, 0.5, [Arrival(0.0, SENTENCES[0])])],
                                   log=lines.append, slow_calls=lambda: calls)
        finally:
            await synth.close()

    lines: list[str] = []
    (result,) = asyncio.run(main())
    decodes = [p for p in result.pauses if p[1].startswith("decode")]
    assert result.served == 1 and decodes == [(0.01, "decode 3x20/32", 80.0)]
    assert any("pauses of this process" in line for line in lines)
