"""engine.export_plan in-process: parts, manifest, resume, concurrency independence, assembly, CUE, loudness."""
import dataclasses
import errno
import json
import os
import platform
import wave

import numpy as np
import pytest

from engine.book import book_sentences, read_book
from engine.config import SamplingOptions
from engine.errors import InputError
from engine.export_plan import (MANIFEST_VERSION, ChapterGain, ExportPlan, ExportSettings, Manifest, ManifestError,
                                Parts, Track, assemble, ceiling_notice, chapter_gains, cue_sheet,
                                render_parts, to_pcm16)
from engine.factory import EngineConfig, build_synthesizer
from engine.pipeline import JoinConfig
from voiceapp.cli.export import export_config

TEXT = "Chapter 1\n\n" + " ".join(f"Line {i} is here." for i in range(6)) + "\n\nChapter 2\n\nLast words. The end."


def make_plan(text=TEXT, seed=3, max_tokens=3000, **settings):
    book = read_book("b.txt", text)
    base = dict(input_sha256="abc", voice="default", voice_fingerprint="f", seed=seed, sampling="s", join="j",
                schedule="w", model_hash="fake", backend="fake", sample_rate=16000)
    return ExportPlan(book, tuple(book_sentences(book, 280)), ExportSettings(**{**base, **settings}),
                      SamplingOptions(seed=seed, max_tokens=max_tokens))


class Interrupted(Exception):
    """Stands for a crash or Ctrl-C in the middle of an export."""


async def render_all(synth, plan, parts, jobs, stop_after=None):
    done = []

    def on_done(index, samples):
        done.append(index)
        if stop_after is not None and len(done) == stop_after:
            raise Interrupted

    todo = [i for i in range(len(plan.sentences)) if i not in parts.finished(len(plan.sentences))]
    await render_parts(synth, plan, parts, todo, jobs, on_done)
    return done


def assembled(parts, plan, path, pause=2880):
    assemble(parts, [Track(path, range(len(plan.sentences)))], 16000, pause)
    return path.read_bytes()


# ---- parts ------------------------------------------------------------------------------------------------

def test_parts_round_trip_and_damage_is_detected(tmp_path):
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    x = np.linspace(-1, 1, 999, dtype=np.float32)
    for i in range(4):
        parts.write(i, x * (i + 1) / 4)
    assert parts.read(2).tobytes() == to_pcm16(x * 3 / 4)  # stored as the WAV will hold it
    assert parts.path(2).stat().st_size == 20 + 2 * 999
    raw = parts.path(1).read_bytes()
    parts.path(1).write_bytes(raw[:-4])  # torn
    parts.path(2).write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))  # bit flip (and another index's file)
    parts.path(3).write_bytes(parts.path(0).read_bytes())  # a part under the wrong name
    assert parts.read(1) is None and parts.read(2) is None and parts.read(3) is None
    assert parts.finished(5) == {0} and sorted(p.name for p in parts.dir.iterdir()) == ["000000.part"]


# ---- resume -----------------------------------------------------------------------------------------------

async def test_interrupted_then_resumed_render_is_byte_identical_and_skips_finished_sentences(tmp_path):
    plan = make_plan()
    synth = build_synthesizer(EngineConfig(backend="fake"))
    clean = Parts(tmp_path / "clean")
    clean.dir.mkdir()
    await render_all(synth, plan, clean, jobs=3)
    want = assembled(clean, plan, tmp_path / "clean.wav")

    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    with pytest.raises(Interrupted):
        await render_all(synth, plan, parts, jobs=2, stop_after=4)
    finished = parts.finished(len(plan.sentences))
    assert 4 <= len(finished) < len(plan.sentences)
    synth.generator.started.clear()
    resumed = await render_all(synth, plan, parts, jobs=5)
    assert sorted(resumed) == sorted(set(range(len(plan.sentences))) - finished)
    rendered = {int(rid.split("-")[1]) for rid in synth.generator.started if rid.startswith("export-")}
    assert rendered == set(range(len(plan.sentences))) - finished, "a finished sentence was rendered again"
    assert assembled(parts, plan, tmp_path / "resumed.wav") == want


