"""Provides the pure half of the start-up benchmark (`python -m lab.startup`): the cases, what each measured, statistics, the report's
JSON and the printed table. No processes, no clocks: lab.startup_cases runs the processes and fills these in.

Users never meet a warm engine: every figure here is measured on fresh processes launched as a user runs them.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

CASES = ("say_inprocess_first_run", "import_torch", "say_inprocess", "say_autostart", "serve", "tui", "export")
"""The cases in the order they run. The first run comes first, so that no case before it has warmed what it can
warm itself (its compile and voice caches are its own fresh folders; the OS's file cache is not)."""
CASE_KEYS = {"say_inprocess_first_run": ("say_inprocess_first_run_s",),
             "import_torch": ("import_torch_s",),
             "say_inprocess": ("say_inprocess_s",),
             "say_autostart": ("say_autostart_s", "say_server_s", "say_server_out_s"),
             "serve": ("serve_ready_s", "serve_tuned_s", "serve_requests_while_tuning", "serve_failures_while_tuning"),
             "tui": ("tui_first_audio_s",),
             "export": ("export_first_sentence_s", "export_total_s", "export_audio_s", "export_e2e_xrt")}
"""The report's figures each case gives, in table order."""
WARM_KEYS = ("ttfa_ms_p50_1", "ttfa_ms_p95_32", "max_realtime_streams")
"""The warm bench's figures a GPU report carries beside its own (copied from a `voicectl bench --json` file)."""
SAY_TEXT = "The quick brown fox jumps over the lazy dog."
"""What every `say` and the TUI speak: one short sentence, so a run ends soon after its first audio."""


@dataclass
class CaseOutcome:
    """What one case measured, run by run; a failure keeps the runs that finished before it."""

    case: str
    """Its name in CASES (and in --cases)."""
    runs: dict[str, list[float]] = field(default_factory=dict)
    """Each figure's value in every run, in order (seconds; export_e2e_xrt is audio seconds per wall second)."""
    detail: dict[str, list[Any]] = field(default_factory=dict)
    """Per-run records kept beside the figures, e.g. say_inprocess_phases: each run's start-up phases."""
    error: str | None = None
    """The one line that says why the case stopped, or None."""

    def add(self, key: str, value: float) -> None:
        """Record one run's value of figure `key`."""
        self.runs.setdefault(key, []).append(float(value))

    def keep(self, key: str, record: Any) -> None:
        """Record one run's detail under `key`."""
        self.detail.setdefault(key, []).append(record)


@dataclass(frozen=True)
class ReportMeta:
    """Where and how the benchmark ran."""

    device: str
    """The GPU's name, else the CPU's model and its core count."""
    date: str
    """ISO date of the run."""
    git: str | None
    """The checkout's commit (`-dirty` when it has uncommitted changes), or None outside a checkout."""
    command: str
    """The command line, as `python -m lab.startup ...`."""
    model: str
    """`synthetic tiny` / `synthetic full`, or the checkpoint directory."""
    repeats: int
    """Runs per case (the first run's case has one)."""
    gpu: bool
    """Whether the engine ran on a GPU (then the report has room for the warm bench's figures)."""


def parse_cases(text: str | None) -> tuple[str, ...]:
    """--cases `a,b` -> the named cases in run order (None: all); raises ValueError naming unknown ones."""
    if text is None:
        return CASES
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(CASES))
    if unknown or not names:
        raise ValueError(f"--cases: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(CASES)})")
    return tuple(c for c in CASES if c in names)


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def phase_medians(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each start-up phase's median over the runs that have it, in the order phases first appear."""
    names: dict[str, None] = {}
    for phases in runs:
        names.update(dict.fromkeys(phases))
    return {name: statistics.median([p[name] for p in runs if name in p]) for name in names}


def cpu_description(cpuinfo: str, cores: int | None) -> str:
    """`CPU <model name from /proc/cpuinfo>, <n> cores` (`CPU unknown` without a model line)."""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.lower().startswith("model name") and ":" in line), "unknown")
    return f"CPU {model}, {cores or '?'} cores"


def book_text(sentences: int) -> str:
    """A book of `sentences` distinct sentences, a paragraph of five each, for the export case."""
    lines = [f"Sentence {i + 1} of the start-up benchmark reads a short line aloud." for i in range(sentences)]
    return "\n\n".join(" ".join(lines[i:i + 5]) for i in range(0, len(lines), 5)) + "\n"


