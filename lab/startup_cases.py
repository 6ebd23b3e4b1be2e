"""Provides the process-running half of the start-up benchmark (`python -m lab.startup`): each case launches fresh
`voicectl` processes (`python -m voiceapp.cli ...`, as a user runs them) and times what a user waits for.

Every server runs on the benchmark's own socket (VOICEAPP_SOCKET in a private folder), so the user's server is
never used nor stopped, and every one a case started is stopped when it ends. Every process has a time limit; a
case that fails records its one line and the others still run. lab.startup_bench holds the pure half.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from engine.errors import VoiceError, one_line
from voiceapp.server.client import serve_pids
from lab.startup_bench import SAY_TEXT, CaseOutcome, book_text, child_env, tuning_done

POLL_S = 0.01
"""How often a watched folder, socket or file is looked at."""
TUNING_REQUEST_S = 1.0
"""Pause between the requests sent to a server while it tunes (each also asks whether tuning is done)."""
STOP_WAIT_S = 10.0
"""How long a server has to exit after SIGTERM before it is killed."""
KEY_SETTLE_S = 0.5
"""Wait between the TUI's first screen and typing: keys sent the moment it appeared were sometimes lost."""
TUI_SCREEN_S = 60.0
"""Longest wait for the TUI's first screen and for the typed text to show."""


class CaseFailed(VoiceError):
    """A case could not measure what it should; the benchmark goes on with the others."""


@dataclass
class Bench:
    """What every case shares."""

    model: Path
    """The checkpoint every process is given by path."""
    work: Path
    """A private temporary folder: outputs, logs and the server socket."""
    repeats: int
    """Runs per case."""
    timeout_s: float
    """Longest any one process (or one wait on a server) may take."""
    export_sentences: int
    """Sentences in the export case's book."""
    log: Callable[[str], None]
    """Where progress lines go."""
    _names: Any = field(default_factory=itertools.count)
    """Numbers for new names in `work`."""

    @property
    def socket(self) -> Path:
        return self.work / "engine.sock"

    def env(self, server: bool, fresh_caches: Path | None = None) -> dict[str, str]:
        return child_env(os.environ, str(self.socket), server=server,
                         fresh_caches=None if fresh_caches is None else str(fresh_caches))

    def voicectl(self, command: str, *args: str) -> list[str]:
        """`voicectl COMMAND ARGS --model M` as a user runs it, with this interpreter."""
        return [sys.executable, "-m", "voiceapp.cli", command, *args, "--model", str(self.model)]

    def reversed_export(self, *args: str) -> list[str]:
        """`voicectl export ARGS --model M` rendering its sentences last first (lab.reversed_export)."""
        return [sys.executable, "-m", "lab.reversed_export", *args, "--model", str(self.model)]

    def path(self, stem: str, suffix: str = "") -> Path:
        """A new name in the work folder."""
        return self.work / f"{stem}-{next(self._names)}{suffix}"


def run_cases(bench: Bench, cases: tuple[str, ...]) -> list[CaseOutcome]:
    """Run the cases in order; each ends with no server of the benchmark's left running."""
    outcomes = []
    for case in cases:
        outcome = CaseOutcome(case)
        bench.log(f"startup bench: {case}")
        try:
            CASE_RUNNERS[case](bench, outcome)
        except Exception as err:  # noqa: BLE001  (a failed case is recorded; the others still run)
            outcome.error = str(err) if isinstance(err, VoiceError) else one_line(err)
            bench.log(f"  failed: {outcome.error}")
        finally:
            stop_servers(bench)
        outcomes.append(outcome)
    return outcomes


# ---- the cases ---------------------------------------------------------------------------------------------

def import_torch(bench: Bench, outcome: CaseOutcome) -> None:
    """`python -c "import torch"`: the floor every in-process start stands on."""
    for _ in range(bench.repeats):
        t0 = time.perf_counter()
        run(bench, [sys.executable, "-c", "import torch"], bench.env(server=False), "python -c 'import torch'")
        outcome.add("import_torch_s", time.perf_counter() - t0)


