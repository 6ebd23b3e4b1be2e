"""Player: real playback through a private PulseAudio null sink, captured from its monitor and compared
sample by sample (tests marked `audio`), plus the callback logic driven by hand with a fake sounddevice."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from time import perf_counter
from types import SimpleNamespace

import numpy as np
import pytest
import soxr

from engine.backends import sounddevice_sink
from engine.backends.sounddevice_sink import Player, list_devices, pick_device_rate
from engine.errors import AudioDeviceError

RATE = 16000


def noise(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    """Seeded noise with no exact zeros (aperiodic: a dropped or repeated block cannot hide)."""
    x = (np.random.default_rng(seed).random(int(seconds * rate), dtype=np.float32) - 0.5) * 0.6
    x[x == 0] = 1e-3
    return x


def verify(cap: np.ndarray, ref: np.ndarray) -> tuple[int, list[tuple[int, int]], list[str]]:
    """Bit-exact comparison (docs/headless-audio-tui.md): onset index, inserted silent runs
    [(ref_index, n_silent)], and errors (a differing sample, capture ends early, audio after the end)."""
    nz = np.flatnonzero(cap)
    assert len(nz), "the capture is all silence"
    onset = int(nz[0] - np.flatnonzero(ref)[0])
    gaps, errors, i, c = [], [], 0, onset
    while i < len(ref):
        seg = cap[c:c + len(ref) - i]
        bad = np.flatnonzero(seg != ref[i:i + len(seg)])
        if not len(bad):
            if len(seg) < len(ref) - i:
                errors.append("capture ends early")
            break
        j = int(bad[0])
        z = np.flatnonzero(cap[c + j:])
        run = int(z[0]) if len(z) else len(cap) - c - j
        if run == 0:
            errors.append(f"sample {i + j} differs")
            break
        gaps.append((i + j, run))
        i, c = i + j, c + j + run
    if np.any(cap[c + len(ref) - i:]):
        errors.append("extra audio after the end")
    return onset, gaps, errors


async def write_irregular(player: Player, x: np.ndarray, rng: np.random.Generator, max_gap_s: float = 0.03,
                          lo: int = 160, hi: int = 4000) -> list[int]:
    """Write `x` in random chunk sizes lo..hi with random pauses below max_gap_s; returns the sizes."""
    sizes, pos = [], 0
    while pos < len(x):
        n = int(rng.integers(lo, hi + 1))
        await player.write(x[pos:pos + n])
        sizes.append(len(x[pos:pos + n]))
        pos += n
        await asyncio.sleep(float(rng.random()) * max_gap_s)
    return sizes


# -- real playback through PulseAudio -----------------------------------------------------------------------


@pytest.mark.audio
async def test_gapless_bit_exact_with_backpressure(record_monitor):
    ref = noise(2.5, seed=1)
    rng = np.random.default_rng(11)
    with record_monitor("tts16") as cap:
        with Player(RATE, latency=0.1, preroll_s=0.2, buffer_s=1.0) as player:
            assert player.device_rate == RATE and player.capacity_frames == RATE
            t0 = perf_counter()
            await write_irregular(player, ref, rng)
            write_s = perf_counter() - t0
            await player.drain()
            underruns, frames = player.underruns, player.underrun_frames
    onset, gaps, errors = verify(cap(), ref)
    assert onset > 0
    assert (gaps, errors) == ([], [])
    assert (underruns, frames) == (0, 0)
    # 2.5 s of audio into a 1 s ring: the writer must have been held back for about 1.3 s
    assert write_s > 1.0, f"no backpressure: all written in {write_s:.2f} s"


@pytest.mark.audio
async def test_producer_stall_is_counted_and_heard_as_silence(record_monitor):
    ref = noise(2.0, seed=2)
    rng = np.random.default_rng(12)
    with record_monitor("tts16") as cap:
        with Player(RATE, buffer_s=1.0) as player:
            await write_irregular(player, ref[:RATE], rng)
            await asyncio.sleep(1.5)  # longer than the whole buffer
            await write_irregular(player, ref[RATE:], rng)
            await player.drain()
            underruns, frames = player.underruns, player.underrun_frames
    _, gaps, errors = verify(cap(), ref)
    assert errors == []
    assert underruns > 0
    assert gaps == [(RATE, frames)], "one silent run, exactly where the producer stalled, as long as counted"
    assert frames > 0.3 * RATE


@pytest.mark.audio
async def test_48k_device_gets_stateful_resampled_audio(record_monitor, monkeypatch):
    monkeypatch.setenv("PULSE_SINK", "tts48")  # the ALSA pulse plugin reads it when the stream opens
    ref = noise(2.0, seed=3)
    rng = np.random.default_rng(13)
    with record_monitor("tts48") as cap:
        with Player(RATE, device_rate=48000) as player:
            assert player.device_rate == 48000 and player.sample_rate == RATE
            sizes = await write_irregular(player, ref, rng)
            await player.drain()
            assert player.underruns == 0
    data = cap()
    # what one stateful stream makes of those same chunks: the player must have sent exactly this
    stream = soxr.ResampleStream(RATE, 48000, 1, dtype="float32", quality="HQ")
    bounds = np.cumsum([0, *sizes])
    expected = np.concatenate([stream.resample_chunk(ref[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
                              + [stream.resample_chunk(np.zeros(0, np.float32), last=True)])
    assert abs(len(expected) - 3 * len(ref)) <= 1
    _, gaps, errors = verify(data, expected)
    assert (gaps, errors) == ([], [])
    # and it is the resampled input: compare with a one-shot resample of the whole signal
    oneshot = soxr.resample(ref, RATE, 48000, quality="HQ")
    start = int(np.flatnonzero(data)[0] - np.flatnonzero(expected)[0])
    got = data[start:start + len(oneshot)]
    corr = float(np.corrcoef(got, oneshot)[0, 1])
    err = float(np.max(np.abs(got - oneshot)))
    assert corr > 0.999 and err < 1e-3, (corr, err)


@pytest.mark.audio
@pytest.mark.serial
async def test_onset_is_reported_on_the_perf_counter_clock(record_monitor):
    ref = noise(1.0, seed=4)
    with record_monitor("tts16") as cap:
        with Player(RATE) as player:
            await asyncio.sleep(0.3)  # steady state: the stream has been running silent for a while
            seq = player.mark_utterance_start()
            assert player.last_onset_perf is None
            frames_at_write = cap.frames_so_far()
            t_write = perf_counter()
            await player.write(ref)
            await player.drain()
            onset = player.last_onset_perf
            assert player.onset_perf(seq) == onset
    assert onset is not None
    assert t_write <= onset <= t_write + 0.5, onset - t_write
    # cross-check with the monitor: where the audio starts in the capture, relative to the write
    captured_s = (int(np.flatnonzero(cap())[0]) - frames_at_write) / RATE
    assert abs((onset - t_write) - captured_s) < 0.06, (onset - t_write, captured_s)


@pytest.mark.audio
@pytest.mark.serial
async def test_clear_silences_output_fast_and_player_recovers(record_monitor):
    ref = noise(3.0, seed=5)
    ref2 = noise(0.5, seed=6)
    with record_monitor("tts16") as cap:
        with Player(RATE, buffer_s=4.0) as player:
            await asyncio.sleep(0.2)
            player.mark_utterance_start()
            await player.write(ref)  # fits in the ring: returns at once
            while player.last_onset_perf is None:
                await asyncio.sleep(0.005)
            await asyncio.sleep(player.last_onset_perf + 0.8 - perf_counter())
            frames_at_clear = cap.frames_so_far()
            player.clear()
            assert player.fill_frames == 0
            await asyncio.sleep(0.4)
            await player.write(ref2)  # a new utterance after the barge-in
            await player.drain()
            assert (player.underruns, player.underrun_frames) == (0, 0)
    data = cap()
    start = int(np.flatnonzero(data)[0])
    seg = data[start:start + len(ref)]
    played = int(np.flatnonzero(seg != ref[:len(seg)])[0])  # ref samples heard before the cut
    assert 0.6 * RATE < played < 1.2 * RATE
    stop_delay_s = (start + played - frames_at_clear) / RATE
    assert stop_delay_s < 0.1, f"sound went on for {stop_delay_s * 1000:.0f} ms after clear()"
    rest = data[start + played:]
    _, gaps, errors = verify(rest, ref2)
    assert (gaps, errors) == ([], []), "the first utterance is cut off cleanly; the next plays intact"


@pytest.mark.audio
@pytest.mark.serial
async def test_a_stream_started_on_audio_plays_its_first_sample_first_and_stops_between_utterances(record_monitor):
    """start_on_audio: the stream is open but silent until an utterance's pre-roll is queued; it then starts with the
    device's buffer primed from that audio, so the first sample sounds at once, not after the latency's silence;
    it stops after the drain and after a clear, and the next utterances play intact on the same stream."""
    first, second, third = noise(0.6, seed=7), noise(0.4, seed=8), noise(0.5, seed=9)
    with record_monitor("tts16") as cap:
        with Player(RATE, latency=0.1, buffer_s=4.0, start_on_audio=True) as player:
            await asyncio.sleep(0.2)
            assert not player._stream.active, "started before any audio"
            since = cap.frames_so_far()
            await player.write(first)
            made_at = perf_counter()
            while np.count_nonzero(np.fromfile(cap.path, np.float32, offset=4 * since)) == 0:
                assert perf_counter() - made_at < 2, "no sound"
                await asyncio.sleep(0.002)
            first_sound_s = perf_counter() - made_at
            await player.drain()
            assert not player._stream.active, "still running after the drain"
            after_first = cap.frames_so_far()
            await player.write(noise(3.0, seed=10))
            await asyncio.sleep(0.3)
            player.clear()
            assert not player._stream.active, "running again after the clear"
            await asyncio.sleep(0.2)
            cleared_at = cap.frames_so_far()
            await player.write(second)
            await player.drain()
            await player.write(third)
            await player.drain()
            assert (player.underruns, player.output_underflows) == (0, 0)
    data = cap()
    assert first_sound_s < 0.05, f"the first sample sounded {first_sound_s * 1000:.0f} ms after it was queued"
    assert verify(data[:after_first], first)[1:] == ([], [])
    _, gaps, errors = verify(data[cleared_at:], np.concatenate([second, third]))
    assert errors == [] and [at for at, _ in gaps] == [len(second)], "the next two utterances intact"


_VANISH_CHILD = """
import asyncio, os, signal, sys, time
import numpy as np
from engine.backends.sounddevice_sink import Player
from engine.errors import AudioDeviceError

