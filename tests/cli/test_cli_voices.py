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
    said = {"missing.wav": "no such file", "text.wav": "not an audio file", "silent.wav": "silent",
            ".": "a directory"}
    for ref, name in [("missing.wav", "a"), ("text.wav", "b"), ("silent.wav", "c"), (".", "d")]:
        proc = voicectl("voice", "add", name, "--from", str(tmp_path / ref), "--model", str(tiny_model))
        err = proc.stderr.strip()
        assert proc.returncode != 0 and err.startswith("voicectl: ") and "\n" not in err, err
        assert said[ref] in err and "System error" not in err and "Error opening" not in err, err
    proc = voicectl("voice", "add", "Bad Name!", "--from", str(tmp_path / "silent.wav"))
    assert proc.returncode != 0 and "lowercase" in proc.stderr
    assert voicectl("voice", "add", "ava", "--from", str(tmp_path / "silent.wav")).returncode != 0


def sine_reference(path, seconds: float = 2.0, rate: int = 16000):
    t = np.arange(int(rate * seconds)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), rate)
    return path


def test_quotes_backslashes_and_newlines_in_a_voice_file_round_trip(tiny_model, tmp_path):
    """`voice add` wrote TOML with an f-string: a `"` in the reference's name (the default description), or a
    `"`, `\\` or a newline in --description, made a file that broke every later command."""
    from engine.voices import VoiceBank, user_data_dir

    ref = sine_reference(tmp_path / 'take "2".wav')
    hostile = 'say "hi"\\n, C:\\voices\\\nsecond line'
    try:
        proc = voicectl("voice", "add", "quoted", "--from", str(ref), "--model", str(tiny_model))
        assert proc.returncode == 0, proc.stderr
        proc = voicectl("voice", "add", "hostile", "--from", str(ref), "--model", str(tiny_model),
                        "--description", hostile)
        assert proc.returncode == 0, proc.stderr
        voices = VoiceBank().all()
        assert voices["hostile"].description == hostile and 'take "2".wav' in voices["quoted"].description
        listed = voicectl("voices")
        assert listed.returncode == 0 and listed.stderr == "", listed.stderr
        assert "quoted" in listed.stdout and "hostile" in listed.stdout
        out = tmp_path / "o.wav"
        proc = voicectl("say", "Still speaking.", "--voice", "hostile", "--backend", "fake", "--no-server",
                        "--out", str(out))
        assert proc.returncode == 0, proc.stderr
    finally:
        for name in ("quoted", "hostile"):
            (user_data_dir() / "voices" / f"{name}.toml").unlink(missing_ok=True)


def test_a_broken_user_voice_file_is_skipped_with_one_line_naming_it(tmp_path):
    """One unreadable file in the user's voice folder must not take every other voice down with it."""
    from engine.voices import user_data_dir

    folder = user_data_dir() / "voices"
    folder.mkdir(parents=True, exist_ok=True)
    bad = folder / "broken.toml"
    bad.write_text('name = "broken"\ndescription = "unclosed\n', encoding="utf-8")
    try:
        listed = voicectl("voices")
        assert listed.returncode == 0, listed.stderr
        assert "ava" in listed.stdout and "broken" not in listed.stdout
        note = listed.stderr.strip()
        assert note.startswith("voicectl: ") and "\n" not in note and "broken.toml" in note, note
        out = tmp_path / "o.wav"
        proc = voicectl("say", "Other voices still speak.", "--backend", "fake", "--no-server", "--out", str(out))
        assert proc.returncode == 0 and out.exists(), proc.stderr
        proc = voicectl("say", "This one cannot.", "--voice", "broken", "--backend", "fake", "--no-server",
                        "--out", str(out))
        assert "broken.toml" in cli_helpers.one_line_error(proc)
    finally:
        bad.unlink()


def test_a_clone_does_not_shadow_a_built_in_preset_without_saying_so(tmp_path):
    """`voice add ava --force` silently replaced the default voice for every front end; --force replaces only
    your own voices, and hiding a preset takes --shadow-preset."""
    ref = sine_reference(tmp_path / "ref.wav")
    proc = voicectl("voice", "add", "ava", "--from", str(ref), "--force")
    err = cli_helpers.one_line_error(proc)
    assert "built-in" in err and "--shadow-preset" in err, err


def test_a_clone_from_another_checkpoint_is_refused_with_one_line(tiny_model, tmp_path):
    """A cloned voice's speaker tokens belong to the checkpoint that extracted them (its hash is stored with
    them); another checkpoint would speak them as some other voice, or as noise. The reference recording is not
    kept, so they cannot be recomputed: one line says which voice and how to clone it again."""
    from engine.voices import Voice, VoiceBank, user_data_dir

    bank = VoiceBank()
    bank.save_user_voice(Voice(name="elsewhere", global_tokens=tuple(range(32)), model_hash="0123456789abcdef"))
    try:
        proc = voicectl("say", "Whose voice is this?", "--voice", "elsewhere", "--model", str(tiny_model),
                        "--backend", "torch", "--no-server", "--out", str(tmp_path / "o.wav"))
        err = cli_helpers.one_line_error(proc)
        assert "elsewhere" in err and "0123456789abcdef" in err and "voice add" in err, err
        assert not (tmp_path / "o.wav").exists()
    finally:
        (user_data_dir() / "voices" / "elsewhere.toml").unlink()


def test_a_long_reference_is_read_only_as_far_as_it_is_used(tmp_path):
    """`voice add` uses 6 s of a reference but read all of it as float64: 4.7 GB for a two-hour recording. Now
    only the frames it uses are read, as float32. Measured on a 3-minute file: what reading it allocates."""
    import tracemalloc

    from voiceapp.cli.voice import REFERENCE_READ_S, read_reference

    rate = 22050
    t = np.arange(rate * 180) / rate
    sf.write(tmp_path / "long.wav", (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), rate, subtype="PCM_16")
    tracemalloc.start()
    try:
        audio = read_reference(str(tmp_path / "long.wav"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert audio.dtype == np.float32 and len(audio) == round(REFERENCE_READ_S * 16000)
    whole = 180 * rate * 8  # the whole file as float64: 32 MB
    assert peak < whole / 20, peak


def test_reference_messages_say_what_is_wrong(tmp_path):
    """NaN samples were called silence, a voice in the right channel only was called silence (the left channel
    was taken), and a file that is not audio got libsndfile's own wording ("Error opening <_io.BufferedReader
    ...>: Format not recognised.")."""
    import pytest

    from engine.errors import InputError
    from voiceapp.cli.voice import read_reference

    rate = 16000
    voice = 0.3 * np.sin(2 * np.pi * 180 * np.arange(rate * 2) / rate)
    with_nan = voice.copy()
    with_nan[rate] = np.nan
    sf.write(tmp_path / "nan.wav", with_nan.astype(np.float32), rate, subtype="FLOAT")
    with pytest.raises(InputError, match="NaN or infinite") as err:
        read_reference(str(tmp_path / "nan.wav"))
    assert "silent" not in str(err.value)

    sf.write(tmp_path / "right.wav", np.stack([np.zeros_like(voice), voice], axis=1).astype(np.float32), rate)
    assert np.abs(read_reference(str(tmp_path / "right.wav"))).max() > 0.25

    (tmp_path / "notes.wav").write_text("not audio at all")
    with pytest.raises(InputError) as err:
        read_reference(str(tmp_path / "notes.wav"))
    assert str(err.value).startswith(f"{tmp_path / 'notes.wav'} is not an audio file"), err.value
    assert "_io" not in str(err.value) and "Error opening" not in str(err.value), err.value