def say_inprocess_first_run(bench: Bench, outcome: CaseOutcome) -> None:
    """One in-process `say` with every compile and voice cache empty, as on a fresh machine."""
    metrics = say(bench, server=False, fresh_caches=bench.path("fresh-caches"))
    outcome.add("say_inprocess_first_run_s", metrics["process_ttfa_ms"] / 1000)
    outcome.keep("say_inprocess_first_run_phases", metrics.get("phases") or {})


def say_inprocess(bench: Bench, outcome: CaseOutcome) -> None:
    """`say --no-server`: launch to first audio with the engine built in the process; its phases too."""
    for _ in range(bench.repeats):
        metrics = say(bench, server=False)
        outcome.add("say_inprocess_s", metrics["process_ttfa_ms"] / 1000)
        outcome.keep("say_inprocess_phases", metrics.get("phases") or {})


def say_autostart(bench: Bench, outcome: CaseOutcome) -> None:
    """A `say` that starts the background server, then the next `say` through it; the server is stopped after
    each pair. The next one is timed to its first audio written (`say --out`: say_server_out_s) and, where the
    machine has PulseAudio, to its first sound in a private null sink (a fresh process playing: say_server_s);
    without PulseAudio say_server_s is the --out figure, and say_server_measured says which each run is."""
    from lab.sink import private_sink

    with private_sink(bench.work) as sink:
        for _ in range(bench.repeats):
            first = say(bench, server=True)
            try:
                if first.get("server_started") is not True or not first.get("server_pid"):
                    raise CaseFailed(f"say with no server running did not start one (server_started "
                                     f"{first.get('server_started', 'absent')}, server_pid {first.get('server_pid')})")
                outcome.add("say_autostart_s", first["process_ttfa_ms"] / 1000)
                second = say(bench, server=True)
                through_server(second, first["server_pid"])
                outcome.add("say_server_out_s", second["process_ttfa_ms"] / 1000)
                if sink is None:
                    outcome.add("say_server_s", second["process_ttfa_ms"] / 1000)
                    outcome.keep("say_server_measured", "first audio written (say --out): no PulseAudio here")
                    continue
                seconds, heard = say_heard(bench, *sink)
                through_server(heard, first["server_pid"])
                outcome.add("say_server_s", seconds)
                outcome.keep("say_server_measured", "first sound in a PulseAudio null sink")
                outcome.keep("say_server_heard", {key: heard.get(key) for key in HEARD_KEYS})
            finally:
                stop_servers(bench, first.get("server_pid"))


HEARD_KEYS = ("process_ttfa_ms", "ttfa_ms", "onset_ms", "phases", "underruns", "device_underruns")
"""What the bench keeps of a `say --json` played into the sink: its first audio read from launch and from the
request, its own onset, when it queued its first audio, and any gap."""


def through_server(metrics: dict, server_pid: int) -> None:
    """CaseFailed unless a `say` spoke through the server `server_pid` (started by the say before it)."""
    if metrics.get("server_pid") != server_pid or metrics.get("server_started") is not False:
        raise CaseFailed(f"the next say did not speak through the started server (server_pid "
                         f"{metrics.get('server_pid')}, server_started {metrics.get('server_started')})")


def say_heard(bench: Bench, env: dict[str, str], capture) -> tuple[float, dict]:
    """One `say TEXT --json` through the running server, played into the private sink: seconds from its launch to
    its first sound there (lab.sink: late by the capture's fragment at most), and its JSON line."""
    argv = bench.voicectl("say", SAY_TEXT, "--json")
    start = capture.frames()
    stdout = run(bench, argv, {**bench.env(server=True), **env}, "say (played)")
    seconds = capture.first_sound_s(start)
    if seconds is None:
        raise CaseFailed("say played nothing into the sink")
    return seconds, last_json(stdout, "say --json")


