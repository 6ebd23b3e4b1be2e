"""Provides the audiobook files export writes besides WAV: M4B (AAC in MP4), MP3 and Opus, each with its chapters,
title, author, language and cover, encoded by FFmpeg through PyAV.

The audio comes as an iterator of 16-bit PCM pieces (one finished sentence or one pause at a time), so memory stays
flat however long the book. Audio whose parts are all finished is written in one pass (`encode`): its chapter marks
are known before the first sample, from the parts' headers, and MP3 and Opus keep them at the file's start. Audio
still being rendered is encoded as it comes (`encode_packets`, the costly half) into a scratch file of packets,
which `mux` copies into the file once the last part, and with it every mark, is known; the two paths give the
same bytes. The file is written beside its target and renamed over it when complete (engine.atomic.writing), as
the WAV is.
"""
from __future__ import annotations

import base64
import io
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import IO, Iterable, Iterator

import numpy as np

from engine.errors import InputError, OutputError


@dataclass(frozen=True, slots=True)
class Container:
    """How one output suffix is written."""

    format: str
    """FFmpeg's muxer."""
    codec: str
    """FFmpeg's audio encoder."""
    bit_rate: int
    """Bits per second for mono speech."""
    picture_stream: bool
    """The cover goes in as an attached picture stream (MP4, MP3); else as a Vorbis comment (Ogg Opus)."""
    options: dict = field(default_factory=dict)
    """Muxer options."""
    codec_options: dict = field(default_factory=dict)
    """Encoder options."""


CONTAINERS = {
    ".m4b": Container("mp4", "aac", 64_000, True, {"brand": "M4B "}, {"aac_coder": "fast"}),
    ".mp3": Container("mp3", "libmp3lame", 64_000, True),
    ".opus": Container("opus", "libopus", 32_000, False, {"fflags": "+bitexact"}),
}
"""Every suffix export writes through FFmpeg (.wav is written directly). Ogg gets FFmpeg's bitexact flag: without
it each stream's serial number is random, so no two exports of a book to Opus had the same bytes (MP4 and MP3
already have them: no time or random number is written)."""
MAX_COVER_BYTES = 10 * 1024 * 1024
MAX_COVER_SIDE = 4096
"""A cover's largest width or height in pixels (players show a few hundred; stores ask for 1400-3000)."""
COVER_CODECS = {"png": "png", "mjpeg": "jpeg"}
"""FFmpeg's decoders of the image formats every audiobook container holds, and the format's name."""
ISO_639_2 = {"ar": "ara", "cs": "ces", "da": "dan", "de": "deu", "el": "ell", "en": "eng", "es": "spa",
             "fi": "fin", "fr": "fra", "he": "heb", "hi": "hin", "hu": "hun", "it": "ita", "ja": "jpn",
             "ko": "kor", "la": "lat", "nl": "nld", "no": "nor", "pl": "pol", "pt": "por", "ru": "rus",
             "sv": "swe", "tr": "tur", "uk": "ukr", "zh": "zho"}
"""Two-letter language codes to the three-letter ones MP4 stores (a code not listed is left out there)."""


def writable_suffixes() -> list[str]:
    """The output suffixes this machine's FFmpeg can write, .wav first (needs no FFmpeg)."""
    import av

    return [".wav"] + [s for s, c in CONTAINERS.items()
                       if c.format in av.formats_available and c.codec in av.codecs_available]


def check_suffix(path: Path) -> None:
    """OutputError (one line listing what can be written) unless `path`'s suffix is one export writes here."""
    suffix = path.suffix.lower()
    if suffix == ".wav":
        return
    can = writable_suffixes()
    if suffix not in can:
        raise OutputError(f"{path}: cannot write {suffix or 'a file without a suffix'} here; export writes "
                          f"{', '.join(can)}")


@dataclass(frozen=True, slots=True)
class Cover:
    """A checked cover image."""

    data: bytes
    codec: str
    """FFmpeg's name of its format: png or mjpeg."""
    width: int
    height: int


