"""The engine flags every command shares (voiceapp.common): bad values get one line, before any model loads."""
import pytest

from tests.cli_helpers import one_line_error, voicectl


def command(name, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("Hello there.")
    return {"say": ["say", "Hello there.", "--out", str(tmp_path / "o.wav"), "--no-server"],
            "export": ["export", str(src), "-o", str(tmp_path / "o.wav")],
            "serve": ["serve", "--socket", str(tmp_path / "s.sock"), "--no-tune"]}[name]


@pytest.mark.parametrize("threads", ["0", "-2"])
@pytest.mark.parametrize("name", ["say", "export", "serve"])
def test_threads_below_one_is_one_line(name, threads, tiny_model, tmp_path):
    proc = voicectl(*command(name, tmp_path), "--threads", threads, "--model", str(tiny_model),
                    "--backend", "torch", timeout=120)
    line = one_line_error(proc)
    assert proc.returncode == 2 and f"--threads {threads}" in line, line
    assert not (tmp_path / "o.wav").exists() and not (tmp_path / "s.sock").exists()