def serve(bench: Bench, outcome: CaseOutcome) -> None:
    """`voicectl serve`: launch to its first answer with audio (a request from here), and to tuning done."""
    for _ in range(bench.repeats):
        log = bench.path("serve", ".log")
        t0 = time.perf_counter()
        proc = launch(bench.voicectl("serve"), bench.env(server=True), log)
        try:
            ready, tuned, served = asyncio.run(serve_timings(bench, Watched(proc, log, t0, bench.timeout_s,
                                                                            "voicectl serve")))
            steps = tuning_steps(asyncio.run(quiet_status(bench.socket)))
        finally:
            end_process(proc)
        outcome.add("serve_ready_s", ready)
        outcome.add("serve_tuned_s", tuned)
        outcome.add("serve_requests_while_tuning", len(served))
        outcome.add("serve_failures_while_tuning", served.count(False))
        outcome.keep("serve_tuning_steps", steps)
        failed = [f"{s['name']} ({s['detail']})" for s in steps if s["state"] == "failed"]
        if failed:
            raise CaseFailed(f"the server's tuning finished with failed steps: {', '.join(failed)}")


def tui(bench: Bench, outcome: CaseOutcome) -> None:
    """The TUI in a real terminal (tmux), the text typed as soon as it shows: launch to its first audio."""
    if shutil.which("tmux") is None:
        raise CaseFailed("tmux is not installed (it runs the TUI in a real terminal)")
    for _ in range(bench.repeats):
        record = tui_first_utterance(bench)
        if record.get("status") != "done" or record.get("process_ttfa_ms") is None:
            raise CaseFailed(f"the TUI's utterance ended {record.get('status')}: {record.get('error') or 'no audio'}")
        outcome.add("tui_first_audio_s", record["process_ttfa_ms"] / 1000)


def export(bench: Bench, outcome: CaseOutcome) -> None:
    """`voicectl export` of a generated book: launch to the first finished sentence on disk, and to exit."""
    book = write_book(bench.path("book", ".txt"), bench.export_sentences)
    for _ in range(bench.repeats):
        first, total, audio = export_timings(bench, book)
        outcome.add("export_first_sentence_s", first)
        outcome.add("export_total_s", total)
        outcome.add("export_audio_s", audio)
        outcome.add("export_e2e_xrt", audio / total)


def write_book(path: Path, sentences: int) -> Path:
    """The generated book of `sentences` sentences (startup_bench.book_text) written to `path`, for an export to
    read; returns `path`."""
    path.write_text(book_text(sentences), encoding="utf-8")
    return path


CASE_RUNNERS: dict[str, Callable[[Bench, CaseOutcome], None]] = {
    "say_inprocess_first_run": say_inprocess_first_run, "import_torch": import_torch,
    "say_inprocess": say_inprocess, "say_autostart": say_autostart, "serve": serve, "tui": tui, "export": export}
"""Each case of lab.startup_bench.CASES and the function that runs it."""


# ---- say ---------------------------------------------------------------------------------------------------

def say(bench: Bench, server: bool, fresh_caches: Path | None = None) -> dict:
    """One `say TEXT --out F --json` (with --no-server unless `server`): its JSON line."""
    out = bench.path("say", ".wav")
    argv = bench.voicectl("say", SAY_TEXT, "--out", str(out), "--json", *(() if server else ("--no-server",)))
    stdout = run(bench, argv, bench.env(server, fresh_caches), "say")
    out.unlink(missing_ok=True)
    metrics = last_json(stdout, "say --json")
    if metrics.get("process_ttfa_ms") is None:
        raise CaseFailed("say --json reported no process_ttfa_ms (no audio?)")
    return metrics


def last_json(stdout: str, what: str) -> dict:
    """The last line of `stdout` as a JSON object."""
    lines = stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise CaseFailed(f"{what} printed no JSON object: {lines[-1][:200] if lines else 'nothing'}")
    return value


