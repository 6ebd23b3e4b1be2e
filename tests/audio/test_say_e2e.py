"""`voicectl say` end to end through real PortAudio playback into a PulseAudio null sink, captured back.

What the speakers got must equal, sample for sample after alignment, what `--out` writes for the same text,
voice and seed: gapless across window seams and sentence joins, with zero underruns. Same through stdin.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from tests import cli_helpers

TEXT = "Real playback must be gapless. A second sentence checks the join!"
COMMON = ["--backend", "torch", "--voice", "leo", "--seed", "5", "--max-tokens", "60", "--no-server"]


def voicectl(args, model, stdin=None):
    proc = cli_helpers.voicectl(*args, "--model", str(model), *COMMON, stdin=stdin)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc


def assert_played_equals_file(capture: np.ndarray, wav: np.ndarray) -> None:
    nz_cap, nz_wav = np.flatnonzero(capture), np.flatnonzero(wav)
    assert len(nz_cap) and len(nz_wav), "nothing was heard"
    start = nz_cap[0] - nz_wav[0]
    assert start >= 0
    played = capture[start:start + len(wav)]
    assert len(played) == len(wav), "the capture ends before the utterance does"
    np.testing.assert_array_equal(played, wav)
    assert not capture[start + len(wav):].any(), "sound after the end"


@pytest.mark.audio
@pytest.mark.serial  # plays in real time and checks every sample: a test beside it on 2 cores left gaps
@pytest.mark.parametrize("via_stdin", [False, True], ids=["argument", "stdin"])
def test_speakers_get_exactly_what_out_writes(pulse_server, record_monitor, tiny_model, tmp_path, via_stdin):
    out = tmp_path / "ref.wav"
    speak = ["say", "-"] if via_stdin else ["say", TEXT]
    stdin = TEXT.encode() if via_stdin else None
    voicectl([*speak, "--out", str(out)], tiny_model, stdin)
    wav, rate = sf.read(out, dtype="float32")
    assert rate == 16000 and len(wav) > 16000
    with record_monitor("tts16") as cap:
        proc = voicectl([*speak, "--json"], tiny_model, stdin)
    stats = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert stats["underruns"] == 0 and stats["sentences"] == 2
    assert isinstance(stats["device_underruns"], int) and stats["device_underruns"] >= 0  # what the device reports
    assert stats["ttfa_ms"] > 0 and stats["onset_ms"] >= stats["ttfa_ms"]
    assert stats["audio_s"] == pytest.approx(len(wav) / 16000, abs=1e-3)
    assert stats["played_ms"] >= stats["onset_ms"] + 1000 * stats["audio_s"] - 100  # it returned once all had played
    assert_played_equals_file(cap(), wav)


SEVEN = ("One sentence to start. A second one follows it. Then a third arrives. The fourth is here. Fifth of them "
         "all. Sixth and nearly done. Seventh and the last.")


@pytest.mark.audio
@pytest.mark.serial  # plays in real time and checks every sample: a test beside it on 2 cores left gaps
def test_the_default_buffer_lets_the_engine_finish_long_before_the_speakers(pulse_server, record_monitor, tiny_model,
                                                                         tmp_path):
    """With a 3 s ring, a fast engine waits on the speakers until the last 3 s are left to play; with the default
    (30 s) it makes everything at once, and the speakers get exactly what --out writes either way."""
    out = tmp_path / "ref.wav"
    voicectl(["say", SEVEN, "--out", str(out)], tiny_model)
    wav, _ = sf.read(out, dtype="float32")
    audio_s = len(wav) / 16000
    assert audio_s > 6
    stats = {}
    for buffer in ("3", "default"):
        with record_monitor("tts16") as cap:
            proc = voicectl(["say", SEVEN, "--json", *(["--buffer", buffer] if buffer != "default" else [])],
                            tiny_model)
        stats[buffer] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        assert stats[buffer]["underruns"] == 0
        assert_played_equals_file(cap(), wav)
    assert stats["3"]["wall_s"] > audio_s - 3.5, stats["3"]
    assert stats["default"]["wall_s"] < audio_s - 3.5, stats["default"]


READ = "Real playback. Then a join!"
"""Two sentences for the bench to read, short: the tiny checkpoint speaks each to its cap, which grows with the
text (TEXT would play for twice as long, in a test that runs alone)."""


@pytest.mark.audio
@pytest.mark.serial  # plays in real time and checks every sample: a test beside it on 2 cores left gaps
def test_bench_read_plays_through_the_speakers(pulse_server, record_monitor, tiny_model, tmp_path):
    """`python -m lab.read_bench`: its `say` process plays the reading; first sound after first audio, no underrun."""
    out, text = tmp_path / "read.json", tmp_path / "text.txt"
    text.write_text(READ)
    with record_monitor("tts16") as cap:
        proc = cli_helpers.lab("read_bench", "--model", str(tiny_model), "--backend", "torch", "--text", str(text),
                               "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads(out.read_text())["runs"][0]
    assert run["underruns"] == 0 and run["first_sound_s"] >= run["ttfa_s"] > 0
    assert np.count_nonzero(cap()) > 0.9 * run["audio_s"] * 16000


@pytest.mark.audio
def test_doctor_plays_a_test_tone_and_passes(pulse_server, record_monitor, tiny_model):
    with record_monitor("tts16") as cap:
        proc = subprocess.run([sys.executable, "-m", "voiceapp.cli", "doctor", "--model", str(tiny_model)],
                              capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[ok  ] playback" in proc.stdout and "underruns 0" in proc.stdout
    heard = cap()
    assert np.count_nonzero(heard) >= 8000 - 320  # half a second of tone at 16 kHz (fades aside)


def test_doctor_without_a_model_says_how_to_get_one(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "voiceapp.cli", "doctor", "--no-sound", "--model",
                           str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "voicectl model download" in proc.stdout


@pytest.mark.audio
@pytest.mark.serial
def test_ctrl_c_stops_sound_within_100_ms_and_exits_130(pulse_server, record_monitor, tiny_model):
    """SIGINT while speaking: the speakers go silent within 100 ms (plus the capture's own ~10 ms latency),
    the exit status is 130 and stderr has one line."""
    import signal
    import time

    args = [sys.executable, "-m", "voiceapp.cli", "say", "A long sentence that keeps talking. " * 4,
            "--model", str(tiny_model), "--backend", "torch", "--seed", "2", "--max-tokens", "400", "--no-server"]
    with record_monitor("tts16") as cap:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and np.count_nonzero(np.fromfile(cap.path, np.float32)) < 16000:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)  # wait until a second of sound has played
        at_signal = cap.frames_so_far()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        time.sleep(0.3)
    assert proc.returncode == 130, err.decode()
    assert cli_helpers.without_start_notices(err).count("\n") == 0 and "Traceback" not in err.decode()
    after = cap()[at_signal:]
    nonzero = np.flatnonzero(after)
    tail_ms = (nonzero[-1] + 1) / 16 if len(nonzero) else 0.0
    print(f"sound after Ctrl-C: {tail_ms:.0f} ms")
    assert tail_ms <= 110, f"sound went on for {tail_ms:.0f} ms after Ctrl-C"
