"""`voicectl speechd install|uninstall|status` without speech-dispatcher itself: the files install writes (the native
module's start script and configuration, the block in speechd.conf) and undoes, the checked model path, the migration
from the earlier sd_generic module, and what a message's voice type, rate and pitch become. tests/audio/test_speechd.py
runs the real daemon; tests/pure/test_speechd_protocol.py the module's protocol."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.voices import BUILTIN_DIR, Voice, VoiceBank, preset_slots
from tests import cli_helpers
from voiceapp.speechd import install as speechd
from voiceapp.speechd.module import read_config

USER_CONF = """# my settings
LogLevel 3
AddModule "espeak-ng" "sd_espeak-ng" "espeak-ng.conf"
DefaultModule espeak-ng
DefaultRate 30
"""


def voicectl(*args, env):
    return cli_helpers.voicectl(*args, env=env, text=True)


def user_env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_RUNTIME_DIR": str(tmp_path),
            "XDG_DATA_HOME": str(tmp_path / "share"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_install_twice_then_uninstall_leaves_nothing(tmp_path):
    env = user_env(tmp_path)
    conf_dir = tmp_path / "config" / "speech-dispatcher"
    program = tmp_path / "libexec" / "speech-dispatcher-modules" / speechd.MODULE_PROGRAM
    first = voicectl("speechd", "install", "--voice", "mia", "--seed", "3", "--backend", "fake", env=env)
    assert first.returncode == 0, first.stderr
    assert "uninstall" in first.stdout and str(conf_dir / "modules" / speechd.MODULE_CONF) in first.stdout
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert set(files) == {conf_dir / "speechd.conf", conf_dir / "modules" / speechd.MODULE_CONF, program}
    config = read_config(conf_dir / "modules" / speechd.MODULE_CONF)
    assert config.args == ["--backend", "fake", "--seed", "3"] and config.voice_types["MALE1"] == "mia"
    assert config.default_voice == "mia" and config.log == tmp_path / "cache" / "voiceapp" / "speechd-module.log"
    assert os.access(program, os.X_OK) and "speechd module" in program.read_text()
    again = voicectl("speechd", "install", "--voice", "mia", "--seed", "3", "--backend", "fake", env=env)
    assert again.returncode == 0 and "nothing to change" in again.stdout
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    assert voicectl("speechd", "status", env=env).returncode == 0
    gone = voicectl("speechd", "uninstall", env=env)
    assert gone.returncode == 0 and "removed" in gone.stdout
    assert not conf_dir.exists() and not program.exists(), "uninstall left files behind"
    assert voicectl("speechd", "status", env=env).returncode == 1
    assert "nothing to remove" in voicectl("speechd", "uninstall", env=env).stdout


def test_install_records_the_models_absolute_path_and_refuses_a_bad_one(tmp_path, tiny_model):
    env = user_env(tmp_path)
    relative = os.path.relpath(tiny_model, tmp_path)
    made = cli_helpers.voicectl("speechd", "install", "--model", relative, env=env, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    config = read_config(tmp_path / "config" / "speech-dispatcher" / "modules" / speechd.MODULE_CONF)
    assert config.args[:2] == ["--model", str(Path(tiny_model).resolve())]
    (tmp_path / "empty").mkdir()
    for bad in (str(tmp_path / "missing"), str(tmp_path / "empty")):
        err = cli_helpers.one_line_error(voicectl("speechd", "install", "--model", bad, env=env))
        assert bad in err
    assert read_config(tmp_path / "config" / "speech-dispatcher" / "modules" / speechd.MODULE_CONF) == config


def test_install_replaces_the_earlier_sd_generic_module(tmp_path):
    """A user of the sd_generic module (its configuration, and our block naming it as the default) gets the native
    module, and nothing of the old one stays."""
    env = user_env(tmp_path)
    modules = tmp_path / "config" / "speech-dispatcher" / "modules"
    modules.mkdir(parents=True)
    (modules / speechd.OLD_MODULE_CONF).write_text('GenericExecuteSynth "exec x"\n')
    conf = modules.parent / "speechd.conf"
    conf.write_text(USER_CONF.replace("DefaultModule espeak-ng", speechd.OFF + "DefaultModule espeak-ng") +
                    f'{speechd.BEGIN}\nAddModule "voiceapp-generic" "sd_generic" "voiceapp-generic.conf"\n'
                    f"DefaultModule voiceapp-generic\n{speechd.END}\n")
    made = voicectl("speechd", "install", "--default", "--backend", "fake", env=env)
    assert made.returncode == 0 and "the earlier sd_generic module" in made.stdout, made.stderr
    assert not (modules / speechd.OLD_MODULE_CONF).exists() and (modules / speechd.MODULE_CONF).exists()
    text = conf.read_text()
    assert "voiceapp-generic" not in text and text.count(speechd.BEGIN) == 1
    program = tmp_path / "libexec" / "speech-dispatcher-modules" / speechd.MODULE_PROGRAM
    assert f'AddModule "{speechd.MODULE}" "{program}" "{speechd.MODULE_CONF}"' in text
    assert speechd.active_lines(text, "DefaultModule") == [f"DefaultModule {speechd.MODULE}"]


def test_install_keeps_the_users_settings_and_uninstall_restores_them(tmp_path):
    paths = speechd.Paths(tmp_path / "user", system_dir=tmp_path / "system", module_dir=tmp_path / "bin")
    paths.conf_dir.mkdir()
    paths.speechd_conf.write_text(USER_CONF)
    speechd.install(paths, "Args\n", "#!/bin/sh\n", make_default=True)
    text = paths.speechd_conf.read_text()
    assert text.startswith(USER_CONF.replace("DefaultModule espeak-ng", speechd.OFF + "DefaultModule espeak-ng"))
    # the user lists modules, so speechd loads no others: ours gets an AddModule line; and only ours is default
    assert f'AddModule "{speechd.MODULE}" "{paths.module_program}" "{speechd.MODULE_CONF}"' in text
    assert speechd.active_lines(text, "DefaultModule") == [f"DefaultModule {speechd.MODULE}"]
    speechd.install(paths, "Args\n", "#!/bin/sh\n", make_default=False)  # re-install: one block
    assert paths.speechd_conf.read_text().count(speechd.BEGIN) == 1
    assert speechd.active_lines(paths.speechd_conf.read_text(), "DefaultModule") == ["DefaultModule espeak-ng"]
    speechd.uninstall(paths)
    assert paths.speechd_conf.read_text() == USER_CONF and not paths.module_conf.exists()
    assert not paths.module_program.exists()


def test_a_created_copy_the_user_edited_is_kept(tmp_path):
    paths = speechd.Paths(tmp_path / "user", system_dir=tmp_path / "system", module_dir=tmp_path / "bin")
    paths.system_dir.mkdir()
    paths.system_conf.write_text("DefaultRate 0\n")
    assert speechd.install(paths, "x\n", "#!/bin/sh\n", make_default=False).created_conf
    assert "AddModule" not in paths.speechd_conf.read_text()  # speechd finds sd_voiceapp by itself then
    paths.speechd_conf.write_text(paths.speechd_conf.read_text() + "DefaultVolume 50\n")
    speechd.uninstall(paths)
    assert paths.speechd_conf.read_text() == "DefaultRate 0\nDefaultVolume 50\n"


def test_the_start_script_runs_the_module_with_speechds_argument(tmp_path):
    """The script speechd starts hands its argument to `voicectl speechd module` (here: a configuration that is not
    there, so INIT fails with a reason on stdout, as speechd expects)."""
    script = tmp_path / speechd.MODULE_PROGRAM
    script.write_text(speechd.program_text(sys.executable))
    script.chmod(0o755)
    proc = subprocess.run([str(script), str(tmp_path / "none.conf")], input="INIT\n", capture_output=True,
                          text=True, timeout=60, env={**os.environ, "LANG": "C"})
    assert proc.returncode == 1 and proc.stdout.splitlines()[-1] == "399 ERR CANT INIT MODULE"
    assert "none.conf" in proc.stdout


def test_voice_types_map_to_presets_and_install_voice_takes_the_default_type():
    presets = VoiceBank().presets()
    slots = speechd.type_slots("emma", speechd.default_voice_type('DefaultVoiceType  "female2"\n'), presets)
    assert slots["FEMALE2"] == "emma" and slots["MALE1"] == "leo"
    assert speechd.default_voice_type("# DefaultVoiceType FEMALE1\n") == "MALE1"


def test_voice_types_come_from_the_familys_presets_by_gender_and_pitch():
    from engine.families import family

    assert preset_slots(family("spark").voices().presets()) == {
        "MALE1": "leo", "MALE2": "max", "MALE3": "sam", "FEMALE1": "ava", "FEMALE2": "mia", "FEMALE3": "emma",
        "CHILD_MALE": "sam", "CHILD_FEMALE": "emma"}
    assert preset_slots(family("orpheus").voices().presets()) == {
        "MALE1": "leo", "MALE2": "dan", "MALE3": "zac", "FEMALE1": "tara", "FEMALE2": "leah", "FEMALE3": "jess",
        "CHILD_MALE": "leo", "CHILD_FEMALE": "tara"}
    one = {"solo": Voice(name="solo", gender="female")}
    assert set(preset_slots(one).values()) == {"solo"}  # a gender it lacks speaks with the other's


def test_a_users_attribute_voice_never_takes_a_voice_type(tmp_path):
    (tmp_path / "mine.toml").write_text('name = "mine"\ngender = "male"\npitch = "moderate"\n')
    bank = VoiceBank(dirs=[BUILTIN_DIR, tmp_path])
    assert "mine" in bank.all() and "mine" not in bank.presets()
    assert "mine" not in preset_slots(bank.presets()).values()


def test_install_for_an_orpheus_model_speaks_its_voices(tmp_path, orpheus_tiny):
    env = user_env(tmp_path)
    made = voicectl("speechd", "install", "--model", str(orpheus_tiny), env=env)
    assert made.returncode == 0, made.stderr
    config = read_config(tmp_path / "config" / "speech-dispatcher" / "modules" / speechd.MODULE_CONF)
    assert config.default_voice == "tara" and config.voice_types["FEMALE1"] == "tara"
    assert config.voice_types["MALE1"] == "leo" and config.voice_types["MALE2"] == "dan"
    made = voicectl("speechd", "install", "--model", str(orpheus_tiny), "--voice", "zoe", env=env)
    assert made.returncode == 0, made.stderr
    config = read_config(tmp_path / "config" / "speech-dispatcher" / "modules" / speechd.MODULE_CONF)
    assert config.default_voice == "zoe" and config.voice_types["MALE1"] == "zoe"  # speechd's default type
    err = cli_helpers.one_line_error(voicectl("speechd", "install", "--model", str(orpheus_tiny), "--voice", "ava",
                                              env=env))
    assert "ava" in err and "tara" in err


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


def test_speechd_numbers():
    assert [speechd.speechd_number(t) for t in ("-30", "12.50", "$RATE", "nan", "")] == [-30, 12.5, 0, 0, 0]


def test_status_says_what_is_missing(tmp_path):
    proc = voicectl("speechd", "status", env={"XDG_CONFIG_HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)})
    assert proc.returncode == 1 and "voicectl speechd install" in proc.stdout


def test_status_shows_the_modules_log_when_its_last_run_failed(tmp_path):
    env = user_env(tmp_path)
    assert voicectl("speechd", "install", "--backend", "fake", env=env).returncode == 0
    log = tmp_path / "cache" / "voiceapp" / "speechd-module.log"
    log.parent.mkdir(parents=True)
    log.write_text("t [1] started (c)\nt [1] error: old trouble\nt [2] started (c)\nt [2] quit\n")
    assert "ends with errors" not in voicectl("speechd", "status", env=env).stdout  # the last run was fine
    log.write_text(log.read_text() + "t [3] started (c)\nt [3] error: the voicectl server could not start\n")
    shown = voicectl("speechd", "status", env=env).stdout
    assert "ends with errors" in shown and "error: the voicectl server could not start" in shown


def test_reload_signals_only_a_live_speech_dispatcher(tmp_path):
    (tmp_path / "speech-dispatcher" / "pid").mkdir(parents=True)
    (tmp_path / "speech-dispatcher" / "pid" / "speech-dispatcher.pid").write_text(f"{os.getpid()}\n")
    assert speechd.reload_running({"XDG_RUNTIME_DIR": str(tmp_path)}) is None  # this is python, not speechd
    assert speechd.running_pid({}) is None
    assert Path(speechd.user_conf_dir({"HOME": "/h"})) == Path("/h/.config/speech-dispatcher")