async def test_output_does_not_depend_on_jobs(tmp_path):
    plan = make_plan()
    synth = build_synthesizer(EngineConfig(backend="fake"))
    outs = []
    for jobs in (1, 4, 16):
        parts = Parts(tmp_path / f"p{jobs}")
        parts.dir.mkdir()
        await render_all(synth, plan, parts, jobs)
        outs.append(assembled(parts, plan, tmp_path / f"{jobs}.wav"))
    assert outs[0] == outs[1] == outs[2]


async def test_tiny_checkpoint_resume_and_jobs_are_byte_identical(tiny_model, tmp_path):
    """The real model path (torch generator + BiCodec) on export's engine."""
    plan = make_plan("One short line. Two more words here. Third sentence now. And a fourth.", max_tokens=40)
    synth = build_synthesizer(export_config(EngineConfig(model=str(tiny_model), backend="torch", threads=2,
                                                         cache_dir=str(tmp_path / "cache"))))
    one = Parts(tmp_path / "one")
    one.dir.mkdir()
    await render_all(synth, plan, one, jobs=1)
    many = Parts(tmp_path / "many")
    many.dir.mkdir()
    with pytest.raises(Interrupted):
        await render_all(synth, plan, many, jobs=3, stop_after=2)
    await render_all(synth, plan, many, jobs=3)
    await synth.close()
    assert assembled(one, plan, tmp_path / "a.wav") == assembled(many, plan, tmp_path / "b.wav")


async def test_export_decodes_each_sentence_whole(tiny_model, tmp_path):
    """On export's engine a sentence is one decoder pass: its audio is the one-shot decode of its codes (edge fades
    aside), not crossfaded streaming windows; and one window per decoder call."""
    from engine.backends.base import DecodeItem
    from engine.crossfade import fade_edges
    from engine.events import ChunkDecoded
    from engine.windowing import WindowSchedule

    events = []
    synth = build_synthesizer(export_config(EngineConfig(model=str(tiny_model), backend="torch", threads=2,
                                                         cache_dir=str(tmp_path / "cache"))), events=events.append)
    assert synth.schedule == WindowSchedule.whole() and synth.batcher.max_batch == 1
    recorded = []
    stream = synth.generator.stream

    async def recording(prompt, opts, request_id):
        async for delta in stream(prompt, opts, request_id):
            recorded.extend(delta)
            yield delta

    synth.generator.stream = recording
    plan = make_plan("A single sentence for the decoder.", max_tokens=120)
    audio = await synth.render(plan.request(0))
    await synth.close()
    assert len([e for e in events if isinstance(e, ChunkDecoded)]) == 1
    codes = [i for i in map(synth.grammar.token_ids.semantic_index, recorded) if i is not None]
    assert len(codes) == 120 and len(audio) == 120 * synth.decoder.samples_per_code
    globals_ = await synth.voice_globals("default")
    (whole,) = synth.decoder.decode([DecodeItem(tuple(codes), globals_)])
    fade = int(synth.join.fade_s * synth.sample_rate)
    np.testing.assert_allclose(audio, fade_edges(whole, fade, fade), atol=1e-5)


# ---- manifest ---------------------------------------------------------------------------------------------

def test_manifest_round_trip_and_settings_checks(tmp_path):
    plan = make_plan()
    manifest = Manifest(tmp_path / "o.wav.manifest.json", Parts(tmp_path / "o.wav.parts"))
    manifest.save(plan, {0, 2}, ["o.wav"])
    data = manifest.load()
    assert data["done"] == [0, 2] and data["sentences"] == len(plan.sentences)
    assert data["settings"]["seed"] == 3 and data["chapters"] == [{"title": "Chapter 1", "first": 0},
                                                                  {"title": "Chapter 2", "first": 7}]
    keys = tuple(f.name for f in dataclasses.fields(ExportSettings))
    manifest.check(data, plan, keys)
    with pytest.raises(ManifestError, match="seed was 3, now 4"):
        manifest.check(data, make_plan(seed=4), keys)
    with pytest.raises(ManifestError, match="voice was 'default', now 'leo'"):
        manifest.check(data, make_plan(voice="leo"), keys)
    with pytest.raises(ManifestError, match="model hash was 'fake', now 'x'"):
        manifest.check(data, make_plan(model_hash="x"), keys)
    with pytest.raises(ManifestError, match="the input file changed"):
        manifest.check(data, make_plan(input_sha256="def"), keys)
    manifest.check(data, make_plan(model_hash="x"), ("seed",))  # only the keys asked for


