"""engine.tuning: background steps run one after another, report their progress, and a failing step costs only
itself."""
from __future__ import annotations

import asyncio
import threading

from engine.events import Notice, StartupPhase
from engine.tuning import Tuning, TuningStep, Yielding


async def test_steps_run_in_order_off_the_loop_and_apply_on_it() -> None:
    loop_thread, seen, applied = threading.get_ident(), [], []

    def build(name):
        def run():
            seen.append((name, threading.get_ident() != loop_thread))
            return name.upper()
        return run

    async def apply(value):
        applied.append((value, threading.get_ident() == loop_thread))

    events = []
    tuning = Tuning([TuningStep("lane", build("lane"), apply), TuningStep("vllm", build("vllm"), apply)],
                    events.append)
    assert not tuning.done and tuning.status()["steps"][0]["state"] == "pending"
    await tuning.run()
    assert seen == [("lane", True), ("vllm", True)] and applied == [("LANE", True), ("VLLM", True)]
    status = tuning.status()
    assert tuning.done and status["done"] and [s["state"] for s in status["steps"]] == ["done", "done"]
    assert all(s["seconds"] >= 0 for s in status["steps"]) and status["seconds"] >= 0
    assert [e.name for e in events if isinstance(e, StartupPhase)] == ["tuning_lane", "tuning_vllm"]
    assert [e.message for e in events if isinstance(e, Notice)][-1].startswith("tuned in")


async def test_a_failing_step_is_a_notice_and_the_rest_still_run() -> None:
    def fail():
        raise RuntimeError("CUDA out of memory\nmore")

    applied, events = [], []

    async def apply(value):
        applied.append(value)

    tuning = Tuning([TuningStep("lane", fail, apply), TuningStep("nothing", lambda: None, apply),
                     TuningStep("vllm", lambda: "v", apply)], events.append)
    await tuning.run()
    states = {s["name"]: (s["state"], s["detail"]) for s in tuning.status()["steps"]}
    assert states == {"lane": ("failed", "RuntimeError: CUDA out of memory"), "nothing": ("skipped", ""),
                      "vllm": ("done", "")}
    assert applied == ["v"] and tuning.done
    assert any(isinstance(e, Notice) and e.message.startswith("background lane failed (RuntimeError") for e in events)


async def test_progress_is_visible_while_a_step_runs() -> None:
    release = threading.Event()
    tuning = Tuning([TuningStep("lane", lambda: release.wait(5) and "lane")])
    task = asyncio.create_task(tuning.run())
    for _ in range(100):
        await asyncio.sleep(0.01)
        if tuning.steps[0].state == "running":
            break
    assert tuning.status()["steps"][0]["state"] == "running" and not tuning.status()["done"]
    release.set()
    await task
    assert tuning.status()["done"]


async def test_settle_runs_once_after_every_step_when_nothing_presses() -> None:
    order, looks = [], []

    def pressing() -> int:  # one stream presses once both steps are done, for two more looks
        looks.append(len(order))
        return int(len(order) == 2 and looks.count(2) <= 3)

    loop_thread = threading.get_ident()
    gate = Yielding(pressing, poll_s=0.001)
    tuning = Tuning([TuningStep("lane", lambda: order.append("lane") or "lane"),
                     TuningStep("vllm", lambda: order.append("vllm") or "v")], yielding=gate,
                    settle=lambda: order.append(("settle", threading.get_ident() != loop_thread)))
    await tuning.run()
    assert order == ["lane", "vllm", ("settle", True)] and tuning.done and gate.pauses >= 1


def test_an_engine_without_a_gpu_lane_has_nothing_to_tune(tiny_model, tmp_path) -> None:
    from engine.factory import EngineConfig, build_synthesizer
    from engine.tuning import crowd_tuning

    config = EngineConfig(model=str(tiny_model), backend="auto", threads=2, cache_dir=str(tmp_path),
                          one_listener=True)
    tuning = crowd_tuning(build_synthesizer(config), config)
    assert tuning.steps == [] and tuning.done and tuning.status()["done"]


