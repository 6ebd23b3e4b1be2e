"""The TUI's Textual-free parts: metrics folded from events, the bounded history, the sinks."""
from __future__ import annotations

import asyncio

import numpy as np
import soundfile as sf

from engine.backends.base import MonitoredSink
from engine.events import ChunkDecoded, FirstAudio, RequestFinished, RequestStarted
from voiceapp.tui.history import History, Metrics, Status, metrics_record
from voiceapp.tui.sinks import Recorder, SilentSink, WavDirSink


def test_metrics_fold_events_and_exclude_playback_waits():
    m = Metrics(sample_rate=16000)
    m.apply(RequestStarted("r", t=10.0))
    m.apply(FirstAudio("r", 0.12, t=10.12))
    m.apply(ChunkDecoded("r", 0, codes=50, samples=16000, decode_s=0.01, t=10.5))
    assert m.ttfa_s == 0.12 and m.audio_s == 1.0 and m.tokens == 50
    assert m.rtf == 0.5 and m.tokens_per_s == 100                   # live values, from the chunk's time
    m.blocked_s = 1.0                                                # a full player buffer held it for 1 s
    m.apply(RequestFinished("r", audio_s=4.0, wall_s=3.0, rtf=0.75, tokens=200, cancelled=False, t=13.0))
    assert m.finished and m.audio_s == 4.0 and m.rtf == 0.5 and m.tokens_per_s == 100


def test_metrics_record_counts_first_audio_from_the_process_start():
    utt, _ = History().add("hello", "ava")
    utt.metrics.apply(RequestStarted(utt.request_id, t=10.0))
    utt.metrics.apply(FirstAudio(utt.request_id, 0.12, t=10.12))
    utt.status = Status.DONE
    record = metrics_record(utt, process_start=8.0)
    assert record["number"] == 1 and record["status"] == "done" and record["error"] is None
    assert round(record["ttfa_ms"], 6) == 120 and round(record["process_ttfa_ms"], 6) == 2120


def test_metrics_are_empty_until_audio():
    m = Metrics()
    assert m.rtf is None and m.tokens_per_s is None and m.ttfa_s is None


def test_history_bounds_rows_but_never_drops_unfinished_ones():
    history = History(max_entries=3)
    first, _ = history.add("one", "ava")
    for n in range(3):
        _, pruned = history.add(f"more {n}", "ava")
        assert pruned == []                                          # all still queued: nothing may go
    first.status = Status.DONE
    _, pruned = history.add("last", "ava")
    assert pruned == [first] and len(history.entries) == 4           # only finished entries are pruned
    assert [u.number for u in history.entries] == [2, 3, 4, 5]


def test_history_keeps_audio_within_count_and_seconds():
    history = History(max_audio_entries=2, max_audio_s=5.0)
    utts = [history.add(str(n), "ava")[0] for n in range(4)]
    one_s = np.zeros(16000, np.float32)
    assert history.keep_audio(utts[0], one_s) == []
    assert history.keep_audio(utts[1], one_s) == []
    assert history.keep_audio(utts[2], one_s) == [utts[0]]           # count bound
    assert utts[0].audio is None and "no longer kept" in utts[0].audio_note
    assert history.keep_audio(utts[3], np.zeros(4 * 16000, np.float32)) == [utts[1]]   # seconds bound
    assert history.kept_audio_s == 5.0
    too_long = history.add("long", "ava")[0]
    assert history.keep_audio(too_long, np.zeros(6 * 16000, np.float32)) == []
    assert too_long.audio is None and too_long.audio_note.startswith("not kept")


def test_excerpt_is_one_short_line():
    history = History()
    utt, _ = history.add("line one\nline two " + "x" * 100_000, "ava")
    assert utt.excerpt(20) == "line one line two x…" and len(utt.excerpt(20)) == 20
    assert history.add("short", "ava")[0].excerpt(20) == "short"


def test_the_tuis_sinks_report_playback_as_monitored_sinks(tmp_path, sink):
    assert all(isinstance(s, MonitoredSink) for s in (WavDirSink(tmp_path, 16000), SilentSink(16000), sink))
    silent = SilentSink(22050)
    silent.mark_utterance_start()
    assert (silent.device_rate, silent.fill_frames, silent.capacity_frames, silent.underruns) == (22050, 0, 0, 0)
    assert silent.last_onset_perf is None


def test_wav_dir_sink_writes_one_file_per_drain(tmp_path):
    sink = WavDirSink(tmp_path, 16000)
    (tmp_path / "utterance-0001.wav").write_bytes(b"")              # existing files are never overwritten

    async def play():
        await sink.write(np.full(800, 0.25, np.float32))
        await sink.write(np.full(800, 0.25, np.float32))
        await sink.drain()
        await sink.write(np.ones(10, np.float32))
        sink.clear()                                                 # stopped: nothing written
        await sink.drain()

    asyncio.run(play())
    assert [p.name for p in sink.written] == ["utterance-0002.wav"]
    audio, rate = sf.read(str(sink.written[0]), dtype="float32")
    assert rate == 16000 and len(audio) == 1600 and abs(audio.mean() - 0.25) < 1e-3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["utterance-0001.wav", "utterance-0002.wav"]


def test_recorder_copies_up_to_its_limit():
    async def record(limit):
        rec = Recorder(SilentSink(16000), max_samples=limit)
        await rec.write(np.ones(10, np.float32))
        await rec.write(np.ones(10, np.float32))
        await rec.drain()
        return rec

    assert len(asyncio.run(record(20)).audio()) == 20
    assert asyncio.run(record(15)).audio() is None