def test_a_manifest_from_another_platform_is_not_resumed(tmp_path):
    """Bytes depend on the device and its software: parts from elsewhere are never mixed with parts from here."""
    manifest = Manifest(tmp_path / "o.wav.manifest.json", Parts(tmp_path / "o.wav.parts"))
    manifest.save(make_plan(platform="cuda NVIDIA H200 sm90, torch 2.11.0"), {0}, ["o.wav"])
    data = manifest.load()
    with pytest.raises(ManifestError, match=r"rendered on 'cuda NVIDIA H200 sm90, torch 2.11.0', this is 'cuda "
                                            r"NVIDIA H100 sm90, torch 2.11.0'.*--restart"):
        manifest.check(data, make_plan(platform="cuda NVIDIA H100 sm90, torch 2.11.0"), ExportSettings.ENGINE_KEYS)


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_cpu_platform_names_the_threads_the_int8_llm_and_torch(tiny_model, tmp_path, quantize):
    import onnxruntime
    import torch

    from engine.cpu_pools import cpu_decodes_bf16
    from engine.platform_info import describe_platform

    synth = build_synthesizer(EngineConfig(model=str(tiny_model), backend="torch", threads=2, deterministic=True,
                                           cache_dir=str(tmp_path / "cache"), quantize=quantize))
    llm = f"LLM int8 weights through onnxruntime {onnxruntime.__version__}, " if quantize == "int8" else ""
    decoder = "decoder bfloat16, " if quantize == "int8" and cpu_decodes_bf16() else ""  # fp32 is left unsaid
    assert describe_platform(synth) == (f"cpu {platform.machine()} {torch.backends.cpu.get_cpu_capability()}, "
                                        f"2 threads, {decoder}{llm}torch {torch.__version__}")


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": "other"}', ""])
def test_corrupt_manifest_is_a_clear_error(tmp_path, content):
    manifest = Manifest(tmp_path / "o.wav.manifest.json", Parts(tmp_path / "o.wav.parts"))
    manifest.path.write_text(content)
    with pytest.raises(ManifestError) as err:
        manifest.load()
    assert "corrupt" in str(err.value) and "pass --restart to discard it" in str(err.value)
    assert isinstance(err.value, InputError)


@pytest.mark.parametrize("version", [1, MANIFEST_VERSION - 1, 99, str(MANIFEST_VERSION), None])
def test_a_manifest_of_another_version_names_both_versions(tmp_path, version):
    manifest = Manifest(tmp_path / "o.wav.manifest.json", Parts(tmp_path / "o.wav.parts"))
    manifest.path.write_text(json.dumps({"format": "voiceapp-export", "version": version}))
    with pytest.raises(ManifestError) as err:
        manifest.load()
    assert str(err.value) == (f"{manifest.path} was written by another version of voicectl (manifest version "
                              f"{version!r}; this one reads version {MANIFEST_VERSION}), so its finished sentences "
                              f"cannot be resumed; pass --restart to discard it and start over")