def read_cover(data: bytes, source: str) -> Cover:
    """The image `data` as a Cover; InputError (one line) unless it is a PNG or JPEG of sane size."""
    import av

    if len(data) > MAX_COVER_BYTES:
        raise InputError(f"{source}: the cover is larger than {MAX_COVER_BYTES >> 20} MB")
    try:
        with av.open(io.BytesIO(data), "r") as image:
            stream = image.streams.video[0]
            codec, width, height = stream.codec_context.name, stream.codec_context.width, stream.codec_context.height
    except (av.FFmpegError, IndexError, UnicodeDecodeError, ValueError):
        codec, width, height = "", 0, 0
    if codec not in COVER_CODECS or not width or not height:
        raise InputError(f"{source}: the cover is not a PNG or JPEG image")
    if max(width, height) > MAX_COVER_SIDE:
        raise InputError(f"{source}: the cover is {width}x{height} pixels; at most {MAX_COVER_SIDE} a side")
    return Cover(data, codec, width, height)


@dataclass(frozen=True, slots=True)
class Tags:
    """What a listener's player shows besides the chapters."""

    title: str
    author: str = ""
    album: str = ""
    """The book's title where this file is one chapter of it; else ""."""
    language: str = ""
    """BCP 47, as in the EPUB ("en", "en-GB")."""
    track: int = 0
    """This file's chapter number where it is one chapter of the book; else 0."""
    cover: Cover | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """One chapter inside a file."""

    title: str
    start: int
    """In samples from the file's start."""
    end: int


def encode(file: IO[bytes], path: Path, container: Container, sample_rate: int, pcm: Iterable[bytes],
           marks: list[Mark], tags: Tags) -> None:
    """Write `pcm` (16-bit mono pieces at `sample_rate`) into `file` (a new, seekable file that will become
    `path`) as `container`, with `marks` and `tags`, in one pass: for audio whose chapter marks are known before
    its first sample (every part finished). Any FFmpeg failure becomes one OutputError line."""

    def packets(stream) -> Iterator:
        for frame in _frames(pcm, sample_rate):
            yield from stream.encode(frame)
        yield from stream.encode(None)

    _write(file, path, container, sample_rate, packets, marks, tags)


def encode_packets(scratch: IO[bytes], path: Path, container: Container, sample_rate: int,
                   pcm: Iterable[bytes]) -> None:
    """The first half of `encode` for audio still being rendered (its chapter marks, which MP3 and Opus keep at
    the file's start, are known only at its end): encode `pcm` as `container`'s encoder, configured as `encode`
    configures it, and store the packets in `scratch` (PacketFile). `mux` then writes the file from them; the
    two give `encode`'s bytes. Any FFmpeg failure becomes one OutputError line."""
    import av

    sink = av.open(_Discard(), "w", format=container.format, options=container.options)
    try:
        stream = _audio_stream(sink, container, sample_rate)
        sink.start_encoding()  # opens the encoder exactly as `encode`'s container does
        store = PacketFile(scratch)
        for frame in _frames(pcm, sample_rate):
            store.write_all(stream.encode(frame))
        store.write_all(stream.encode(None))
        store.flush()
    except av.FFmpegError as err:
        raise OutputError(f"cannot encode {path}: {err}") from None
    finally:
        _close_quietly(sink)


def mux(file: IO[bytes], path: Path, container: Container, sample_rate: int, scratch: IO[bytes],
        marks: list[Mark], tags: Tags) -> None:
    """The second half: write the packets `encode_packets` stored in `scratch` into `file` (as `encode` does:
    a new, seekable file that will become `path`) with `marks` and `tags`. A copy, no encoding."""
    _write(file, path, container, sample_rate, lambda stream: PacketFile(scratch).read_all(), marks, tags)


def _write(file: IO[bytes], path: Path, container: Container, sample_rate: int, packets, marks: list[Mark],
           tags: Tags) -> None:
    """Open `container` on `file` with its tags, cover and chapters, then mux `packets(audio stream)`."""
    import av

    guarded = _FirstErrorOnly(file)
    try:
        out = av.open(guarded, "w", format=container.format, options=container.options)
    except av.FFmpegError as err:
        raise OutputError(f"cannot write {path}: {err}") from None
    try:
        stream = _audio_stream(out, container, sample_rate)
        _tag(out, stream, container, tags)
        cover, picture = tags.cover if container.picture_stream else None, None
        if cover is not None:
            picture = out.add_mux_stream(cover.codec, width=cover.width, height=cover.height)
            picture.disposition = av.stream.Disposition.attached_pic
        if marks and container.format == "opus":
            _comment_chapters(out, marks, sample_rate)
        elif marks:
            out.set_chapters([{"id": n, "start": m.start, "end": m.end, "time_base": Fraction(1, sample_rate),
                               "metadata": {"title": m.title}} for n, m in enumerate(marks, 1)])
        out.start_encoding()
        if cover is not None and picture is not None:
            packet = av.Packet(cover.data)
            packet.stream, packet.pts, packet.dts = picture, 0, 0
            out.mux(packet)
        for packet in packets(stream):
            packet.stream = stream
            out.mux(packet)
        out.close()  # writes the trailer: its failure is this file's too
    except av.FFmpegError as err:
        _close_quietly(out)
        guarded.raise_error()  # the disk's own error, where FFmpeg's is only its echo
        raise OutputError(f"cannot encode {path}: {err}") from None
    except BaseException:
        _close_quietly(out)
        raise
    guarded.raise_error()