def test_the_decoder_step_captures_the_engines_own_window_lengths() -> None:
    """A server's config leaves the schedule to the model family (None): the crowd decoder graphs are captured for
    the lengths of the schedule the engine runs, every batch, in the background; then one window at each length no
    standard one covers."""
    from engine.batching import DECODE_BATCHES, lengths_for
    from engine.families.orpheus import SCHEDULE
    from engine.tuning import _capture_decoder_batches

    captured = []

    class Decoder:
        def warmup(self, lengths, batches, background=False):
            captured.append((tuple(lengths), tuple(batches), background))
            return 0.0

    class Synth:
        schedule, decoder = SCHEDULE, Decoder()

    assert _capture_decoder_batches(Synth())
    standard = [((n,), (b,), True) for b in DECODE_BATCHES for n in lengths_for(SCHEDULE)]
    assert captured[:len(standard)] == standard
    # then batch 1 at each length a short sentence's first windows have: Orpheus's of 1-12 frames but the standard
    assert captured[len(standard):] == [((n,), (1,), True) for n in (1, 2, 4, 6, 7, 8)]


def test_a_server_that_builds_nothing_for_crowds_still_captures_its_short_windows() -> None:
    """An explicit backend or a server started for `say`: no crowd batches, but one graph for each length a short
    sentence's windows decode at (each would otherwise be planned by cuDNN on the decode thread as it first comes);
    nothing where the decoder takes any shape."""
    from engine.families.orpheus import SCHEDULE
    from engine.tuning import _capture_decoder_batches, server_tuning, short_window_tuning

    captured = []

    class Decoder:
        fixed_shapes = True

        def warmup(self, lengths, batches, background=False):
            captured.append((tuple(lengths), tuple(batches), background))
            return 0.0

    class Deadlines:
        pressing = staticmethod(lambda: 0)

    class Synth:
        schedule, decoder, deadlines, active_requests = SCHEDULE, Decoder(), Deadlines(), 0

    assert _capture_decoder_batches(Synth(), crowd=False)
    assert captured == [((n,), (1,), True) for n in (1, 2, 4, 6, 7, 8)]
    tuning = short_window_tuning(Synth())
    assert [step.name for step in tuning.steps] == ["decoder"]
    # what a server or a Ray replica that does not tune for crowds runs (the crowd's config is never read)
    assert [step.name for step in server_tuning(Synth(), None, crowd=False).steps] == ["decoder"]
    asyncio.run(tuning.run())
    assert tuning.done and captured[6:] == captured[:6]
    Synth.decoder.fixed_shapes = False
    assert short_window_tuning(Synth()).steps == []


class Script:
    """A scripted timeline for Yielding: a clock that sleeping advances, and live streams pressing until a time."""

    def __init__(self, pressing_until: float) -> None:
        self.t, self.until = 0.0, pressing_until
        self.asked = 0

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def pressing(self) -> int:
        self.asked += 1
        return 2 if self.t < self.until else 0


def test_background_work_waits_while_a_live_stream_is_pressing() -> None:
    from engine.tuning import Yielding

    script = Script(pressing_until=0.3)
    gate = Yielding(script.pressing, script.sleep, script.clock, poll_s=0.02, max_s=5.0)
    gate.wait()
    assert 0.3 <= script.t < 0.35 and gate.pauses == 1 and gate.paused_s == script.t
    gate.wait()  # nothing pressing now: no pause
    assert gate.pauses == 1 and script.t < 0.35


def test_a_pause_is_bounded_so_tuning_finishes_under_a_steady_crowd() -> None:
    from engine.tuning import Yielding

    script = Script(pressing_until=1e9)
    gate = Yielding(script.pressing, script.sleep, script.clock, poll_s=0.1, max_s=2.0)
    gate.wait()
    assert 2.0 <= script.t < 2.2 and gate.pauses == 1


