"""Atomic WAV writing: complete files only, and float WAVs whose bytes depend only on the audio."""
import time

import numpy as np
import pytest
import soundfile as sf

from engine.types import AudioChunk
from voiceapp.audio.wavout import write_wav


async def chunks(n=3, fail_after=None):
    for i in range(n):
        if fail_after is not None and i == fail_after:
            raise RuntimeError("synthesis broke")
        yield AudioChunk("r", np.full(500, 0.1 * (i + 1), np.float32), 16000, 0, i, i == n - 1)


async def test_float_wav_bytes_do_not_depend_on_the_clock(tmp_path):
    await write_wav(chunks(), tmp_path / "a.wav", 16000, subtype="FLOAT")
    time.sleep(1.1)  # libsndfile's PEAK chunk carries a timestamp in seconds
    await write_wav(chunks(), tmp_path / "b.wav", 16000, subtype="FLOAT")
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    audio, rate = sf.read(tmp_path / "a.wav", dtype="float32")
    assert rate == 16000 and np.array_equal(audio[:500], np.full(500, 0.1, np.float32))


async def test_a_failed_stream_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError):
        await write_wav(chunks(fail_after=2), tmp_path / "o.wav", 16000)
    assert list(tmp_path.iterdir()) == []