def _audio_stream(out, container: Container, sample_rate: int):
    """`container`'s audio stream on `out`: mono, its encoder, rate and bit rate. The encoder's packets and the
    stream's codec parameters (priming, extradata) follow from this alone, so `encode_packets` and `mux`, each
    calling it on a container of their own, agree with `encode`."""
    stream = out.add_stream(container.codec, rate=_encoder_rate(container.codec, sample_rate),
                            options=container.codec_options)
    stream.layout = "mono"
    stream.bit_rate = container.bit_rate
    return stream


def _frames(pcm: Iterable[bytes], sample_rate: int) -> Iterator:
    """16-bit mono pieces as PyAV frames, timed from 0 (empty pieces skipped; the encoder makes its own frame
    sizes)."""
    import av

    pts = 0
    for piece in pcm:
        samples = np.frombuffer(piece, "<i2")
        if not len(samples):
            continue
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = sample_rate, pts, Fraction(1, sample_rate)
        pts += len(samples)
        yield frame


class PacketFile:
    """Encoded packets stored in a file, one record each: what `mux` needs to write them again as the encoder gave
    them (timestamps, key frame flag, and side data: the encoder's priming and padding that MP3's LAME header and
    Ogg's last granule are written from). Memory stays flat: records are written and read one at a time."""

    RECORD = struct.Struct("<qqqiiBB")
    """pts, dts, duration, time base numerator and denominator, key frame, side data count; then the size."""
    SIZE = struct.Struct("<I")
    SIDE = struct.Struct("<BI")
    """A side data entry: its FFmpeg type and size, then its bytes."""
    NONE = -(1 << 63)
    """AV_NOPTS_VALUE: a timestamp the encoder left unset."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file

    def write_all(self, packets: Iterable) -> None:
        from av.packet import packet_sidedata_type_from_literal

        for packet in packets:
            side = list(packet.iter_sidedata())
            tb = packet.time_base
            self.file.write(self.RECORD.pack(self._ts(packet.pts), self._ts(packet.dts), packet.duration or 0,
                                             tb.numerator, tb.denominator, packet.is_keyframe, len(side)))
            self.file.write(self.SIZE.pack(packet.size))
            self.file.write(bytes(packet))
            for data in side:
                self.file.write(self.SIDE.pack(packet_sidedata_type_from_literal(data.data_type), data.data_size))
                self.file.write(bytes(data))

    def flush(self) -> None:
        self.file.flush()

    def read_all(self) -> Iterator:
        """The stored packets, in order."""
        import av
        from av.packet import PacketSideData

        self.file.seek(0)
        while head := self.file.read(self.RECORD.size):
            pts, dts, duration, num, den, key, sides = self.RECORD.unpack(head)
            (size,) = self.SIZE.unpack(self.file.read(self.SIZE.size))
            packet = av.Packet(self.file.read(size))
            packet.time_base = Fraction(num, den)
            packet.pts = None if pts == self.NONE else pts
            packet.dts = None if dts == self.NONE else dts
            packet.duration, packet.is_keyframe = duration, bool(key)
            for _ in range(sides):
                kind, length = self.SIDE.unpack(self.file.read(self.SIDE.size))
                data = PacketSideData(kind, length)  # type: ignore[call-arg]  # PyAV's stub omits the (type, size) constructor
                memoryview(data)[:] = self.file.read(length)
                packet.set_sidedata(data, move=True)
            yield packet

    def _ts(self, value: int | None) -> int:
        return self.NONE if value is None else value


class _Discard:
    """A seekable file that keeps nothing: where `encode_packets`'s container (never given a packet) writes its
    header (MP4 wants a seekable file)."""

    def __init__(self) -> None:
        self._pos = self._end = 0

    def write(self, data) -> int:
        self._pos += len(data)
        self._end = max(self._end, self._pos)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset if whence == 1 else self._end + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True


def _close_quietly(out) -> None:
    """Close `out` after a failure, which is already on its way: FFmpeg's report of the same failure from the
    trailer (a write error stays set on its output) is dropped, not raised over it."""
    import av

    try:
        out.close()
    except av.FFmpegError:
        pass


class _FirstErrorOnly:
    """The file PyAV writes through: the first OSError of a write or seek (ENOSPC, EIO) is raised to PyAV and kept;
    every later write and seek does nothing. Without it, closing the container after a full disk (MP3 and Opus
    seek back to finish their headers) fails again inside FFmpeg's callbacks, and PyAV prints the exception it
    drops (a traceback on stderr) where one `voicectl:` line belongs. The file is deleted anyway once a write
    failed, so nothing after the first failure needs to reach it; `raise_error` gives the caller the kept error,
    where FFmpeg reports only its own echo of it."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._error: OSError | None = None
        self._pos = 0

    def write(self, data) -> int:
        """Write `data`; after a failure, pretend to."""
        if self._error is None:
            try:
                self._file.write(data)
            except OSError as err:
                self._error = err
                raise
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        """Seek; after a failure, only follow the position FFmpeg asks for."""
        if self._error is None:
            try:
                self._pos = self._file.seek(offset, whence)
            except OSError as err:
                self._error = err
                raise
        elif whence == 0:
            self._pos = offset
        elif whence == 1:
            self._pos += offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def raise_error(self) -> None:
        """The first write or seek that failed, raised again; nothing if none did."""
        if self._error is not None:
            raise self._error