async def test_steps_and_the_captures_inside_them_yield_to_live_streams() -> None:
    """The runner waits before a step while a stream is pressing (on the loop), and the decoder step before each
    capture (on its worker thread): no capture starts while a stream is pressing, and each starts once none is."""
    import time
    from concurrent.futures import Future

    from engine.batching import DECODE_BATCHES, lengths_for
    from engine.tuning import Yielding, _capture_decoder_batches
    from engine.windowed_decode import uncovered_lengths
    from engine.windowing import WindowSchedule

    pressing = {"now": 1}
    log: list[str] = []

    class Decoder:
        def warmup(self, lengths, batches, background=False):
            log.append("capture while pressing" if pressing["now"] else "capture")
            if len(log) == 1:
                pressing["now"] = 1  # a new request arrives after the first capture
            return 0.0

    class Synth:
        schedule, decoder = WindowSchedule(), Decoder()

        def on_decode_thread(self, fn):
            done: Future = Future()
            done.set_result(fn())
            return done

    def sleep(seconds):
        pressing["now"] = 0  # the pressing stream got its audio while the capture waited
        log.append("waited")

    gate = Yielding(lambda: pressing["now"], sleep, poll_s=0.01)
    tuning = Tuning([TuningStep("decoder", lambda: _capture_decoder_batches(Synth(), gate))], yielding=gate)
    asyncio.get_running_loop().call_later(0.1, pressing.update, {"now": 0})
    t0 = time.monotonic()
    await tuning.run()
    assert 0.1 <= time.monotonic() - t0 < 2.0  # the step waited for the first stream, not for MAX_YIELD_S
    assert log[:3] == ["capture", "waited", "capture"] and "capture while pressing" not in log
    standard = lengths_for(WindowSchedule())
    assert log.count("capture") == len(DECODE_BATCHES) * len(standard) + len(uncovered_lengths(WindowSchedule(),
                                                                                                 standard))
    assert gate.pauses == 2 and tuning.status()["yielded_s"] >= 0.1


def test_background_tuning_starts_no_vllm_behind_a_lane_that_holds_the_crowd(monkeypatch) -> None:
    """vLLM's engine would run in a process of its own and time-slice the GPU with the lane and the decoder; behind a
    lane of a crowd's size it would take no stream, so the step is skipped (and still runs behind a small lane)."""
    import sys
    from types import ModuleType, SimpleNamespace

    from engine import factory
    from engine.backends.graph_gen import CROWD_ROWS, LaneRouter
    from engine.config import EngineConfig
    from engine.tuning import crowd_tuning

    module = ModuleType("engine.backends.vllm_gen")
    module.VllmTokenGenerator = lambda info, events=None: "VLLM"
    monkeypatch.setitem(sys.modules, "engine.backends.vllm_gen", module)
    monkeypatch.setattr(factory, "_vllm_installed", lambda: True)
    monkeypatch.setattr(factory, "_current_gpu", lambda device: True)
    monkeypatch.setattr(factory, "gpu_device", lambda config: "cuda:0")
    for rows, built in ((2, "VLLM"), (CROWD_ROWS, None)):
        synth = SimpleNamespace(model_info=SimpleNamespace(), deadlines=SimpleNamespace(pressing=lambda: 0),
                                generator=LaneRouter(object(), SimpleNamespace(rows=rows)))
        step = crowd_tuning(synth, EngineConfig(backend="auto")).steps[-1]
        assert step.name == "vllm" and step.build() == built
        assert ("holds the crowd" in step.detail) == (built is None)


def test_pieces_of_background_work_are_timed_between_yields_without_the_waits() -> None:
    """A request that arrives mid-piece waits for its end: the server's status lists the longest pieces, named,
    and neither a pause for live streams nor the idle time after a step's last piece counts as work."""
    from engine.tuning import PieceLog, Yielding

    script = Script(pressing_until=0.5)
    gate = Yielding(script.pressing, script.sleep, script.clock, poll_s=0.1, max_s=5.0, pieces=PieceLog(script.clock))
    gate.wait("decoder 64x48")  # pressing: waits 0.5 s first
    script.t += 0.25
    gate.wait("decoder 64x56")
    script.t += 0.75
    gate.wait("lane decode 512x1")
    script.t += 0.125
    gate.pieces.end()  # its step ended
    script.t += 9.0  # nothing runs
    gate.pieces.end()
    log = gate.pieces.as_dict()
    assert log["count"] == 3 and log["seconds"] == 1.125
    assert log["longest_ms"] == [[750.0, "decoder 64x56"], [250.0, "decoder 64x48"], [125.0, "lane decode 512x1"]]


