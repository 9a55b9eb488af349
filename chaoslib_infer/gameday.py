"""The main job: run a game-day plan of drills against the local lab (or a given target).

Data flow of one drill: plan -> lab (brought up here unless a target is given) -> Chaos Toolkit
experiment run in-process (the load control starts the background load, the steady-state hypothesis
is checked, the fault is injected, the hypothesis is checked again, rollbacks always play) -> journal
+ records + lab ground truth -> figures -> evidence (Markdown, HTML, plot) -> ``summary.json``.

Exit codes: 0 every hypothesis held; 1 a drill deviated or failed; 2 error (bad input, unreachable
target); 130 interrupted (Ctrl-C / SIGTERM; rollbacks played and the lab taken down).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chaoslib.run
from chaoslib.exceptions import ChaosException
from chaoslib.experiment import ensure_experiment_is_valid, run_experiment
from chaoslib.loader import load_experiment
from chaoslib.run import RunEventHandler

from chaoslib_infer.controls.load import stop_load
from chaoslib_infer.errors import ConfigError, InferChaosError
from chaoslib_infer.evidence.bundle import junit_xml, tool_versions, write_manifest
from chaoslib_infer.evidence.figures import drill_figures, read_jsonl
from chaoslib_infer.evidence.journal import drill_status, failed_activities, hypothesis_results
from chaoslib_infer.evidence.plots import latency_cdf_plot, replica_share_plot, timeline_plot
from chaoslib_infer.evidence.render import render_drill, render_index, write_atomic
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.load.records import read_records
from chaoslib_infer.plan import DrillSpec, Plan

__all__ = ["EXIT_DEVIATED", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "run_drill", "run_gameday"]

EXIT_OK = 0
EXIT_DEVIATED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

Progress = Callable[[str], None]


def _iso(t: float | None = None) -> str:
    return dt.datetime.fromtimestamp(t if t is not None else time.time(), dt.UTC).isoformat()


class _ProgressHandler(RunEventHandler):  # type: ignore[misc]
    """Print the phases of a Chaos Toolkit run as they happen."""

    def __init__(self, drill: str, progress: Progress) -> None:
        self.drill = drill
        self.progress = progress
        self.t0 = time.monotonic()

    def _say(self, msg: str) -> None:
        self.progress(f"  [{self.drill} +{time.monotonic() - self.t0:5.1f}s] {msg}")

    def start_hypothesis_before(self, experiment: dict[str, Any]) -> None:
        self._say("steady-state hypothesis (before the fault)...")

    def hypothesis_before_completed(self, experiment: Any, state: Any, journal: Any) -> None:
        met = bool(state and state.get("steady_state_met"))
        self._say(f"hypothesis before: {'held' if met else 'DID NOT HOLD'}")

    def start_method(self, experiment: dict[str, Any]) -> None:
        self._say("method: injecting the fault...")

    def method_completed(self, experiment: Any, state: Any) -> None:
        self._say("method completed")

    def start_hypothesis_after(self, experiment: dict[str, Any]) -> None:
        self._say("steady-state hypothesis (after the fault)...")

    def hypothesis_after_completed(self, experiment: Any, state: Any, journal: Any) -> None:
        met = bool(state and state.get("steady_state_met"))
        self._say(f"hypothesis after: {'held' if met else 'DID NOT HOLD'}")

    def start_rollbacks(self, experiment: dict[str, Any]) -> None:
        self._say("rollbacks...")

    def rollbacks_completed(self, experiment: Any, journal: Any) -> None:
        self._say("rollbacks done")


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """Make SIGTERM behave like Ctrl-C (KeyboardInterrupt) for the whole run, rollbacks included.

    Chaos Toolkit's own SIGTERM handler only fails the current activity and lets the experiment go
    on; a game day that is told to stop must stop, play its rollbacks and take the lab down.
    """

    def _handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    @contextlib.contextmanager
    def _same_signals() -> Iterator[None]:
        yield

    previous = signal.signal(signal.SIGTERM, _handler)
    original = chaoslib.run.exit_signals
    chaoslib.run.exit_signals = _same_signals
    try:
        yield
    finally:
        chaoslib.run.exit_signals = original
        signal.signal(signal.SIGTERM, previous)


def _load_experiment(path: Path) -> dict[str, Any]:
    try:
        experiment = load_experiment(str(path), settings={})
        ensure_experiment_is_valid(experiment)
    except ChaosException as exc:
        raise ConfigError(f"{path}: invalid experiment: {str(exc).splitlines()[0]}") from exc
    except Exception as exc:  # YAML/JSON parse errors surface as various types
        raise ConfigError(
            f"{path}: cannot load experiment: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    return dict(experiment)


def _slo_rows(journal: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for phase in out:
        entry = (journal.get("steady_states") or {}).get(phase) or {}
        for probe in entry.get("probes") or []:
            output = probe.get("output")
            if isinstance(output, dict) and "metric" in output:
                out[phase].append(output)
    return out


def _activity_rows(journal: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    failed = {(a["section"], a["name"]): a for a in failed_activities(journal)}
    for section in ("run", "rollbacks"):
        for run in journal.get(section) or []:
            name = (run.get("activity") or {}).get("name")
            info = failed.get((section, name))
            note = info.get("exception") if info else None
            output = run.get("output")
            if note is None and isinstance(output, dict):
                note = ", ".join(f"{k}={v}" for k, v in list(output.items())[:4])
            elif note is None and isinstance(output, list):
                note = "; ".join(str(x) for x in output) or "nothing to undo"
            rows.append(
                {
                    "section": section,
                    "name": name,
                    "status": run.get("status", "cut-off"),
                    "note": note,
                }
            )
    return rows


def run_drill(
    spec: DrillSpec,
    drill_dir: Path,
    lab: Lab | None,
    base_url: str | None,
    target: dict[str, Any],
    slo_overrides: dict[str, float],
    progress: Progress,
) -> dict[str, Any]:
    """Run one drill's experiment in-process and write its evidence.

    Args:
        spec: the drill (name, experiment path, configuration overrides).
        drill_dir: the drill's evidence folder (created).
        lab: the local lab, or ``None`` for an external target.
        base_url: URL traffic goes to (``None``: the lab's frontend).
        target: the ``summary.json`` target block.
        slo_overrides: ``{metric: threshold}`` (e.g. ``{"p99_e2e_s": 0.5}``).
        progress: where progress lines go.

    Returns:
        The drill's ``summary.json`` entry.

    Raises:
        ConfigError: the experiment file is malformed.
    """
    experiment = _load_experiment(spec.experiment)
    drill_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("records.jsonl", "faults.jsonl"):
        (drill_dir / stale).unlink(missing_ok=True)
    config_vars: dict[str, Any] = {
        "infer_run_dir": str(drill_dir),
        "infer_base_url": base_url or "",
    }
    if lab is not None:
        config_vars["infer_lab_dir"] = str(lab.state_dir)
    config_vars.update({f"slo_{k}": v for k, v in slo_overrides.items()})
    config_vars.update(spec.vars)
    settings = {"runtime": experiment.get("runtime") or {"rollbacks": {"strategy": "always"}}}
    ctk_logger = logging.getLogger("chaostoolkit")
    log_handler = logging.FileHandler(drill_dir / "chaostoolkit.log", encoding="utf-8")
    log_handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s] %(message)s"))
    ctk_logger.addHandler(log_handler)
    ctk_logger.setLevel(logging.DEBUG)
    ctk_logger.propagate = False
    started = time.time()
    progress(f"drill {spec.name}: {experiment.get('title', '')}")
    journal: dict[str, Any]
    try:
        with _interrupt_on_sigterm():
            journal = dict(
                run_experiment(
                    experiment,
                    settings=settings,
                    experiment_vars=(config_vars, {}),
                    event_handlers=[_ProgressHandler(spec.name, progress)],
                )
            )
    finally:
        stop_load({"infer_run_dir": str(drill_dir)})
        ctk_logger.removeHandler(log_handler)
        log_handler.close()
    ended = time.time()
    write_atomic(drill_dir / "journal.json", json.dumps(journal, indent=2, default=str))
    status = drill_status(journal)
    hyp = hypothesis_results(journal)
    events = lab.events() if lab is not None else []
    ledger = read_jsonl(lab.state_dir / "ledger.jsonl") if lab is not None else []
    figures, ground = drill_figures(
        drill_dir, events, ledger, served_after=(lab.served if lab is not None else None)
    )
    entry: dict[str, Any] = {
        "name": spec.name,
        "experiment": str(spec.experiment),
        "status": status,
        "hypothesis": hyp,
        "started_at": _iso(started),
        "ended_at": _iso(ended),
        "figures": figures,
        "ground_truth": ground,
        "evidence": f"{spec.name}/evidence.md",
    }
    records = (
        read_records(drill_dir / "records.jsonl") if (drill_dir / "records.jsonl").exists() else []
    )
    markers: list[tuple[float, str, str]] = []
    if ground.get("fault_at"):
        markers.append((float(ground["fault_at"]), "fault injected", "#d62728"))
    if ground.get("replica_died_at"):
        markers.append((float(ground["replica_died_at"]), "replica died", "#9467bd"))
    if ground.get("replica_serving_again_at"):
        markers.append((float(ground["replica_serving_again_at"]), "serving again", "#2ca02c"))
    plots: list[tuple[Path, str]] = []
    for png, caption in (
        (
            timeline_plot(
                records, drill_dir / "timeline.png", markers, f"{spec.name}: latency and failures"
            ),
            "Timeline: per-second P50/P99 latency and failures, fault and recovery markers",
        ),
        (
            latency_cdf_plot(records, drill_dir / "latency_cdf.png", f"{spec.name}: latency CDF"),
            "Latency CDF (E2E and TTFT) over successful requests",
        ),
        (
            replica_share_plot(
                records, drill_dir / "replica_share.png", f"{spec.name}: requests per replica"
            ),
            "Per-replica share of requests over time",
        ),
    ):
        if png is not None:
            plots.append((png, caption))
    render_drill(
        drill_dir,
        entry,
        target,
        str(experiment.get("title", "")),
        _slo_rows(journal),
        _activity_rows(journal),
        plots,
    )
    progress(
        f"drill {spec.name}: {status.upper()} (availability {figures.get('availability')}, "
        f"interruption {figures.get('interruption_s')} s, restart {figures.get('restart_s')} s)"
    )
    return entry


def run_gameday(
    plan: Plan,
    out_dir: Path,
    *,
    base_url: str | None = None,
    replicas: int | None = None,
    engine: str | None = None,
    slo_overrides: dict[str, float] | None = None,
    progress: Progress = print,
) -> int:
    """Run every drill of ``plan`` and write the evidence bundle to ``out_dir``.

    Without ``base_url`` it brings up the local lab in ``out_dir/lab`` and takes it down at the end,
    on Ctrl-C and on SIGTERM too.

    Returns:
        The exit code (see the module docstring).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    lab: Lab | None = None
    n_replicas = replicas if replicas is not None else plan.lab.replicas
    engine_name = engine or plan.lab.engine
    target = {
        "kind": "url" if base_url else "lab",
        "engine": engine_name if not base_url else "unknown",
        "replicas": n_replicas if not base_url else 0,
    }
    if base_url:
        target["url"] = base_url
    summary: dict[str, Any] = {
        "plan": plan.name,
        "plan_path": str(plan.path),
        "target": target,
        "started_at": _iso(started),
        "ended_at": None,
        "tool": tool_versions(),
        "complete": False,
        "drills": [],
    }
    exit_code = EXIT_OK

    def _write_summary() -> None:
        summary["ended_at"] = _iso()
        write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))

    def _on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous_term = signal.signal(signal.SIGTERM, _on_term)
    try:
        if not base_url:
            progress(
                f"lab: bringing up {n_replicas} {engine_name} replica(s) behind HAProxy in {out_dir / 'lab'} ..."
            )
            try:
                lab = Lab.up(
                    out_dir / "lab",
                    replicas=n_replicas,
                    engine=engine_name,
                    memory_limit_mb=plan.lab.memory_limit_mb,
                    **plan.lab.options,
                )
            except TypeError as exc:
                raise ConfigError(f"{plan.path}: lab: {exc}") from exc
            progress(f"lab: up at {lab.url}")
        for spec in plan.drills:
            if lab is not None:
                lab.wait_healthy(60.0)
            entry = run_drill(
                spec, out_dir / spec.name, lab, base_url, target, slo_overrides or {}, progress
            )
            summary["drills"].append(entry)
            _write_summary()
            if entry["status"] == "aborted":
                exit_code = EXIT_INTERRUPTED
                break
            if entry["status"] != "passed":
                exit_code = max(exit_code, EXIT_DEVIATED)
        else:
            summary["complete"] = True
    except KeyboardInterrupt:
        progress("interrupted: rollbacks played; taking the lab down")
        exit_code = EXIT_INTERRUPTED
    except (LabError, InferChaosError) as exc:
        progress(f"error: {exc}")
        summary["error"] = str(exc)
        exit_code = EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if lab is not None:
                progress("lab: taking down")
                lab.down()
        finally:
            signal.signal(signal.SIGTERM, previous_term)
            _write_summary()
            verdict = {EXIT_OK: "PASSED", EXIT_DEVIATED: "DEVIATED", EXIT_ERROR: "ERROR"}.get(
                exit_code, "ABORTED"
            )
            render_index(out_dir, summary, verdict)
            write_atomic(out_dir / "junit.xml", junit_xml(summary))
            write_manifest(out_dir)
    progress(f"game day {verdict}: {out_dir / 'summary.json'}, {out_dir / 'index.html'}")
    return exit_code


def default_plan_path() -> Path:
    """Return the default plan ``drills/gameday.yaml`` (from the checkout, or ``$CHAOS_INFER_PLAN``)."""
    env = os.environ.get("CHAOS_INFER_PLAN")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "drills" / "gameday.yaml"