def _comment_chapters(out, marks: list[Mark], sample_rate: int) -> None:
    """Chapters as the Vorbis comments Ogg players read (CHAPTER001=HH:MM:SS.mmm, CHAPTER001NAME=title), written
    here: FFmpeg's own writer rounds the seconds to the nearest (17.9 s becomes 00:00:18.900)."""
    for n, mark in enumerate(marks, 1):
        ms = mark.start * 1000 // sample_rate
        s, ms = divmod(ms, 1000)
        m, s = divmod(s, 60)
        h, m = divmod(m, 60)
        out.metadata[f"CHAPTER{n:03d}"] = f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"
        out.metadata[f"CHAPTER{n:03d}NAME"] = mark.title


def _encoder_rate(codec: str, sample_rate: int) -> int:
    """`sample_rate` where the encoder takes it, else the next rate it takes (PyAV resamples on the way in)."""
    import av

    rates = sorted(av.Codec(codec, "w").audio_rates or ())
    if not rates or sample_rate in rates:
        return sample_rate
    return next((r for r in rates if r > sample_rate), rates[-1])


def _tag(out, stream, container: Container, tags: Tags) -> None:
    """Title, author, album, language, track and (Ogg) cover, in the keys FFmpeg maps to each format's tags."""
    fields = {"title": tags.title, "artist": tags.author, "album_artist": tags.author,
              "album": tags.album or tags.title, "genre": "Audiobook", "language": tags.language,
              "track": str(tags.track) if tags.track else ""}
    for key, value in fields.items():
        if value:
            out.metadata[key] = value
    language = ISO_639_2.get(tags.language.split("-")[0].lower(), "")
    if container.format == "mp4" and language:
        stream.metadata["language"] = language  # MP4 keeps a language per track, in ISO 639-2
    if tags.cover is not None and not container.picture_stream:
        out.metadata["METADATA_BLOCK_PICTURE"] = flac_picture(tags.cover)


def flac_picture(cover: Cover) -> str:
    """The cover as a FLAC picture block in base64: how Vorbis comments (Ogg Opus) carry a front cover."""
    mime = f"image/{COVER_CODECS[cover.codec]}".encode()
    block = (struct.pack(">II", 3, len(mime)) + mime + struct.pack(">I", 0)
             + struct.pack(">IIIII", cover.width, cover.height, 24, 0, len(cover.data)) + cover.data)
    return base64.b64encode(block).decode()
