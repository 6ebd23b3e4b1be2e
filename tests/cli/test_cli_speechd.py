"""`voicectl speechd install|uninstall|status|speak` without speech-dispatcher itself: the files install writes and
undoes, the command sd_generic runs (its substitution and quoting emulated, then run by /bin/sh), and what a message's
voice type, rate and pitch become. tests/audio/test_speechd.py runs the real daemon."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import InputError
from engine.voices import Voice, VoiceBank
from tests import cli_helpers
from voiceapp import speechd

USER_CONF = """# my settings
LogLevel 3
AddModule "espeak-ng" "sd_espeak-ng" "espeak-ng.conf"
DefaultModule espeak-ng
DefaultRate 30
"""


def voicectl(*args, env):
    return cli_helpers.voicectl(*args, env=env, text=True)


def test_install_twice_then_uninstall_leaves_nothing(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_RUNTIME_DIR": str(tmp_path)}
    conf_dir = tmp_path / "config" / "speech-dispatcher"
    first = voicectl("speechd", "install", "--voice", "mia", "--seed", "3", env=env)
    assert first.returncode == 0, first.stderr
    assert "uninstall" in first.stdout and str(conf_dir / "modules" / speechd.MODULE_CONF) in first.stdout
    files = {p: p.read_bytes() for p in conf_dir.rglob("*") if p.is_file()}
    assert set(files) == {conf_dir / "speechd.conf", conf_dir / "modules" / speechd.MODULE_CONF}
    module = files[conf_dir / "modules" / speechd.MODULE_CONF].decode()
    assert "--seed 3 " in module and 'AddVoice "en" "MALE1" "mia"' in module and 'DefaultVoice "mia"' in module
    again = voicectl("speechd", "install", "--voice", "mia", "--seed", "3", env=env)
    assert again.returncode == 0 and "nothing to change" in again.stdout
    assert {p: p.read_bytes() for p in conf_dir.rglob("*") if p.is_file()} == files
    assert voicectl("speechd", "status", env=env).returncode == 0
    gone = voicectl("speechd", "uninstall", env=env)
    assert gone.returncode == 0 and "removed" in gone.stdout
    assert not conf_dir.exists(), "uninstall left files behind"
    assert voicectl("speechd", "status", env=env).returncode == 1
    assert "nothing to remove" in voicectl("speechd", "uninstall", env=env).stdout


def test_install_keeps_the_users_settings_and_uninstall_restores_them(tmp_path):
    paths = speechd.Paths(tmp_path / "user", system_dir=tmp_path / "system")
    paths.conf_dir.mkdir()
    paths.speechd_conf.write_text(USER_CONF)
    speechd.install(paths, "GenericExecuteSynth \"x '$DATA'\"\n", make_default=True)
    text = paths.speechd_conf.read_text()
    assert text.startswith(USER_CONF.replace("DefaultModule espeak-ng", speechd.OFF + "DefaultModule espeak-ng"))
    # the user lists modules, so speechd loads no others: ours gets an AddModule line; and only ours is default
    assert f'AddModule "{speechd.MODULE}" "sd_generic" "{speechd.MODULE_CONF}"' in text
    assert speechd.active_lines(text, "DefaultModule") == [f"DefaultModule {speechd.MODULE}"]
    speechd.install(paths, "GenericExecuteSynth \"x '$DATA'\"\n", make_default=False)  # re-install: one block
    assert paths.speechd_conf.read_text().count(speechd.BEGIN) == 1
    assert speechd.active_lines(paths.speechd_conf.read_text(), "DefaultModule") == ["DefaultModule espeak-ng"]
    speechd.uninstall(paths)
    assert paths.speechd_conf.read_text() == USER_CONF and not paths.module_conf.exists()


def test_a_created_copy_the_user_edited_is_kept(tmp_path):
    paths = speechd.Paths(tmp_path / "user", system_dir=tmp_path / "system")
    paths.system_dir.mkdir()
    paths.system_conf.write_text("DefaultRate 0\n")
    assert speechd.install(paths, "x\n", make_default=False).created_conf
    assert "AddModule" not in paths.speechd_conf.read_text()  # speechd finds *-generic.conf by itself then
    paths.speechd_conf.write_text(paths.speechd_conf.read_text() + "DefaultVolume 50\n")
    speechd.uninstall(paths)
    assert paths.speechd_conf.read_text() == "DefaultRate 0\nDefaultVolume 50\n"


def sd_generic_command(module_text: str, voice: str, text: str) -> str:
    """What sd_generic hands /bin/sh: its $-variables replaced, then $DATA by the text with ' written '\\''."""
    command = speechd.module_command(module_text)
    for name, value in (("$VOICE", voice), ("$RATE", "-30"), ("$PITCH", "12")):
        command = command.replace(name, value)
    return command.replace("$DATA", text.replace("'", "'\\''"))


NASTY = ["It's", "'; touch pwned; '", "$(touch pwned)", "`touch pwned`", "\\'\\", "a\nb\n\n", '"$HOME"', "-",
         "--voice x", "日本語 é", "' '' '''", "$DATA $VOICE", "; exit 1"]


@pytest.mark.parametrize("text", NASTY)
def test_the_text_reaches_speak_as_one_argument_whatever_it_holds(tmp_path, text):
    stub = tmp_path / "python"  # stands in for the interpreter: records its arguments
    stub.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    module = speechd.module_conf_text(speechd.speak_command(str(stub), ["--model", "/m"]), {"ava": "female"},
                                      speechd.VOICE_TYPES, "ava")
    subprocess.run(["/bin/sh", "-c", sd_generic_command(module, "ava", text)], cwd=tmp_path, check=True,
                   env={**os.environ, "HOME": str(tmp_path)})
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == ["-m", "voiceapp.cli", "speechd", "speak", "--model", "/m", "--voice", "ava", "--rate", "-30",
                    "--pitch", "12", "--", text]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("bad", ["/home/me/my venv/bin/python", '/a"b', "/a\\b", "/a$DATA", "/a#b", "/a'b"])
def test_paths_the_config_cannot_carry_are_refused(bad):
    with pytest.raises(InputError, match="cannot put"):
        speechd.speak_command(bad)


def test_voice_types_map_to_presets_and_install_voice_takes_the_default_type():
    slots = speechd.type_slots("emma", speechd.default_voice_type('DefaultVoiceType  "female2"\n'))
    assert slots["FEMALE2"] == "emma" and slots["MALE1"] == "leo"
    assert speechd.default_voice_type("# DefaultVoiceType FEMALE1\n") == "MALE1"
    module = speechd.module_conf_text("x '$DATA'", {"ava": "female", "mia": "female", "me": "male"}, slots, "emma")
    assert 'AddVoice "en" "MALE1" "me"' in module and 'AddVoice "zh" "FEMALE2" "emma"' not in module  # no emma
    assert module.index('"MALE1" "me"') < module.index('"FEMALE1" "ava"')  # for each type, the last line wins
    assert "$LANGUAGE" not in module and 'GenericLanguage "en" "en" "utf-8"' in module


@pytest.mark.parametrize("value, shift", [(0, 0), (19, 0), (-19.9, 0), (20, 1), (59, 1), (60, 2), (100, 2),
                                          (-20, -1), (-100, -2), (500, 2)])
def test_level_shift(value, shift):
    assert speechd.level_shift(value) == shift


@pytest.mark.parametrize("voice, rate, pitch, picked", [
    ("ava", 0, 0, "ava"), ("ava", 10, -10, "ava"), ("ava", 0, 50, "emma"), ("ava", 0, -50, "mia"),
    ("ava", 100, 0, "ava"),  # no quicker female preset: the voice itself
    ("leo", 80, 60, "sam"), ("leo", -50, -50, "max"), ("max", 0, 0, "max"), ("sam", -100, -100, "max")])
def test_rate_and_pitch_pick_the_nearest_preset_of_the_same_gender(voice, rate, pitch, picked):
    assert speechd.pick_voice(voice, rate, pitch, VoiceBank().all()) == picked


def test_cloned_voices_stay_whatever_the_rate():
    voices = {**VoiceBank().all(), "me": Voice(name="me", gender="female", global_tokens=(0,) * 32)}
    assert speechd.pick_voice("me", 100, 100, voices) == "me"


@pytest.mark.parametrize("raw, text", [("日本 é".encode(), "日本 é"), ("é ok".encode("latin-1"), "é ok"),
                                       ("日本".encode()[1:] + b" ok " + "é".encode()[:1], "本 ok ")])
def test_data_decodes_utf8_latin1_and_cut_characters(raw, text):
    assert speechd.decode_data(raw) == text


def test_speechd_numbers():
    assert [speechd.speechd_number(t) for t in ("-30", "12.50", "$RATE", "nan", "")] == [-30, 12.5, 0, 0, 0]


def test_speak_with_nothing_to_say_exits_quietly(tmp_path):
    """Screen readers send lone punctuation: no error, no engine, no sound (the model path does not exist)."""
    proc = voicectl("speechd", "speak", "--voice", "ava", "--model", str(tmp_path / "none"), "--", " ... ",
                    env={"VOICEAPP_NO_SERVER": "1"})
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == ""


def test_status_says_what_is_missing(tmp_path):
    proc = voicectl("speechd", "status", env={"XDG_CONFIG_HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)})
    assert proc.returncode == 1 and "voicectl speechd install" in proc.stdout


def test_reload_signals_only_a_live_speech_dispatcher(tmp_path):
    (tmp_path / "speech-dispatcher" / "pid").mkdir(parents=True)
    (tmp_path / "speech-dispatcher" / "pid" / "speech-dispatcher.pid").write_text(f"{os.getpid()}\n")
    assert speechd.reload_running({"XDG_RUNTIME_DIR": str(tmp_path)}) is None  # this is python, not speechd
    assert speechd.running_pid({}) is None
    assert Path(speechd.user_conf_dir({"HOME": "/h"})) == Path("/h/.config/speech-dispatcher")
