"""Provides the Bridge: the TUI's only link to the engine. It loads the model in a thread worker, plays queued
utterances one at a time in an async worker, folds engine events into metrics and posts Textual messages up.

Widgets never call the engine; the app calls the bridge's few methods (`submit`, `stop`, `skip`, `replay`) and
receives messages. Engine events emitted on the UI thread (all of a request's events: the synthesizer runs on
Textual's loop) are applied at once; events from other threads travel as `EngineEvent` messages.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from textual import work
from textual.widget import Widget

from engine.backends.base import MonitoredSink
from engine.config import SynthesisRequest
from engine.errors import VoiceError
from engine.events import Event, Notice
from engine.factory import EngineConfig, build_synthesizer
from voiceapp.tui.history import METRICS_LOG_ENV, History, Status, Utterance, metrics_record
from voiceapp.tui.messages import (EngineEvent, ModelFailed, ModelReady, PlaybackStats, PlayerState,
                                   Problem, UtterancesRemoved, UtteranceUpdated)
from voiceapp.tui.sinks import Recorder, open_sink

POLL_S = 0.1
"""How often the sink's buffer fill and underruns are sampled."""
REPLAY_BLOCK_S = 0.1
"""Replayed audio is written in blocks this long, so stop and skip act quickly."""


@dataclass(frozen=True)
class TuiOptions:
    """What `voicectl tui` was started with."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    voice: str = "default"
    device: int | str | None = None
    """Output device index or name; None = the default device."""
    latency: float = 0.1
    """Output stream latency in seconds."""
    out_dir: Path | None = None
    """Write each utterance as a WAV file here instead of playing it."""
    server_socket: Path | None = None
    """Use a running `voicectl serve` at this socket when it can stand in for `engine`; None = in-process."""
    start_server: bool = False
    """Start a background server at `server_socket` when none runs there (voiceapp.server.autostart)."""


class Bridge(Widget):
    """Runs the engine for the app (see module docstring). Invisible; lives in the DOM for workers and messages."""

    DEFAULT_CSS = "Bridge { display: none; }"

    def __init__(self, options: TuiOptions, sink: MonitoredSink | None = None, history: History | None = None,
                 *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.options = options
        self.voice = options.voice
        """Voice for the next submitted text (the app sets it from the voice picker)."""
        self.history = history or History()
        self.requests: deque[SynthesisRequest] = deque(maxlen=100)
        """The latest requests sent to the synthesizer, oldest first."""
        self.synth = None
        self.sink: MonitoredSink | None = None
        self.load_error: str | None = None
        self._given_sink = sink
        self._jobs: deque[tuple[str, Utterance]] = deque()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._job_task: asyncio.Task | None = None
        self._current: tuple[str, Utterance] | None = None
        self._cancel_as = Status.STOPPED
        self._recorder: Recorder | None = None
        self._ui_thread = threading.get_ident()
        self._last_stats: tuple[int, int, int] | None = None
        self._unshown: dict[int, Utterance] = {}
        """Utterances whose metrics engine events changed since they were last shown, by number."""
        self._last_state = ""
        self._remote = False
        """The synthesizer is an engine server's client (its requests' metrics fold the server's events)."""

    # ---- life cycle ---------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self._ui_thread = threading.get_ident()
        self.run_worker(self._start_engine(), name="engine", group="engine", exit_on_error=False)
        self.run_worker(self._serve(), name="speaker", group="speaker", exit_on_error=False)
        self.set_interval(POLL_S, self._poll)
        self._post_state()

    async def on_unmount(self) -> None:
        """The app is closing: stop playback, close the sink (injected ones too) and the engine."""
        if self._job_task is not None:
            self._job_task.cancel()
        if self.sink is not None:
            self.sink.close()
        if self.synth is not None:
            await self.synth.close()

    def _describe_engine(self) -> str:
        config = self.options.engine
        return "fake engine" if config.backend == "fake" else f"model {config.model or '(default)'}"

    async def _start_engine(self) -> None:
        """A warm server when one runs (or starts) and fits (no model load here), else the in-process engine."""
        if self.options.server_socket is not None:
            from voiceapp.server.autostart import connect_or_start

            try:
                remote = await connect_or_start(self.options.server_socket, self.options.engine,
                                                self._on_engine_event, start=self.options.start_server)
            except VoiceError as err:  # no model to start a server with, a bad $VOICEAPP_IDLE_TIMEOUT: as a load
                self.post_message(ModelFailed(str(err)))
                return
            if remote is not None:
                try:
                    sink, notice = await asyncio.to_thread(self._open_sink, remote.sample_rate)
                except VoiceError as err:
                    await remote.close()
                    self.post_message(ModelFailed(str(err)))
                    return
                self._remote = True
                self.post_message(ModelReady(f"server pid {remote.info.get('pid')}", remote, sink, notice))
                return
        self._load()

    def _open_sink(self, sample_rate: int) -> tuple[MonitoredSink, str | None]:
        if self._given_sink is not None:
            return self._given_sink, None
        return open_sink(sample_rate, self.options.out_dir, self.options.device, self.options.latency)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self) -> None:
        """Thread worker: build the synthesizer (slow: weights, warm-up), then open the sink."""
        try:
            synth = build_synthesizer(self.options.engine, events=self._on_engine_event)
            sink, notice = self._open_sink(synth.sample_rate)
        except VoiceError as err:
            self.post_message(ModelFailed(str(err)))
            return
        except Exception as err:  # a backend bug must not become a traceback on screen
            self.post_message(ModelFailed(f"the model failed to load: {type(err).__name__}: {err}".splitlines()[0]))
            return
        self.post_message(ModelReady(self._describe_engine(), synth, sink, notice))

    def on_model_ready(self, message: ModelReady) -> None:
        self.synth, self.sink = message.synth, message.sink
        self._ready.set()
        self._post_state()

    def on_model_failed(self, message: ModelFailed) -> None:
        self.load_error = message.error
        for _, utt in self._jobs:  # one notification (the app's) says why, not one per queued text
            utt.status, utt.error = Status.FAILED, message.error
            self._changed(utt)
            log_metrics(utt)
        self._jobs.clear()
        self._post_state()

    # ---- commands (called by the app) ---------------------------------------------------------------

    def submit(self, text: str) -> Utterance | None:
        """Queue `text` in the current voice; it plays when the model is ready and earlier ones are done."""
        if not text.strip():
            return None
        if self.load_error is not None:
            self.post_message(Problem(f"cannot speak: {self.load_error}"))
            return None
        utt, pruned = self.history.add(text, self.voice)
        if pruned:
            self.post_message(UtterancesRemoved([u.number for u in pruned]))
        self._changed(utt)
        self._enqueue("speak", utt)
        return utt

    def replay(self, number: int) -> bool:
        """Queue a history entry's kept audio to play again."""
        utt = self.history.get(number)
        if utt is None or utt.audio is None:
            why = "it is not finished" if utt is not None and not utt.status.finished else \
                (utt.audio_note if utt is not None and utt.audio_note else "it has no audio")
            self.post_message(Problem(f"cannot replay #{number}: {why}", "warning"))
            return False
        self._enqueue("replay", utt)
        return True

    def stop(self) -> None:
        """Stop what is playing and drop everything queued."""
        for kind, utt in self._jobs:
            if kind == "speak":
                self._finish(utt, Status.DROPPED)
        self._jobs.clear()
        self._cancel_current(Status.STOPPED)
        self._post_state()

    def skip(self) -> None:
        """Stop what is playing; the next queued one starts."""
        self._cancel_current(Status.SKIPPED)

    def _enqueue(self, kind: str, utt: Utterance) -> None:
        self._jobs.append((kind, utt))
        self._wake.set()
        self._post_state()

    def _cancel_current(self, status: Status) -> None:
        if self._job_task is not None and not self._job_task.done():
            self._cancel_as = status
            self._job_task.cancel()

    # ---- the speaker loop ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        """Async worker: play queued jobs one at a time, for the life of the app."""
        await self._ready.wait()
        try:
            while True:
                while not self._jobs:
                    self._wake.clear()
                    await self._wake.wait()
                self._current = self._jobs.popleft()
                kind, utt = self._current
                self._post_state()
                run = self._speak(utt) if kind == "speak" else self._replay(utt)
                self._job_task = asyncio.create_task(run)
                await asyncio.wait([self._job_task])
                self._job_task, self._current = None, None
                self._post_state()
        finally:
            if self._job_task is not None:
                self._job_task.cancel()

    async def _speak(self, utt: Utterance) -> None:
        assert self.synth is not None and self.sink is not None
        sink = self.sink
        # the whole text: the synthesizer splits and normalizes it a piece at a time as its sentences are needed, so
        # a huge paste never holds the UI loop
        req = SynthesisRequest(utt.text, voice=utt.voice, request_id=utt.request_id)
        self.requests.append(req)
        utt.metrics.sample_rate = self.synth.sample_rate
        utt.metrics.remote = self._remote
        utt.status = Status.PLAYING
        self._changed(utt)
        self._recorder = recorder = Recorder(sink, int(self.history.max_audio_s * sink.sample_rate))
        underruns_before = sink.underruns
        sink.mark_utterance_start()
        status, error = Status.DONE, None
        try:
            await self.synth.speak(req, recorder)
        except asyncio.CancelledError:
            status = self._cancel_as
            raise
        except VoiceError as err:
            status, error = Status.FAILED, str(err)
        except Exception as err:  # a backend bug: one line, never a traceback
            status, error = Status.FAILED, f"synthesis failed: {type(err).__name__}: {err}".splitlines()[0]
        finally:
            self._recorder = None
            utt.metrics.blocked_s = recorder.blocked_s
            utt.metrics.underruns = sink.underruns - underruns_before
            if status is Status.DONE:
                self._read_onset(utt)
                self._keep_audio(utt, recorder.audio())
            self._finish(utt, status, error)

    def _keep_audio(self, utt: Utterance, audio: np.ndarray | None) -> None:
        if audio is None:
            utt.audio_note = "not kept: too long"
            return
        for old in self.history.keep_audio(utt, audio):
            self._changed(old)

    async def _replay(self, utt: Utterance) -> None:
        assert self.sink is not None and utt.audio is not None
        sink, audio = self.sink, utt.audio
        block = max(1, int(REPLAY_BLOCK_S * utt.metrics.sample_rate))
        sink.mark_utterance_start()
        try:
            for start in range(0, len(audio), block):
                await sink.write(audio[start:start + block])
            await sink.drain()
        except asyncio.CancelledError:
            sink.clear()
            raise
        except VoiceError as err:
            sink.clear()
            self.post_message(Problem(f"replay of #{utt.number} failed: {err}"))

    def _finish(self, utt: Utterance, status: Status, error: str | None = None) -> None:
        utt.status, utt.error = status, error
        self._changed(utt)
        log_metrics(utt)
        if error is not None:
            self.post_message(Problem(error))

    def _changed(self, utt: Utterance) -> None:
        self._unshown.pop(utt.number, None)
        self.post_message(UtteranceUpdated(utt))

    def _show_metrics(self) -> None:
        """Show the metrics engine events changed since the last poll. Events come at generation speed (every
        decoded chunk, faster than playback); repainting the history and the metrics on each one kept a 2-core
        machine half busy while playing. State changes (queued, playing, done...) are shown at once."""
        unshown, self._unshown = self._unshown, {}
        for utt in unshown.values():
            self.post_message(UtteranceUpdated(utt))

    # ---- engine events ------------------------------------------------------------------------------

    def _on_engine_event(self, event: Event) -> None:
        """The engine's event sink: may be called from any thread."""
        if threading.get_ident() == self._ui_thread:
            self._apply(event)
        else:
            self.post_message(EngineEvent(event))

    def on_engine_event(self, message: EngineEvent) -> None:
        self._apply(message.event)

    def _apply(self, event: Event) -> None:
        if isinstance(event, Notice):
            self.post_message(Problem(event.message, "information"))
            return
        utt = self.history.by_request(getattr(event, "request_id", ""))
        if utt is not None:
            if self._recorder is not None and utt.status is Status.PLAYING:
                utt.metrics.blocked_s = self._recorder.blocked_s
            utt.metrics.apply(event)
            self._unshown[utt.number] = utt  # shown at the next poll (POLL_S)

    # ---- polling the sink ---------------------------------------------------------------------------

    def _poll(self) -> None:
        self._show_metrics()
        sink = self.sink
        if sink is None:
            return
        stats = (sink.fill_frames, sink.capacity_frames, sink.underruns)
        if stats != self._last_stats:
            self._last_stats = stats
            self.post_message(PlaybackStats(stats[0], stats[1], sink.device_rate, stats[2]))
        if self._current is not None and self._current[0] == "speak":
            self._read_onset(self._current[1])

    def _read_onset(self, utt: Utterance) -> None:
        """Audible onset = the player's DAC time of the utterance's first sample, from the request start."""
        if self.sink is not None and utt.metrics.heard_at(self.sink.last_onset_perf):
            self._changed(utt)

    def _post_state(self) -> None:
        text = self._state_text()
        if text != self._last_state:
            self._last_state = text
            self.post_message(PlayerState(text))

    def _state_text(self) -> str:
        queued = sum(1 for kind, _ in self._jobs if kind == "speak")
        tail = f" · {queued} queued" if queued else ""
        if self.load_error is not None:
            return "no model loaded"
        if not self._ready.is_set():
            return f"loading {self._describe_engine()}…" + tail
        if self._current is None:
            return "ready" + tail
        kind, utt = self._current
        return f"{'speaking' if kind == 'speak' else 'replaying'} #{utt.number}" + tail


def log_metrics(utt: Utterance) -> None:
    """Append the finished utterance's metrics_record to $VOICEAPP_TUI_METRICS when it is set."""
    path = os.environ.get(METRICS_LOG_ENV)
    if not path:
        return
    from voiceapp.common import process_start_perf

    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(metrics_record(utt, process_start_perf())) + "\n")
    except OSError:
        pass  # a measurement aid: never a reason to disturb the app
