"""Issue 38: M4B, MP3 and Opus are encoded beside the rendering (engine.export_plan.FollowingAssembly, run in a
child process by engine.assembly_process). The encode that follows the parts as they finish gives the same bytes
as the one-pass encode of parts that were all there; the follower reads parts in book order whatever order they
finish in, and only once finished; a stop, a failure and a killed or interrupted parent each leave no file that
looks complete and no scratch; the export's summary reports the encode's time and its tail."""
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InputError
from engine.export_plan import Assembled, FollowingAssembly, LoudnessTarget, Parts, Track
from tests.cli_helpers import voicectl
from tests.export.test_cli_export_book import BOOK, FAKE, FAST, ok, start_export
from tests.export.test_export_plan import make_plan

RATE = 16000
PAUSE = 2880


def write_parts(parts: Parts, count: int) -> None:
    """`count` sentences of distinct real-looking audio (a tone, some noise), each of its own length."""
    rng = np.random.default_rng(7)
    for i in range(count):
        n = 3000 + 997 * i
        t = np.arange(n) / RATE
        parts.write(i, (0.3 * np.sin(2 * np.pi * (180 + 20 * i) * t) + 0.02 * rng.standard_normal(n))
                    .astype(np.float32))


class Recording:
    """A TrackWriter that wraps the real container writer and records which path each track took."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def write(self, track, file, pcm, starts, length):
        self.calls.append("write")
        self.inner.write(track, file, pcm, starts, length)

    def encode(self, track, pcm, scratch):
        self.calls.append("encode")
        self.inner.encode(track, pcm, scratch)

    def finish(self, track, scratch, file, starts, length):
        self.calls.append("finish")
        self.inner.finish(track, scratch, file, starts, length)


def container_writer(plan, out: Path):
    from voiceapp.cli.export import ContainerWriter, Layout
    from voiceapp.audio.containers import Tags

    return Recording(ContainerWriter(plan, Layout(out, False, False), Tags("Book", author="A. Writer"), RATE))


def follow(parts, plan, out, finished, order=None, delay_s=0.0):
    """Assemble `out` with FollowingAssembly: parts in `finished` are there from the start, the others are
    announced from another thread in `order` (`delay_s` apart), as the renderer announces them."""
    writer = container_writer(plan, out)
    n = len(plan.sentences)
    assembly = FollowingAssembly(parts, [Track(out, range(n))], PAUSE, writer, set(finished), plan.chapter_ranges())
    assembly.start()
    for i in order or []:
        time.sleep(delay_s)
        assembly.finished(i)
    result = assembly.join()
    return out.read_bytes(), writer.calls, result


@pytest.mark.parametrize("suffix", [".m4b", ".mp3", ".opus"])
def test_the_encode_beside_rendering_has_the_bytes_of_the_one_pass_encode(tmp_path, suffix):
    """The same parts, encoded as they are announced (in reverse, the worst order: nothing can be encoded until
    the last announcement) and in one pass once all are there: byte-identical files, through each path."""
    plan = make_plan()
    n = len(plan.sentences)
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    write_parts(parts, n)
    along, along_calls, along_result = follow(parts, plan, tmp_path / f"along{suffix}", set(),
                                              order=list(range(n))[::-1], delay_s=0.002)
    in_order, order_calls, _ = follow(parts, plan, tmp_path / f"order{suffix}", {0, 1}, order=range(2, n))
    whole, whole_calls, whole_result = follow(parts, plan, tmp_path / f"whole{suffix}", set(range(n)))
    assert along_calls == order_calls == ["encode", "finish"] and whole_calls == ["write"]
    assert along == in_order == whole and len(whole) > 1000
    assert along_result.offsets == whole_result.offsets and along_result.total == whole_result.total
    assert sorted(os.listdir(parts.dir)) == [f"{i:06d}.part" for i in range(n)]  # the scratch is gone


def test_parts_are_read_in_book_order_and_only_once_finished(tmp_path):
    """A fake writer (pure logic): part k is read only after it was announced, in book order, whatever order the
    announcements come in; with a loudness target a chapter is read only once all of it is there."""
    plan = make_plan()
    n = len(plan.sentences)
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    write_parts(parts, n)
    announced: list[int] = []
    read: list[tuple[int, frozenset]] = []
    original = parts.read

    def reading(index):
        read.append((index, frozenset(announced)))
        return original(index)

    parts.read = reading

    class Sink:
        def encode(self, track, pcm, scratch):
            for piece in pcm:
                scratch.write(piece)

        def finish(self, track, scratch, file, starts, length):
            scratch.seek(0)
            file.write(scratch.read())

    out = tmp_path / "out.raw"
    chapters = plan.chapter_ranges()
    assembly = FollowingAssembly(parts, [Track(out, range(n))], PAUSE, Sink(), set(), chapters,
                                 LoudnessTarget(-20.0, lufs=False), RATE)
    assembly.start()
    for i in [3, 1, 0, 2, *range(n - 1, 3, -1)]:
        time.sleep(0.002)
        announced.append(i)
        assembly.finished(i)
    result = assembly.join()
    order = [i for i, _ in read]
    assert order == [i for r in chapters for i in (*r, *r)]  # each chapter measured for its gain, then encoded
    for index, seen in read:
        chapter = next(r for r in chapters if index in r)
        assert set(chapter) <= seen, (index, sorted(seen))
    assert len(result.gains) == len(chapters) and out.stat().st_size == 2 * result.total


def test_stop_while_waiting_leaves_no_file_and_no_scratch(tmp_path):
    plan = make_plan()
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    write_parts(parts, 3)
    out = tmp_path / "out.m4b"
    assembly = FollowingAssembly(parts, [Track(out, range(len(plan.sentences)))], PAUSE,
                                 container_writer(plan, out), {0, 1, 2}, plan.chapter_ranges())
    assembly.start()
    deadline = time.monotonic() + 10
    while not list(parts.dir.glob("*.encoding")) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert list(parts.dir.glob("*.encoding")), "the follower never started encoding"
    assembly.stop()
    assert sorted(os.listdir(tmp_path)) == ["p"] and sorted(os.listdir(parts.dir)) == [f"{i:06d}.part"
                                                                                       for i in range(3)]
    with pytest.raises(InputError, match="stopped"):
        assembly.join()


def test_a_failure_in_the_child_process_is_raised_in_the_parent(tmp_path):
    """A corrupt part met by the encoder in the child process: its InputError (one line, what to do) reaches
    the parent's check() and join(), the child exits, and nothing is left but the parts."""
    from engine.assembly_process import AssemblyProcess

    plan = make_plan()
    n = len(plan.sentences)
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    write_parts(parts, n)
    parts.path(2).write_bytes(b"torn")
    out = tmp_path / "out.opus"
    process = AssemblyProcess(parts=parts, tracks=[Track(out, range(n))], pause=PAUSE,
                              writer=container_writer(plan, out).inner, finished=set(), chapters=plan.chapter_ranges())
    process.start()
    for i in range(n):
        process.finished(i)
    with pytest.raises(InputError, match="finished sentence 2 .* is missing or corrupt; rerun with --resume"):
        process.join()
    with pytest.raises(InputError):
        process.check()
    process.stop()
    assert not out.exists() and not list(parts.dir.glob("*.encoding"))


