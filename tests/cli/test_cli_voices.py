"""`voicectl voices` and `voicectl voice add/remove` end to end: cloning from a real WAV on the tiny checkpoint."""

import numpy as np
import soundfile as sf

from tests import cli_helpers


def voicectl(*args, env=None):
    return cli_helpers.voicectl(*args, env=env, text=True)


def test_voices_lists_six_presets_and_cache_status(tiny_model):
    proc = voicectl("voices", "--model", str(tiny_model))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) >= 6 and all(" not cached " in l or " cached " in l for l in lines[:6])


def test_clone_a_voice_then_use_it_then_remove_it(tiny_model, tmp_path):
    rate = 22050  # not 16 kHz: the reference is resampled
    t = np.arange(int(rate * 3.5)) / rate
    ref = 0.3 * np.sin(2 * np.pi * (140 + 60 * np.sin(2 * np.pi * 3 * t)) * t) * (1 + 0.5 * np.sin(2 * np.pi * t))
    sf.write(tmp_path / "ref.wav", ref.astype(np.float32), rate)
    proc = voicectl("voice", "add", "myvoice", "--from", str(tmp_path / "ref.wav"), "--model", str(tiny_model))
    assert proc.returncode == 0, proc.stderr
    listed = voicectl("voices").stdout
    assert "myvoice" in listed and "cloned" in listed
    out = tmp_path / "o.wav"
    proc = voicectl("say", "Cloned voices speak too.", "--voice", "myvoice", "--out", str(out),
                    "--model", str(tiny_model), "--backend", "torch", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    assert sf.info(out).frames > 0
    again = voicectl("voice", "add", "myvoice", "--from", str(tmp_path / "ref.wav"), "--model", str(tiny_model))
    assert again.returncode != 0 and "--force" in again.stderr
    assert voicectl("voice", "remove", "myvoice").returncode == 0
    assert "myvoice" not in voicectl("voices").stdout


def test_clone_bad_references(tiny_model, tmp_path):
    (tmp_path / "text.wav").write_text("not audio at all")
    sf.write(tmp_path / "silent.wav", np.zeros(16000 * 2, np.float32), 16000)
    said = {"missing.wav": "no such file", "text.wav": "as audio", "silent.wav": "non-silent", ".": "a directory"}
    for ref, name in [("missing.wav", "a"), ("text.wav", "b"), ("silent.wav", "c"), (".", "d")]:
        proc = voicectl("voice", "add", name, "--from", str(tmp_path / ref), "--model", str(tiny_model))
        err = proc.stderr.strip()
        assert proc.returncode != 0 and err.startswith("voicectl: ") and "\n" not in err, err
        assert said[ref] in err and "System error" not in err, err
    proc = voicectl("voice", "add", "Bad Name!", "--from", str(tmp_path / "silent.wav"))
    assert proc.returncode != 0 and "lowercase" in proc.stderr
    assert voicectl("voice", "add", "ava", "--from", str(tmp_path / "silent.wav")).returncode != 0
