"""VoiceBank reads each voice file once and again only when it changes: files added, edited or removed on disk
count at the next lookup (a running server picks them up), and unchanged files are not parsed per request."""
from __future__ import annotations

import os

import pytest

from engine.errors import InputError
from engine.voices import VoiceBank, VoiceNotFound


def write(path, name: str, description: str) -> None:
    path.write_text(f'name = "{name}"\ndescription = "{description}"\ngender = "female"\n', encoding="utf-8")


def test_voice_files_are_parsed_once_and_again_only_when_changed(tmp_path, monkeypatch) -> None:
    import engine.voices as voices

    parsed = []
    real = voices.load_voice_file
    monkeypatch.setattr(voices, "load_voice_file", lambda path: parsed.append(path.name) or real(path))
    write(tmp_path / "a.toml", "a", "first")
    bank = VoiceBank([tmp_path])
    first = bank.get("a")
    assert bank.get("a") is first and parsed == ["a.toml"]  # the second lookup reads nothing

    write(tmp_path / "a.toml", "a", "edited, and longer")
    assert bank.get("a").description == "edited, and longer" and parsed == ["a.toml", "a.toml"]

    write(tmp_path / "b.toml", "b", "new")
    assert bank.get("b").description == "new"
    (tmp_path / "a.toml").unlink()
    with pytest.raises(VoiceNotFound):
        bank.get("a")


def test_an_edit_within_the_same_size_and_second_is_still_seen(tmp_path) -> None:
    path = tmp_path / "a.toml"
    write(path, "a", "one")
    bank = VoiceBank([tmp_path])
    assert bank.get("a").description == "one"
    stat = path.stat()
    write(path, "a", "two")  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # a clock with coarse ticks: 1 ns later
    assert bank.get("a").description == "two"


def test_a_broken_voice_file_is_an_input_error_every_time(tmp_path) -> None:
    (tmp_path / "bad.toml").write_text("name = [unclosed\n", encoding="utf-8")
    bank = VoiceBank([tmp_path])
    for _ in range(2):
        with pytest.raises(InputError, match="bad.toml"):
            bank.get("bad")


def test_the_available_voice_is_the_one_asked_for_else_the_first_by_name() -> None:
    """voices.available_voice (the warm-up's and the TUI's choice): the named voice ("" and "default" mean the
    default one) where it exists, else the first by name, and the default's name where there are none."""
    from engine.voices import DEFAULT_VOICE, available_voice

    assert available_voice("default", {"zed", DEFAULT_VOICE, "bench"}) == DEFAULT_VOICE
    assert available_voice("", ["zed", "bench"]) == "bench"
    assert available_voice("zed", ["zed", "bench"]) == "zed"
    assert available_voice("nobody", ["zed", "bench"]) == "bench"
    assert available_voice("default", []) == DEFAULT_VOICE


def test_a_voice_file_nested_50000_deep_is_left_out_not_a_traceback(tmp_path) -> None:
    """tomllib recurses once a level: a voice file nested 50,000 deep was a RecursionError out of every lookup."""
    write(tmp_path / "a.toml", "a", "fine")
    (tmp_path / "deep.toml").write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n", encoding="utf-8")
    skipped = []
    bank = VoiceBank([tmp_path], on_skip=lambda path, err: skipped.append((path.name, str(err))))
    assert list(bank.all()) == ["a"]
    assert skipped == [("deep.toml", "cannot read voice file deep.toml: nested too deeply")]
    with pytest.raises(InputError, match="deep.toml: nested too deeply"):
        bank.get("deep")