def test_a_tuning_status_keeps_only_the_longest_pieces() -> None:
    from engine.tuning import PieceLog

    t = [0.0]
    log = PieceLog(lambda: t[0], keep=2)
    for ms in (30, 10, 50, 20):
        log.begin(f"{ms} ms")
        t[0] += ms / 1e3
    log.end()
    assert log.count == 4 and [what for _, what in log.longest] == ["50 ms", "30 ms"]
    assert Tuning([]).status()["pieces"] == {"count": 0, "seconds": 0.0, "longest_ms": []}


def test_voicectl_status_names_the_longest_piece() -> None:
    from voiceapp.cli.status import describe_tuning

    status = {"done": False, "seconds": 12.0, "steps": [{"name": "decoder", "state": "running", "seconds": None,
                                                          "detail": ""}], "yielded_s": 0.0,
              "pieces": {"count": 3, "seconds": 0.9, "longest_ms": [[412.3, "decoder 64x48"], [20.0, "decoder 1x8"]]}}
    assert describe_tuning(status) == ("tuning: in progress after 12 s (decoder running); "
                                       "longest piece 412 ms (decoder 64x48)")
    assert "longest" not in describe_tuning({**status, "pieces": {"count": 0, "seconds": 0.0, "longest_ms": []}})
    done = {**status, "done": True, "steps": [{"name": "compile", "state": "done", "seconds": 0.4,
                                               "detail": "caches warm"},
                                              {"name": "vllm", "state": "skipped", "seconds": 0.0,
                                               "detail": "the graph lane holds the crowd"}]}
    assert describe_tuning(done).startswith("tuning: done after 12 s (compile done 0 s (caches warm), vllm skipped 0 s "
                                            "(the graph lane holds the crowd))")


async def test_no_full_collection_runs_while_steps_build_and_the_threshold_comes_back() -> None:
    import gc

    before, seen = gc.get_threshold(), []
    await Tuning([TuningStep("lane", lambda: seen.append(gc.get_threshold()[2]) or "built")]).run()
    assert seen[0] > before[2] and gc.get_threshold() == before


async def test_the_settle_waits_for_a_moment_with_no_live_stream_but_not_for_ever() -> None:
    looks, settled = [], []

    def idle() -> bool:  # streams are live for the first five looks
        looks.append(None)
        return len(looks) > 5

    gate = Yielding(lambda: 0, poll_s=0.001)
    await Tuning([TuningStep("lane", lambda: "lane")], yielding=gate, settle=lambda: settled.append(len(looks)),
                 idle=idle).run()
    assert settled == [6]
    looks.clear()
    await Tuning([TuningStep("lane", lambda: "lane")], yielding=gate, settle=lambda: settled.append("anyway"),
                 idle=lambda: looks.append(None) or False, settle_wait_s=0.01).run()
    assert settled[-1] == "anyway" and 5 <= len(looks) <= 12


def test_a_stopped_server_ends_its_tuning_at_the_next_piece() -> None:
    """A server stopped while it tunes (`voicectl stop` in the first minutes of a fresh server) does not wait for the
    rest of the step's build: the step's thread ends at its next yield, and the process exits at once."""
    import time

    gate = Yielding(lambda: 0)
    pieces, started = [], threading.Event()

    def build() -> str:  # a lane build: many pieces, each behind the gate
        for i in range(500):
            gate.wait(f"piece {i}")
            pieces.append(i)
            started.set()
            time.sleep(0.01)
        return "lane"

    tuning = Tuning([TuningStep("lane", build, lambda lane: asyncio.sleep(0))], yielding=gate)

    async def serve_then_stop() -> None:
        task = asyncio.create_task(tuning.run())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    t0 = time.monotonic()
    asyncio.run(serve_then_stop())  # its end waits for the executor's threads, as the server's does
    assert time.monotonic() - t0 < 2.0 and len(pieces) < 100, len(pieces)
    step = tuning.status()["steps"][0]
    assert step["state"] == "failed" and step["detail"] == "cancelled"