async def main():
    x = np.full(8000, 0.1, np.float32)
    with Player(16000, stall_timeout_s=2.0) as player:
        await player.write(x)
        await asyncio.sleep(0.3)
        os.kill(int(sys.argv[1]), signal.SIGKILL)  # the sound server dies mid-play
        t0 = time.perf_counter()
        try:
            for _ in range(100):
                await player.write(x)
            await player.drain()
        except AudioDeviceError as err:
            print(f"AudioDeviceError after {time.perf_counter() - t0:.2f} s: {err}")
            return
    print("no error")

asyncio.run(main())
"""


@pytest.mark.audio
def test_vanished_device_raises_audio_device_error(private_pulse):
    # In a child process: a native crash in PortAudio or libpulse must not take the test session with it.
    server = private_pulse({"doomed": RATE})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, **server.env, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _VANISH_CHILD, str(server.proc.pid)],
                         env=env, capture_output=True, text=True, timeout=60)
    server.proc.wait(5)
    assert out.returncode == 0, f"child exited {out.returncode}:\n{out.stderr[-3000:]}"
    lines = [line for line in out.stdout.splitlines() if line.startswith(("AudioDeviceError", "no error"))]
    assert len(lines) == 1 and lines[0].startswith("AudioDeviceError") and "--out FILE.wav" in lines[0], out.stdout
    assert float(lines[0].split()[2]) < 5


@pytest.mark.audio
def test_list_devices_and_voicectl_devices(pulse_server, capsys):
    from voiceapp.cli import main

    devices = list_devices()
    names = [d.name for d in devices]
    assert "pulse" in names and sum(d.is_default for d in devices) == 1
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(devices)
    assert any(line.startswith("*") and "default" in line for line in lines)


# -- callback logic with a fake sounddevice (no PortAudio needed) ------------------------------------------


class FakeStream:
    def __init__(self, *, samplerate, channels, dtype, device, latency, callback):
        self.callback, self.samplerate = callback, samplerate
        self.latency = latency if isinstance(latency, float) else 0.1
        self.active = False
        self.restarts = 0

    def start(self):
        self.active = True
        self.restarts += 1

    def abort(self, ignore_errors=True):
        self.active = False

    def close(self, ignore_errors=True):
        self.active = False


class FakeSD:
    class PortAudioError(Exception):
        pass

    OutputStream = FakeStream
    accepted_rates = {16000}

    @classmethod
    def check_output_settings(cls, device=None, samplerate=None, channels=None, dtype=None):
        if samplerate not in cls.accepted_rates:
            raise cls.PortAudioError("Invalid sample rate")

    @staticmethod
    def query_devices(device=None, kind=None):
        return {"default_samplerate": 48000.0}


@pytest.fixture
def fake_sd(monkeypatch):
    monkeypatch.setattr(sounddevice_sink, "import_sounddevice", lambda: FakeSD)
    return FakeSD


def pump(player: Player, frames: int = 400, dac_offset: float = 0.1) -> np.ndarray:
    """Run the callback once as PortAudio would; returns what it wrote."""
    out = np.full((frames, 1), 9.0, np.float32)
    t = SimpleNamespace(currentTime=500.0, outputBufferDacTime=500.0 + dac_offset)
    player._callback(out, frames, t, SimpleNamespace(output_underflow=False))
    return out[:, 0].copy()


def test_preroll_gates_the_start_and_onset_uses_dac_time(fake_sd):
    x = noise(0.5, seed=9)
    player = Player(RATE, preroll_s=0.2)
    asyncio.run(player.write(x[:3000]))  # below the 3200-frame pre-roll
    assert not pump(player).any() and player.last_onset_perf is None
    asyncio.run(player.write(x[3000:3300]))
    before = perf_counter()
    np.testing.assert_array_equal(pump(player), x[:400])
    after = perf_counter()
    assert before + 0.1 <= player.last_onset_perf <= after + 0.1
    assert (player.underruns, player.fill_frames) == (0, 2900)
    seq = player.mark_utterance_start()
    assert player.onset_perf(seq) is None  # nothing of it played yet


def test_onset_of_a_gapless_next_utterance_counts_its_offset_in_the_buffer(fake_sd):
    player = Player(RATE)
    a, b = noise(0.25, seed=10)[:3300], noise(0.5, seed=11)
    asyncio.run(player.write(a))
    first = player.last_onset_perf
    seq_b = player.mark_utterance_start()
    asyncio.run(player.write(b))
    for _ in range(8):
        pump(player)  # 3200 frames of a
    assert player.last_onset_perf is None and player.onset_perf(seq_b) is None
    before = perf_counter()
    out = pump(player)
    np.testing.assert_array_equal(out, np.concatenate([a[3200:], b[:300]]))
    assert first is None or first != player.last_onset_perf
    assert before + 0.1 + 100 / RATE <= player.onset_perf(seq_b) <= perf_counter() + 0.1 + 100 / RATE


def test_underrun_rebuffers_and_counts_the_gap(fake_sd):
    player = Player(RATE, preroll_s=0.2, rebuffer_s=0.2)
    x = noise(1.0, seed=12)
    asyncio.run(player.write(x[:4000]))
    for _ in range(10):
        pump(player)
    assert player.underruns == 0
    assert not pump(player).any()  # dry mid-utterance
    asyncio.run(player.write(x[4000:5000]))  # less than the 3200-frame re-buffer
    assert not pump(player).any()
    assert (player.underruns, player.underrun_frames) == (2, 800)
    asyncio.run(player.write(x[5000:8200]))
    np.testing.assert_array_equal(pump(player), x[4000:4400])
    assert player.underruns == 2


async def _drain_while_pumping(player: Player) -> list[np.ndarray]:
    outs: list[np.ndarray] = []
    done = asyncio.Event()

    async def pumper():
        while not done.is_set():
            outs.append(pump(player))
            await asyncio.sleep(0.001)

    task = asyncio.create_task(pumper())
    try:
        await asyncio.wait_for(player.drain(), 5)
    finally:
        done.set()
        await task
    return outs


def test_short_utterance_plays_on_drain_without_reaching_preroll(fake_sd):
    player = Player(RATE)
    x = noise(0.05, seed=13)  # 800 frames < pre-roll
    asyncio.run(player.write(x))
    assert not pump(player).any()
    outs = np.concatenate(asyncio.run(_drain_while_pumping(player)))
    start = int(np.flatnonzero(outs)[0])
    np.testing.assert_array_equal(outs[start:start + len(x)], x)
    assert not outs[start + len(x):].any()
    assert player.underruns == 0


def test_device_rate_fallback_resamples_with_one_stream(fake_sd):
    assert pick_device_rate(FakeSD, None, 16000) == 16000
    assert pick_device_rate(FakeSD, None, 24000) == 48000  # refused: the device's default rate
    player = Player(24000)
    assert player.device_rate == 48000
    x = noise(0.1, seed=14, rate=24000)
    for chunk in np.array_split(x, 7):
        asyncio.run(player.write(chunk))
    asyncio.run(_drain_while_pumping(player))
    assert player._ring.write_count == 2 * len(x)  # all of it, flushed at drain


def test_equal_rates_pass_samples_through_unchanged(fake_sd):
    player = Player(RATE)
    assert player._resampler is None
    x = noise(0.25, seed=15)
    asyncio.run(player.write(x.astype(np.float64)))
    np.testing.assert_array_equal(pump(player, 4000), x[:4000])


def test_write_awaits_while_full_and_clear_drops_everything(fake_sd):
    player = Player(RATE, preroll_s=0.2, buffer_s=0.3)  # 4800-frame ring
    x = noise(1.0, seed=16)

    async def scenario():
        task = asyncio.create_task(player.write(x[:10000]))
        await asyncio.sleep(0.05)
        assert not task.done() and player.fill_frames == player.capacity_frames
        while not task.done():
            pump(player, 1000)
            await asyncio.sleep(0.005)
        await task
        player.clear()
        assert player.fill_frames == 0 and player._stream.restarts == 2 and player._stream.active
        assert not pump(player).any()
        assert player.underruns == 0 and player.last_onset_perf is None

    asyncio.run(scenario())


def test_dead_or_stalled_stream_raises_audio_device_error(fake_sd):
    player = Player(RATE, buffer_s=0.3, stall_timeout_s=0.2)
    with pytest.raises(AudioDeviceError, match="--out FILE.wav"):
        asyncio.run(player.write(noise(1.0, seed=17)))  # never consumed: no callback progress
    player._stream.active = False
    with pytest.raises(AudioDeviceError, match="--out FILE.wav"):
        asyncio.run(player.write(noise(0.1, seed=18)))
    player.close()
    player.close()


def test_preroll_is_raised_above_a_large_latency(fake_sd):
    player = Player(RATE, latency=0.3, preroll_s=0.2, buffer_s=0.5)
    assert player._preroll_frames == int(0.45 * RATE) and player.capacity_frames == int(0.9 * RATE)
    with pytest.raises(ValueError):
        Player(RATE, preroll_s=-1)


def test_voicectl_devices_without_devices_fails_with_one_line(monkeypatch, capsys):
    from voiceapp.cli import main

    monkeypatch.setattr(sounddevice_sink, "list_devices", lambda: [])
    assert main(["devices"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no audio output devices" in err and "--out" in err


def test_module_imports_without_portaudio(tmp_path):
    """A sounddevice that cannot load PortAudio: importing the sink still works; using it says what to do."""
    (tmp_path / "sounddevice.py").write_text('raise OSError("PortAudio library not found")\n')
    code = textwrap.dedent("""
        import engine.backends.sounddevice_sink as s
        from engine.errors import AudioDeviceError
        for call in (s.list_devices, lambda: s.Player(16000)):
            try:
                call()
            except AudioDeviceError as err:
                print("ERR", err)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all("PortAudio" in line and "--out FILE.wav" in line for line in lines), lines
