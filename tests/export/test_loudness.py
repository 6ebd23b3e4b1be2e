"""--loudness: BS.1770 integrated loudness per chapter. The streaming meter agrees with pyloudnorm's whole-signal
meter (its K-weighting filters with scipy's lfilter: the dev extra's, the oracle; the meter itself needs neither),
and every chapter of an export measures the target with pyloudnorm."""
import math
import wave

import numpy as np
import pyloudnorm
import pytest
from pyloudnorm.iirfilter import IIRfilter
from scipy.signal import lfilter

from engine.loudness import FILTER_BLOCK, Biquad, LoudnessMeter, high_pass_coefficients, shelf_coefficients
from voiceapp.cli import main
from tests.export.test_cli_export_book import BOOK, FAST


@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_the_k_weighting_filters_are_pyloudnorms_run_as_lfilter_runs_them(rate):
    """Coefficients to the last bit of pyloudnorm's; the filtered pieces (one sample, a block, several blocks and a
    remainder, any size) join into scipy's lfilter of the whole signal."""
    shelf = IIRfilter(4.0, 1 / math.sqrt(2), 1500.0, rate, "high_shelf")
    high_pass = IIRfilter(0.0, 0.5, 38.0, rate, "high_pass")
    ours = [shelf_coefficients(4.0, 1 / math.sqrt(2), 1500.0, rate), high_pass_coefficients(0.5, 38.0, rate)]
    for (b, a), theirs in zip(ours, [shelf, high_pass]):
        np.testing.assert_allclose(b, theirs.b, rtol=1e-14)
        np.testing.assert_allclose(a, theirs.a, rtol=1e-14)
    rng = np.random.default_rng(rate)
    x = rng.standard_normal(rate * 20)
    expected = lfilter(high_pass.b, high_pass.a, lfilter(shelf.b, shelf.a, x))
    stages, pieces, at = [Biquad(b, a) for b, a in ours], [], 0
    for n in [1, 2, FILTER_BLOCK, 3 * FILTER_BLOCK + 5, *rng.integers(1, 9000, 100), len(x)]:  # the last: the rest
        piece = x[at:at + n]
        for stage in stages:
            piece = stage(piece)
        pieces.append(piece)
        at += n
    got = np.concatenate(pieces)
    assert len(got) == len(x) and np.abs(got - expected).max() < 1e-8
    assert not np.allclose(got, x)  # the filters do filter


@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_the_streaming_meter_measures_what_pyloudnorm_does(rate):
    rng = np.random.default_rng(rate)
    t = np.arange(rate * 23) / rate
    x = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 0.4 * t)) + 0.03 * rng.standard_normal(len(t))
    x[rate * 4:rate * 9] = 0.0  # a long silence: the gates must leave it out
    meter = LoudnessMeter(rate)
    at = 0
    while at < len(x):  # pieces of every size, none a multiple of the 100 ms step
        n = int(rng.integers(1, 9000))
        meter.add(x[at:at + n])
        at += n
    assert meter.lufs() == pytest.approx(pyloudnorm.Meter(rate).integrated_loudness(x), abs=1e-6)
    assert LoudnessMeter(rate).lufs() == -math.inf


def test_every_chapter_is_exported_at_the_target_loudness(tmp_path, capsys):
    (tmp_path / "b.txt").write_text(BOOK)
    code = main(["export", str(tmp_path / "b.txt"), "-o", f"{tmp_path / 'book'}/", *FAST, "--no-progress",
                 "--loudness=-21LUFS"])
    err = capsys.readouterr().err
    assert code == 0 and "peak ceiling" not in err, err
    chapters = sorted((tmp_path / "book").glob("*.wav"))
    assert len(chapters) == 5
    for path in chapters:
        with wave.open(str(path)) as w:
            x = np.frombuffer(w.readframes(w.getnframes()), "<i2") / 32767
            rate = w.getframerate()
        assert pyloudnorm.Meter(rate).integrated_loudness(x) == pytest.approx(-21.0, abs=0.05), path.name


def test_a_plain_number_is_taken_as_lufs(tmp_path, capsys):
    (tmp_path / "b.txt").write_text("One sentence. Another one.")
    assert main(["export", str(tmp_path / "b.txt"), "-o", str(tmp_path / "b.wav"), *FAST, "--loudness", "-19"]) == 0


@pytest.mark.parametrize("args,said", [
    (["--loudness=-inf"], "voicectl: --loudness -inf: give an integrated loudness from -50 to -6 LUFS"),
    (["--loudness=-18LUFS", "--normalize-loudness"],
     "voicectl: --loudness and --normalize-loudness exclude each other: one target per book"),
])
def test_a_bad_loudness_is_one_line(tmp_path, capsys, args, said):
    (tmp_path / "b.txt").write_text(BOOK)
    code = main(["export", str(tmp_path / "b.txt"), "-o", str(tmp_path / "b.wav"), *FAST, *args])
    assert code != 0 and capsys.readouterr().err.strip() == said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt"]