FRESH_CACHE_VARS = {"XDG_CACHE_HOME": "xdg", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor",
                    "VLLM_CACHE_ROOT": "vllm", "CUDA_CACHE_PATH": "cuda"}
"""What a fresh machine has not filled yet: voiceapp's voice cache (under XDG_CACHE_HOME), Triton's and
Inductor's compiled kernels, vLLM's compile cache and the CUDA driver's JIT cache. The model is always passed by
path, so an empty XDG_CACHE_HOME does not hide a checkpoint in the Hugging Face cache."""


SERVER_IDLE_S = 120.0
"""A server that `say` or the TUI start in the background stops after this long with no client: one that a killed
benchmark left behind goes away by itself (the benchmark stops the ones it sees)."""


def child_env(base: Mapping[str, str], socket: str, *, server: bool,
              fresh_caches: str | None = None) -> dict[str, str]:
    """The environment of a measured process: `base` with the bench's private server socket, servers allowed or
    not (VOICEAPP_NO_SERVER), and with `fresh_caches` every compile and voiceapp cache in empty folders below it."""
    env = {**base, "VOICEAPP_SOCKET": socket, "VOICEAPP_IDLE_TIMEOUT": f"{SERVER_IDLE_S:g}"}
    if server:
        env.pop("VOICEAPP_NO_SERVER", None)
    else:
        env["VOICEAPP_NO_SERVER"] = "1"
    if fresh_caches is not None:
        env.update({var: f"{fresh_caches}/{name}" for var, name in FRESH_CACHE_VARS.items()})
    return env


def tuning_done(status: Mapping[str, Any]) -> bool:
    """Whether a server's status says its background tuning is finished (a server that does not report tuning
    has none: it is tuned once it answers)."""
    tuning = status.get("tuning")
    return tuning is None or bool(tuning.get("done"))


# ---- the report -------------------------------------------------------------------------------------------

def report(meta: ReportMeta, outcomes: Sequence[CaseOutcome], warm: Mapping[str, Any] | None = None) -> dict:
    """The JSON report: meta, each figure's median at the top level, the raw runs, details and errors."""
    result: dict[str, Any] = {"device": meta.device, "date": meta.date, "git": meta.git, "command": meta.command,
                              "model": meta.model, "repeats": meta.repeats, "cases": [o.case for o in outcomes]}
    runs: dict[str, list[float]] = {}
    for outcome in outcomes:
        for key in CASE_KEYS[outcome.case]:
            result[key] = median(outcome.runs.get(key, []))
        runs.update(outcome.runs)
        result.update(outcome.detail)
    phases = result.get("say_inprocess_phases")
    if phases:
        result["say_inprocess_phases_median"] = phase_medians(phases)
    result["runs"] = runs
    result["errors"] = {o.case: o.error for o in outcomes if o.error is not None}
    if meta.gpu or warm:
        result.update(warm_figures(warm))
    return result


def warm_figures(warm: Mapping[str, Any] | None) -> dict[str, Any]:
    """The warm bench's headline figures (None each without a warm bench file), and where they were measured."""
    warm = warm or {}
    figures = {key: warm.get(key) for key in WARM_KEYS}
    if warm:
        figures["warm_device"], figures["warm_date"] = warm.get("device"), warm.get("date")
    return figures


def format_table(result: Mapping[str, Any]) -> str:
    """The figures (median, and every run), the in-process say's phases and the errors, as plain text."""
    rows = [("case", "seconds", "runs")]
    for case in result.get("cases", []):
        for key in CASE_KEYS[case]:
            runs = result.get("runs", {}).get(key, [])
            rows.append((key, _number(result.get(key)), " ".join(_number(v) for v in runs)))
    lines = _columns(rows)
    phases = result.get("say_inprocess_phases_median") or {}
    if phases:
        lines += ["", "say_inprocess phases (median seconds):"]
        lines += _columns([(name, _number(seconds), "") for name, seconds in phases.items()], indent="  ")
    errors = result.get("errors") or {}
    if errors:
        lines += ["", "errors:"] + [f"  {case}: {line}" for case, line in errors.items()]
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def _columns(rows: Sequence[tuple[str, str, str]], indent: str = "") -> list[str]:
    first = max(len(r[0]) for r in rows)
    second = max(len(r[1]) for r in rows)
    return [f"{indent}{a:<{first}}  {b:>{second}}  {c}".rstrip() for a, b, c in rows]
