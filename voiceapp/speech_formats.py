"""Provides streamed encoders for the speech API's response formats: float32 chunks in, bytes out as soon as the
codec gives them, and never a seek back (what went to the client is gone).

  wav   16-bit PCM behind a header whose sizes say "unknown" (0xFFFFFFFF), as streamed WAVs do
  pcm   raw 16-bit little-endian samples, no header
  flac  16-bit FLAC, level 0 (1152-sample blocks, so a block waits for little audio); STREAMINFO has no length
  mp3   constant-bitrate MP3 (libsndfile >= 1.1 with LAME); it starts with LAME's info frame left empty
  opus  Ogg Opus (libsndfile >= 1.0.29), a page at least every OGG_PAGE_MS

Every format gets the same 16-bit integers, round(x * 32767) of the engine's float samples clipped to [-1, 1]
(`pcm16`), so the lossless ones carry exactly what a client can compute from `voicectl say --out`. Where the
output rate is not the engine's, a streaming soxr resampler runs first. libsndfile writes into a `_Tail`, a file
that keeps only what is not yet sent: the codecs that seek back at the end to fill in a length (FLAC's STREAMINFO,
MP3's info frame) write over bytes already gone, and those writes are dropped.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OGG_PAGE_MS = 50.0
"""Longest an Ogg page holds Opus audio back (libsndfile's default, about a second, is too late to stream)."""
MP3_COMPRESSION = 96 / 152
"""libsndfile's compression level for 64 kbit/s constant-rate MP3 at 16 and 24 kHz (its MPEG-2 bitrates run from
160 kbit/s at 0 down to 8 at 1); 8 and 12 kHz get 28, 48 kHz 138 (LAME takes the nearest rate it has)."""
SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302
"""libsndfile's command (sndfile.h, since 1.1.0) for the page latency; soundfile does not wrap it."""


@dataclass(frozen=True, slots=True)
class Format:
    """How a response format is written."""

    media_type: str
    major: str
    """libsndfile's container (soundfile's `format`)."""
    subtype: str
    options: dict[str, Any] = field(default_factory=dict)
    """soundfile.SoundFile keywords (compression, bitrate mode)."""


FORMATS = {
    "wav": Format("audio/wav", "RAW", "PCM_16"),  # the header is ours
    "pcm": Format("audio/pcm", "RAW", "PCM_16"),
    "flac": Format("audio/flac", "FLAC", "PCM_16", {"compression_level": 0.0}),
    "mp3": Format("audio/mpeg", "MP3", "MPEG_LAYER_III", {"compression_level": MP3_COMPRESSION,
                                                          "bitrate_mode": "CONSTANT"}),
    "opus": Format("audio/ogg", "OGG", "OPUS"),
}
"""response_format -> how to write it, in the order the API lists them."""


def supported_formats() -> tuple[str, ...]:
    """The response formats the installed libsndfile can write (MP3 needs 1.1 or later, built with LAME)."""
    import soundfile as sf

    def ok(spec: Format) -> bool:
        try:
            return bool(sf.check_format(spec.major, spec.subtype))
        except ValueError:  # a name this soundfile does not know
            return False

    return tuple(name for name, spec in FORMATS.items() if ok(spec))


def pcm16(samples: np.ndarray) -> np.ndarray:
    """float samples -> 16-bit integers: round(x * 32767), x clipped to [-1, 1] (computed in float64)."""
    return np.rint(np.clip(np.asarray(samples, np.float64), -1.0, 1.0) * 32767.0).astype(np.int16)


def wav_header(rate: int) -> bytes:
    """The header of a 16-bit mono WAV of unknown length: the RIFF and data sizes are 0xFFFFFFFF."""
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 0xFFFFFFFF, b"WAVE", b"fmt ", 16, 1, 1, rate, 2 * rate, 2, 16,
                       b"data", 0xFFFFFFFF)


class StreamEncoder:
    """One response's encoder: `encode` each chunk and send what it returns (b"" while a codec fills a block),
    then send `finish()`. `close()` drops an unfinished one."""

    def __init__(self, fmt: str, in_rate: int, out_rate: int) -> None:
        import soundfile as sf

        spec = FORMATS[fmt]
        self._tail = _Tail()
        self._file = sf.SoundFile(self._tail, "w", samplerate=out_rate, channels=1, format=spec.major,
                                  subtype=spec.subtype, **spec.options)
        if spec.major == "OGG":
            _set_page_latency(self._file, OGG_PAGE_MS)
        self._head = wav_header(out_rate) if fmt == "wav" else b""
        self._resampler = None
        if in_rate != out_rate:
            import soxr

            self._resampler = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def encode(self, samples: np.ndarray) -> bytes:
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(np.asarray(samples, np.float32))
        if len(samples):
            self._file.write(pcm16(samples))
        return self._take()

    def finish(self) -> bytes:
        """The rest: what the resampler and the codec still hold, and the codec's trailer."""
        if self._resampler is not None:
            self._file.write(pcm16(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)))
        self._file.close()
        return self._take()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def _take(self) -> bytes:
        head, self._head = self._head, b""
        return head + self._tail.take()


def _set_page_latency(f: Any, ms: float) -> None:
    """Through soundfile's own handles to libsndfile (private: where they are missing, pages keep the default)."""
    import soundfile as sf

    snd, ffi = getattr(sf, "_snd", None), getattr(sf, "_ffi", None)
    if snd is not None and ffi is not None and hasattr(f, "_file"):
        snd.sf_command(f._file, SFC_SET_OGG_PAGE_LATENCY_MS, ffi.new("double*", ms), ffi.sizeof("double"))


class _Tail:
    """A write-only file for libsndfile that hands out what was written (`take`) and keeps none of it: writes at
    or past what was taken land; the parts of a write over bytes already taken are dropped."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._taken = 0
        self._pos = 0

    def write(self, data: Any) -> int:
        data = bytes(data)
        end = self._pos + len(data)
        size = self._taken + len(self._pending)
        if end > size:
            self._pending.extend(bytes(end - size))
        start = max(self._pos, self._taken)
        if start < end:
            self._pending[start - self._taken:end - self._taken] = data[start - self._pos:]
        self._pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._taken + len(self._pending))[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        return b""  # libsndfile does not read a file it writes; an answer all the same

    def take(self) -> bytes:
        out = bytes(self._pending)
        self._taken += len(out)
        self._pending.clear()
        return out