def test_the_child_process_gives_the_bytes_of_the_thread(tmp_path):
    from engine.assembly_process import AssemblyProcess

    plan = make_plan()
    n = len(plan.sentences)
    parts = Parts(tmp_path / "p")
    parts.dir.mkdir()
    write_parts(parts, n)
    want, _, want_result = follow(parts, plan, tmp_path / "thread.mp3", set(), order=range(n))
    out = tmp_path / "child.mp3"
    process = AssemblyProcess(parts=parts, tracks=[Track(out, range(n))], pause=PAUSE,
                              writer=container_writer(plan, out).inner, finished={0}, chapters=plan.chapter_ranges())
    process.start()
    for i in range(1, n):
        process.finished(i)
    result = process.join()
    assert isinstance(result, Assembled) and result.offsets == want_result.offsets
    assert out.read_bytes() == want and result.encode_s > 0 and 0 <= result.after_last_part_s < 30


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"):
            return True  # exited; its zombie waits for a parent that is gone
        time.sleep(0.02)
    return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the child process through /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_killed_or_interrupted_export_leaves_no_encoder_behind(tmp_path, sig):
    """SIGKILL to the export alone, or Ctrl-C to its process group as a terminal sends it, as soon as the encoder
    process exists (a child still importing printed a traceback for Ctrl-C): the encoder leaves, no scratch or temp
    file is left, Ctrl-C says what is kept in one line, and --resume completes the file with the bytes of a clean
    export."""
    src = tmp_path / "book.txt"
    src.write_text(BOOK)
    ok(voicectl("export", str(src), "-o", str(tmp_path / "clean.m4b"), *FAST))
    out = tmp_path / "out.m4b"
    args = ["export", str(src), "-o", str(out), *FAKE, "--jobs", "2"]
    proc = start_export(args, tmp_path / "out.m4b.parts", start_new_session=True)
    deadline = time.monotonic() + 10
    while not (children := _children(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert children, "no encoder process"
    if sig == signal.SIGKILL:
        proc.kill()
    else:
        os.killpg(proc.pid, signal.SIGINT)
    err = proc.stderr.read().decode()
    code = proc.wait(30)
    assert all(_gone(c) for c in children)
    assert code == (-9 if sig == signal.SIGKILL else 130), err
    if sig == signal.SIGINT:
        assert err.strip().startswith("voicectl: interrupted; ") and "rerun with --resume" in err, err
        assert "\n" not in err.strip() and "Traceback" not in err, err
    assert not out.exists() and not list((tmp_path / "out.m4b.parts").glob("*.encoding"))
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]
    ok(voicectl(*args, "--resume"))
    assert out.read_bytes() == (tmp_path / "clean.m4b").read_bytes()


@pytest.mark.parametrize("suffix", [".m4b", ".wav"])
def test_the_summary_gives_the_encode_time_and_the_tail(tmp_path, suffix):
    src = tmp_path / "book.txt"
    src.write_text(BOOK)
    proc = voicectl("export", str(src), "-o", str(tmp_path / f"b{suffix}"), *FAST, "--json")
    err = ok(proc)
    stats = json.loads(proc.stdout)
    assert 0 < stats["encode_s"] < stats["e2e_s"] and 0 <= stats["after_last_part_s"] < stats["e2e_s"]
    verb = "encoded" if suffix != ".wav" else "written"
    assert f"{verb} in {stats['encode_s']:.1f} s, complete {stats['after_last_part_s']:.1f} s after the last " \
           f"sentence" in err, err