@pytest.mark.parametrize("field,value,why", [
    ("done", 5, "'done' is missing or of the wrong type (expected list)"),
    ("done", ["0"], "'done' is not a list of sentence numbers"),
    ("done", [True], "'done' is not a list of sentence numbers"),
    ("done", [10], "'done' is not a list of sentence numbers below 10"),
    ("done", [-1], "'done' is not a list of sentence numbers below 10"),
    ("sentences", "12", "'sentences' is missing or of the wrong type (expected int)"),
    ("sentences", True, "'sentences' is missing or of the wrong type (expected int)"),
    ("settings", [], "'settings' is missing or of the wrong type (expected dict)"),
    ("settings", {"seed": 3}, "setting 'input_sha256' is missing or of the wrong type (expected str)"),
    ("outputs", "o.wav", "'outputs' is missing or of the wrong type (expected list)"),
    ("outputs", [1], "'outputs' is not a list of file names"),
    ("parts", None, "'parts' is missing or of the wrong type (expected str)"),
    ("chapters", [{"title": "x"}], "'chapters' is not a list of titles and first sentences"),
    ("chapters", [{"title": "x", "first": 10}], "'chapters' is not a list of titles and first sentences"),
])
def test_manifest_fields_of_the_wrong_type_are_corrupt(tmp_path, field, value, why):
    plan = make_plan()
    manifest = Manifest(tmp_path / "o.wav.manifest.json", Parts(tmp_path / "o.wav.parts"))
    manifest.save(plan, {0, 2}, ["o.wav"])
    data = json.loads(manifest.path.read_text())
    assert len(plan.sentences) == 10 and data[field] != value
    manifest.path.write_text(json.dumps({**data, field: value}))
    with pytest.raises(ManifestError) as err:
        manifest.load()
    assert str(err.value).startswith(f"{manifest.path} is corrupt ({why}") and "--restart" in str(err.value)



def test_manifest_save_is_atomic_and_throttled(tmp_path):
    plan = make_plan()
    manifest = Manifest(tmp_path / "m.json", Parts(tmp_path / "p"))
    manifest.save(plan, {0}, [])
    manifest.save(plan, {0, 1}, [], force=False)  # within SAVE_EVERY_S: skipped
    assert json.loads(manifest.path.read_text())["done"] == [0]
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]



def test_a_failed_manifest_save_keeps_the_last_one_and_leaves_no_temp_file(tmp_path, monkeypatch):
    plan = make_plan()
    manifest = Manifest(tmp_path / "m.json", Parts(tmp_path / "p"))
    manifest.save(plan, {0}, [])
    before = manifest.path.read_bytes()
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        manifest.save(plan, {0, 1}, [])
    assert manifest.path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.json"]


def full_disk(*_args):
    raise OSError(errno.ENOSPC, "No space left on device")


# ---- assembly, CUE, loudness ------------------------------------------------------------------------------