# ---- serve -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Watched:
    """A process being waited on: its log (stderr), launch time and time limit."""

    proc: subprocess.Popen
    log: Path
    t0: float
    """perf_counter() just before the launch."""
    timeout_s: float
    what: str
    """Its name in messages."""

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    async def until(self, probe: Callable[[], Awaitable[Any]], event: str, every: float = POLL_S) -> Any:
        """The first true result of `probe`, tried every `every` seconds; CaseFailed if the process exits or
        the time limit passes first."""
        while True:
            result = await probe()
            if result:
                return result
            if self.proc.poll() is not None:
                raise CaseFailed(f"{self.what} exited (status {self.proc.returncode}) before {event}: "
                                 f"{last_line(self.log)}")
            if self.elapsed() > self.timeout_s:
                raise CaseFailed(f"{self.what}: {event} did not happen within {self.timeout_s:g} s")
            await asyncio.sleep(every)


async def serve_timings(bench: Bench, server: Watched) -> tuple[float, float, list[bool]]:
    """(seconds to the first request answered with audio, seconds to tuning done, whether each request sent while
    it tuned was answered with audio) from the server's launch."""
    status = await server.until(lambda: quiet_status(bench.socket), "it listened")
    tuned = server.elapsed() if tuning_done(status) else None
    await server.until(lambda: answered_with_audio(bench.socket), "it answered a request with audio")
    ready = server.elapsed()
    served: list[bool] = []
    if tuned is None:
        await server.until(lambda: served_while_tuning(bench.socket, served), "its background tuning finished",
                           TUNING_REQUEST_S)
        tuned = server.elapsed()
    return ready, tuned, served


def tuning_steps(status: dict | None) -> list[dict]:
    """The tuning steps a server's status lists (none without a status or a tuning)."""
    return list(((status or {}).get("tuning") or {}).get("steps") or [])


async def served_while_tuning(path: Path, served: list[bool]) -> bool:
    """Whether tuning is done; if not, one request to the server, its outcome appended to `served` (a server must
    keep answering while it tunes)."""
    if await tuned_status(path):
        return True
    try:
        served.append(await answered_with_audio(path))
    except (VoiceError, OSError):
        served.append(False)
    return False


async def tuned_status(path: Path) -> bool:
    """Whether the server at `path` answers that its background tuning is done."""
    status = await quiet_status(path)
    return status is not None and tuning_done(status)


async def quiet_status(path: Path) -> dict | None:
    """The status of the server at `path`, or None (none listening, or one that cannot serve us)."""
    from voiceapp.server.client import server_status

    with contextlib.suppress(VoiceError):
        return await server_status(path)
    return None


async def answered_with_audio(path: Path) -> bool:
    """Whether the server at `path` accepts a request and sends audio for it (the request is then dropped)."""
    from engine.config import SynthesisRequest
    from voiceapp.server.client import RemoteSynthesizer

    remote = await RemoteSynthesizer.connect(path)
    if remote is None:
        return False
    try:
        async with contextlib.aclosing(remote.synthesize(SynthesisRequest(SAY_TEXT))) as chunks:
            async for chunk in chunks:
                if not chunk.pause and len(chunk.samples):
                    return True
        raise CaseFailed("the server finished the request without audio")
    finally:
        await remote.close()


# ---- the TUI -----------------------------------------------------------------------------------------------

def tui_first_utterance(bench: Bench) -> dict:
    """Launch the TUI in tmux, type the text as soon as it shows, and return its first utterance's metrics record
    (the TUI appends it to $VOICEAPP_TUI_METRICS, voiceapp.tui.history)."""
    from voiceapp.tmux import Tmux
    from voiceapp.tui.history import METRICS_LOG_ENV

    record = bench.path("tui-metrics", ".jsonl")
    env = {**bench.env(server=True), METRICS_LOG_ENV: str(record)}
    tmux = Tmux(f"voiceapp-startup-{os.getpid()}-{record.stem}", env)
    try:
        tmux.start(shlex.join(bench.voicectl("tui", "--out-dir", str(bench.path("tui-wavs")))))
        type_at_launch(tmux, SAY_TEXT)
        return wait_for_record(bench, tmux, record)
    finally:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            tmux.keys("C-q")
        tmux.close()
        stop_servers(bench)  # one it started in the background: the next run starts as cold