def test_assembly_puts_the_streaming_pause_between_sentences_and_splits_chapters(tmp_path):
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    pieces = [np.full(100 * (i + 1), 0.1 * (i + 1), np.float32) for i in range(3)]
    for i, x in enumerate(pieces):
        parts.write(i, x)
    pause = int(JoinConfig().pause_s * 16000)
    offsets, total = assemble(parts, [Track(tmp_path / "all.wav", range(3))], 16000, pause)
    with wave.open(str(tmp_path / "all.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        pcm = w.readframes(w.getnframes())
    want = to_pcm16(pieces[0]) + bytes(2 * pause) + to_pcm16(pieces[1]) + bytes(2 * pause) + to_pcm16(pieces[2])
    assert pcm == want and offsets == [[0, 100 + pause, 300 + 2 * pause]] and total == 600 + 2 * pause
    offsets, _ = assemble(parts, [Track(tmp_path / "a.wav", range(0, 1)), Track(tmp_path / "b.wav", range(1, 3))],
                          16000, pause)
    assert offsets == [[0], [0, 200 + pause]]  # no pause at the start of a chapter file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "all.wav", "b.wav", "p"]


def test_disk_full_while_assembling_leaves_only_complete_wavs(tmp_path, monkeypatch):
    """The chapter written before the disk filled is whole; the one being written keeps its earlier WAV; no partial
    file stays; the parts are all kept."""
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    for i in range(3):
        parts.write(i, np.full(100, 0.1, np.float32))
    (tmp_path / "b.wav").write_bytes(b"an earlier export's b.wav")
    write, calls = wave.Wave_write.writeframes, []

    def fills_up_in_b(self, data):  # a.wav takes one call (sentence 0); b.wav's first fails
        calls.append(len(data))
        if len(calls) > 1:
            full_disk()
        write(self, data)

    monkeypatch.setattr(wave.Wave_write, "writeframes", fills_up_in_b)
    with pytest.raises(OSError):
        assemble(parts, [Track(tmp_path / "a.wav", range(0, 1)), Track(tmp_path / "b.wav", range(1, 3))], 16000, 10)
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert w.readframes(w.getnframes()) == to_pcm16(np.full(100, 0.1, np.float32))
    assert (tmp_path / "b.wav").read_bytes() == b"an earlier export's b.wav"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "b.wav", "p"] and parts.finished(3) == {0, 1, 2}


def test_cue_sheet():
    cue = cue_sheet('My "Book"', "book.wav", [("Opening", 0), ("Chapter 2", 16000 * 61 + 8000)], 16000)
    assert cue == ('REM COMMENT "voiceapp export"\nTITLE "My \'Book\'"\nFILE "book.wav" WAVE\n'
                   '  TRACK 01 AUDIO\n    TITLE "Opening"\n    INDEX 01 00:00:00\n'
                   '  TRACK 02 AUDIO\n    TITLE "Chapter 2"\n    INDEX 01 01:01:37\n')


def dbfs(x):
    return 20 * np.log10(np.sqrt(np.mean(np.asarray(x, np.float64) ** 2)))


def test_chapter_gains_bring_each_chapter_to_the_target_within_the_peak_ceiling(tmp_path):
    """A loud and a quiet chapter both end at the target RMS (one gain for the book would leave them 17 dB apart);
    the assembled WAV holds each chapter scaled by its own gain."""
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    t = np.arange(16000) / 16000
    levels = [0.05, 0.2, 0.02]  # chapter 0: sentences 0-1, chapter 1: sentence 2
    for i, level in enumerate(levels):
        parts.write(i, (level * np.sin(2 * np.pi * (220 + 110 * i) * t)).astype(np.float32))
    chapters = [range(0, 2), range(2, 3)]
    gains = chapter_gains(parts, chapters, -20.0)
    assert gains == chapter_gains(parts, chapters, -20.0)  # deterministic
    assert [g.short_db for g in gains] == [0.0, 0.0]
    for g, r in zip(gains, chapters):
        x = np.concatenate([parts.read(i) for i in r]) / 32767 * g.gain
        assert dbfs(x) == pytest.approx(-20.0, abs=0.01)
    per_sentence = [gains[0].gain, gains[0].gain, gains[1].gain]
    assemble(parts, [Track(tmp_path / "all.wav", range(3))], 16000, 100, per_sentence)
    with wave.open(str(tmp_path / "all.wav")) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64) / 32767
    assert dbfs(pcm[:32100][np.r_[0:16000, 16100:32100]]) == pytest.approx(-20.0, abs=0.01)
    assert dbfs(pcm[32200:]) == pytest.approx(-20.0, abs=0.01)


def test_a_chapter_the_peak_ceiling_holds_back_is_reported(tmp_path):
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    quiet_with_a_click = np.full(16000, 0.01, np.float32)
    quiet_with_a_click[100] = 0.9  # its RMS is far below -6 dBFS, its peak already near full scale
    parts.write(0, quiet_with_a_click)
    parts.write(1, np.full(16000, 0.1, np.float32))
    gains = chapter_gains(parts, [range(0, 1), range(1, 2)], -6.0)
    assert 20 * np.log10(0.9 * gains[0].gain) == pytest.approx(-3.0, abs=0.01)  # held at the ceiling
    assert gains[0].short_db == pytest.approx(-6.0 - dbfs(quiet_with_a_click * gains[0].gain), abs=0.01)
    assert gains[1].short_db == 0.0 and dbfs(np.full(9, 0.1) * gains[1].gain) == pytest.approx(-6.0, abs=0.01)
    notice = ceiling_notice(gains, ["Quiet", "Fine"], -6.0)
    assert notice == (f'--normalize-loudness: the -3 dBFS peak ceiling holds 1 of 2 chapters below -6 dBFS RMS: '
                      f'1 "Quiet" by {gains[0].short_db:.1f} dB')
    assert ceiling_notice([ChapterGain(1.0)] * 2, ["a", "b"], -20.0) is None
    many = ceiling_notice([ChapterGain(0.5, 1.25)] * 5, list("abcde"), -20.0)
    assert many.endswith('2 "b" by 1.2 dB, 3 "c" by 1.2 dB and 2 more') and "\n" not in many