def type_at_launch(tmux, text: str) -> None:
    """Type `text` and Enter as soon as the TUI's first screen shows (it queues until the engine is ready)."""
    if tmux.wait_for(lambda s: "loading" in s or "ready" in s, TUI_SCREEN_S) is None:
        raise CaseFailed(f"the TUI showed no first screen within {TUI_SCREEN_S:g} s: {screen_line(tmux)}")
    time.sleep(KEY_SETTLE_S)
    tmux.keys("-l", text)
    if tmux.wait_for(lambda s: text in s, TUI_SCREEN_S) is None:
        raise CaseFailed(f"the typed text did not show in the TUI: {screen_line(tmux)}")
    tmux.keys("Enter")


def wait_for_record(bench: Bench, tmux, record: Path) -> dict:
    """The TUI's first metrics record, once written; CaseFailed if the TUI exits, fails to load or times out."""
    deadline = time.monotonic() + bench.timeout_s
    while True:
        lines = record.read_text(encoding="utf-8").splitlines() if record.exists() else []
        if lines:
            return json.loads(lines[0])
        if not tmux.alive():
            raise CaseFailed("the TUI exited before its first audio")
        if time.monotonic() > deadline:
            raise CaseFailed(f"the TUI had no first audio within {bench.timeout_s:g} s: {screen_line(tmux)}")
        time.sleep(POLL_S)


def screen_line(tmux) -> str:
    """The screen's longest line with words (for a one-line error)."""
    lines = [" ".join(line.split()) for line in tmux.screen().splitlines()]
    return max(lines, key=len, default="")[:200] or "(empty screen)"


# ---- export ------------------------------------------------------------------------------------------------

@dataclass
class ExportRun:
    """One `voicectl export` process."""

    name: str
    args: list[str]
    first_sentence_s: float | None = None
    """Launch to the first finished sentence on disk."""
    exit_s: float = 0.0
    """Launch to exit."""
    killed_after: int | None = None
    """Finished sentences on disk when it was killed (None: ran to its end)."""
    stats: dict = field(default_factory=dict)
    """Its --json summary (empty when killed)."""


def export_run(bench: Bench, book: Path, out: Path, *extra: str, kill_at: int | None = None,
               name: str = "export", reverse: bool = False) -> ExportRun:
    """Run `voicectl export BOOK -o OUT EXTRA` (with `reverse`, rendering its sentences last first); with `kill_at`,
    SIGKILL its process group once that many sentences are finished. CaseFailed when it fails, or ends before it
    could be killed."""
    from engine.export_plan import Parts
    from voiceapp.cli.export import Layout

    args = [str(book), "-o", str(out), "--no-progress", "--json", *extra]
    run, stdout, log = ExportRun(name, list(extra)), bench.path(name, ".json"), bench.path(name, ".log")
    parts = Parts(Layout(out, directory=False, split=False).parts)
    t0 = time.perf_counter()
    with open(stdout, "wb") as sink:
        argv = bench.reversed_export(*args) if reverse else bench.voicectl("export", *args)
        proc = launch(argv, bench.env(server=False), log, stdout=sink)
    try:
        while proc.poll() is None:
            written = parts.written()
            if run.first_sentence_s is None and written:
                run.first_sentence_s = time.perf_counter() - t0
            if kill_at is not None and written >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                run.killed_after = parts.written()
                break
            if time.perf_counter() - t0 > bench.timeout_s:
                raise CaseFailed(f"{name} did not finish within {bench.timeout_s:g} s")
            time.sleep(POLL_S)
        run.exit_s = time.perf_counter() - t0
    finally:
        end_process(proc)
    if kill_at is not None and run.killed_after is None:
        raise CaseFailed(f"{name} ended (exit status {proc.returncode}) before {kill_at} sentences were finished")
    if kill_at is None:
        if proc.returncode != 0:
            raise CaseFailed(f"{name} failed (exit status {proc.returncode}): {last_line(log)}")
        run.stats = json.loads(stdout.read_text().strip().splitlines()[-1])
    bench.log(f"  {name}: {run.exit_s:.1f} s" + (f", killed after {run.killed_after} sentences"
                                                 if run.killed_after is not None else
                                                 f", {run.stats['xrt']:.0f}x rendering, "
                                                 f"{run.stats['e2e_xrt']:.0f}x end to end"))
    return run


def export_timings(bench: Bench, book: Path) -> tuple[float, float, float]:
    """(seconds to the first finished sentence on disk, seconds to exit, seconds of audio in the WAV)."""
    out = bench.path("export", ".wav")
    run = export_run(bench, book, out, "--restart")  # each repetition renders: the last one's record says complete
    out.unlink(missing_ok=True)
    if run.first_sentence_s is None:
        raise CaseFailed("no finished sentence was seen on disk before export exited")
    return run.first_sentence_s, run.exit_s, run.stats["audio_s"]


# ---- where it ran ------------------------------------------------------------------------------------------

DEVICE_PROBE = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
"""What a fresh process says about the GPU the engine would use (nothing without one)."""


def describe_device(timeout_s: float) -> tuple[str, bool]:
    """(the GPU's name, True), else (the CPU's model and core count, False)."""
    from lab.startup_bench import cpu_description

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = subprocess.run([sys.executable, "-c", DEVICE_PROBE], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout_s)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().splitlines()[-1], True
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    return cpu_description(cpuinfo, os.cpu_count()), False


def git_commit() -> str | None:
    """The commit of the checkout this code runs from (with `-dirty` when tracked files changed); None outside
    one."""
    root = str(Path(__file__).resolve().parents[1])
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", root, "diff", "--quiet", "HEAD"], capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=30).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


# ---- processes ---------------------------------------------------------------------------------------------

def launch(argv: list[str], env: dict[str, str], log: Path, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """Start a process in its own session, stdout to `stdout` (dropped by default), stderr to `log`."""
    with open(log, "wb") as err:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                                start_new_session=True)


def run(bench: Bench, argv: list[str], env: dict[str, str], what: str) -> str:
    """Run a process to its end within the time limit; its stdout. CaseFailed with its last stderr line if it
    fails. Output goes to files, not pipes: a server it starts in the background cannot hold us up."""
    out, log = bench.path("stdout", ".txt"), bench.path("stderr", ".log")
    with open(out, "wb") as stdout, open(log, "wb") as stderr:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True)
        try:
            proc.wait(timeout=bench.timeout_s)
        except subprocess.TimeoutExpired:
            raise CaseFailed(f"{what} did not finish within {bench.timeout_s:g} s") from None
        finally:
            end_process(proc)
    if proc.returncode != 0:
        raise CaseFailed(f"{what} failed (exit status {proc.returncode}): {last_line(log)}")
    return out.read_text(encoding="utf-8", errors="replace")


def last_line(log: Path) -> str:
    """The last line with text in a log file (a voicectl error is one such line)."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    return next((line[:300] for line in reversed(lines) if line), "(nothing on stderr)")


def end_process(proc: subprocess.Popen) -> None:
    """SIGTERM a child's process group if it still runs, SIGKILL it after STOP_WAIT_S; reap it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_servers(bench: Bench, *pids: int | None) -> None:
    """Stop every server of the benchmark's socket: the one answering there, any still loading for it (found
    by its command line), and `pids`."""
    status = asyncio.run(quiet_status(bench.socket))
    found = {pid for pid in (*pids, status and status.get("pid"), *serve_pids(bench.socket)) if pid}
    for pid in found:
        stop_pid(pid)


def stop_pid(pid: int) -> None:
    """SIGTERM `pid`, SIGKILL it if it still runs after STOP_WAIT_S."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(POLL_S)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
