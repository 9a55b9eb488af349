"""The main job: run a game-day plan of drills against the local lab (or a given target).

Data flow of one drill: plan -> lab (brought up here unless a target is given) -> Chaos Toolkit
experiment run in-process (the load control starts the background load, the steady-state hypothesis
is checked, the fault is injected, the hypothesis is checked again, rollbacks always play) -> journal
+ records + lab ground truth -> figures -> evidence (Markdown, HTML, plot) -> ``summary.json``.

Exit codes (the drills' verdicts, :mod:`chaoslib_infer.verdict`): 0 every drill passed; 1 a drill
failed (a criterion broken, a fault left behind, a defect before the fault); 2 error (bad input,
unreachable target, a drill the tool could not run); 3 a drill was inconclusive (the others
passed); 130 interrupted (Ctrl-C / SIGTERM; rollbacks played and the lab taken down).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from chaoslib.exceptions import ChaosException
from chaoslib.experiment import ensure_experiment_is_valid, run_experiment
from chaoslib.loader import load_experiment
from chaoslib.run import RunEventHandler

from chaoslib_infer.chaoslib_hooks import (
    check_chaoslib_hooks,
    interrupt_on_sigterm,
    no_pause_after_interrupt,
)
from chaoslib_infer.controls.guard import STOP_CONDITION_FILE, read_stop_condition
from chaoslib_infer.controls.load import LOAD_ERROR_FILE, stop_load
from chaoslib_infer.errors import ConfigError, InferChaosError, TargetUnreachable
from chaoslib_infer.evidence.bundle import junit_xml, tool_versions, write_manifest
from chaoslib_infer.evidence.figures import drill_figures, read_jsonl, unix_time
from chaoslib_infer.evidence.journal import failed_activities, hypothesis_results
from chaoslib_infer.evidence.plots import drill_plots
from chaoslib_infer.evidence.render import render_drill, render_index, write_atomic
from chaoslib_infer.evidence.verdicts import drill_verdict, write_residue
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.load.records import read_records
from chaoslib_infer.plan import DrillSpec, Plan, drill_kind
from chaoslib_infer.safety import ledger, redact
from chaoslib_infer.safety.allowlist import check_target
from chaoslib_infer.safety.guard import plan_stop_conditions
from chaoslib_infer.verdict import exit_code as verdict_exit_code

__all__ = [
    "EXIT_DEVIATED",
    "EXIT_ERROR",
    "EXIT_INCONCLUSIVE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "K8S_OMITTED",
    "default_k8s_plan_path",
    "drill_evidence",
    "report_run",
    "run_drill",
    "run_gameday",
    "validate_plan",
]

EXIT_OK = 0
EXIT_DEVIATED = 1
EXIT_ERROR = 2
EXIT_INCONCLUSIVE = 3
EXIT_INTERRUPTED = 130

#: Why a Kubernetes drill's evidence has no lab ground truth (shown in its ground-truth table).
K8S_OMITTED = (
    "omitted on a Kubernetes target: cgroup OOM counters, supervisor events, the HAProxy log and "
    "the engine's generation ledger (duplicates) exist only in the local lab; the cluster's own "
    "record of each fault is in faults.jsonl"
)

Progress = Callable[[str], None]


def _iso(t: float | None = None) -> str:
    return dt.datetime.fromtimestamp(t if t is not None else time.time(), dt.UTC).isoformat()


class _ProgressHandler(RunEventHandler):  # type: ignore[misc]
    """Print the phases of a Chaos Toolkit run as they happen; save the journal as it grows.

    With ``journal_path``, the journal so far (status ``running`` until the run ends, secrets
    scrubbed) is written atomically when the run starts and after each steady-state hypothesis,
    so a runner killed mid-drill leaves the phases it completed on disk.
    """

    def __init__(
        self,
        drill: str,
        progress: Progress,
        journal_path: Path | None = None,
        secrets: list[str] | None = None,
    ) -> None:
        self.drill = drill
        self.progress = progress
        self.t0 = time.monotonic()
        self.journal_path = journal_path
        self.secrets = list(secrets or [])

    def _say(self, msg: str) -> None:
        self.progress(f"  [{self.drill} +{time.monotonic() - self.t0:5.1f}s] {msg}")

    def _save(self, journal: Any) -> None:
        if self.journal_path is None or not isinstance(journal, dict):
            return
        with contextlib.suppress(Exception):  # progress must never break the run
            partial = {**journal, "status": journal.get("status") or "running"}
            text = json.dumps(partial, indent=2, default=str)
            write_atomic(self.journal_path, redact.redact_text(text, self.secrets))

    def started(self, experiment: Any, journal: Any) -> None:
        self._save(journal)

    def interrupted(self, experiment: Any, journal: Any) -> None:
        self._save(journal)

    def start_hypothesis_before(self, experiment: dict[str, Any]) -> None:
        self._say("steady-state hypothesis (before the fault)...")

    def hypothesis_before_completed(self, experiment: Any, state: Any, journal: Any) -> None:
        met = bool(state and state.get("steady_state_met"))
        self._say(f"hypothesis before: {'held' if met else 'DID NOT HOLD'}")
        self._save(journal)

    def start_method(self, experiment: dict[str, Any]) -> None:
        self._say("method: injecting the fault...")

    def method_completed(self, experiment: Any, state: Any) -> None:
        self._say("method completed")

    def start_hypothesis_after(self, experiment: dict[str, Any]) -> None:
        self._say("steady-state hypothesis (after the fault)...")

    def hypothesis_after_completed(self, experiment: Any, state: Any, journal: Any) -> None:
        met = bool(state and state.get("steady_state_met"))
        self._say(f"hypothesis after: {'held' if met else 'DID NOT HOLD'}")
        self._save(journal)

    def start_rollbacks(self, experiment: dict[str, Any]) -> None:
        self._say("rollbacks...")

    def rollbacks_completed(self, experiment: Any, journal: Any) -> None:
        self._say("rollbacks done")


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


def _add_guard(experiment: dict[str, Any], conditions: dict[str, Any]) -> None:
    """Append the stop-conditions control (:mod:`chaoslib_infer.controls.guard`) to an experiment
    that does not declare one already (after its other controls: the load warm-up comes first)."""
    controls = experiment.setdefault("controls", [])
    if any(
        (c.get("provider") or {}).get("module") == "chaoslib_infer.controls.guard"
        for c in controls
        if isinstance(c, dict)
    ):
        return
    controls.append(
        {
            "name": "stop-conditions",
            "provider": {
                "type": "python",
                "module": "chaoslib_infer.controls.guard",
                "arguments": dict(conditions),
            },
        }
    )


def _replica_map(lab: Lab | None) -> dict[str, str]:
    """Request id -> replica from the lab's engine ledger and HAProxy log ({} off the lab)."""
    if lab is None:
        return {}
    from chaoslib_infer.activities.health import lab_replica_map

    try:
        return lab_replica_map(lab)
    except (OSError, ValueError):
        return {}


def drill_evidence(
    name: str,
    experiment_path: str,
    title: str,
    drill_dir: Path,
    journal: dict[str, Any],
    lab: Lab | None,
    target: dict[str, Any],
    started: float | str,
    ended: float | str,
    status: str | None = None,
    criteria: dict[str, Any] | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """Compute one drill's figures from its folder and the lab's ground truth, judge it, and write
    its evidence.

    Used right after a drill (:func:`run_drill`) and to re-render an existing run folder
    (:func:`report_run`, ``chaos-infer report``).

    Args:
        name: drill name (its folder name).
        experiment_path: the experiment file (for the summary).
        title: the experiment's title.
        drill_dir: the drill folder (``records.jsonl``, ``faults.jsonl``, ``stop_condition.json``).
        journal: the Chaos Toolkit journal (possibly partial, for a killed run).
        lab: the lab whose files hold the ground truth (it may be down), or ``None``.
        target: the ``summary.json`` target block.
        started: unix seconds or ISO 8601 text.
        ended: unix seconds or ISO 8601 text.
        status: verdict to use instead of the judged one (e.g. ``"incomplete"``).
        criteria: threshold overrides ``{criterion: value | "off"}`` (the plan's and the CLI's).
        kind: which of the seven drills it is (default :func:`chaoslib_infer.plan.drill_kind`).

    Returns:
        The drill's ``summary.json`` entry: ``status`` (the verdict state), ``reasons``,
        ``verdict`` (rows, windows, notes), figures, ground truth (``stop_condition`` set when a
        guard aborted it).

    Raises:
        ConfigError: a criterion override names no criterion of this drill.
    """
    stop = journal.get("stop_condition") or read_stop_condition(drill_dir)
    hyp = hypothesis_results(journal)
    events = lab.events() if lab is not None else []
    ledger_entries = read_jsonl(lab.state_dir / "ledger.jsonl") if lab is not None else []
    figures, ground = drill_figures(
        drill_dir, events, ledger_entries, served_after=(lab.served if lab is not None else None)
    )
    if lab is not None:  # the gateway, its config (scrubbed) and figures: docs/gateways.md
        from chaoslib_infer.lab.gateways import describe
        from chaoslib_infer.lab.gateways.figures import gateway_figures

        figures.update(gateway_figures(lab.state_dir, drill_dir))
        ground["gateway"] = describe(lab.state_dir)
    ledger_measured = any(e.get("event", "generation") == "generation" for e in ledger_entries)
    if target.get("kind") == "kubernetes":
        ground.setdefault("lab_only_figures", K8S_OMITTED)
    if not ledger_measured:
        # no engine ledger (a cluster, a URL, llama.cpp): a count of 0 would read as "no
        # duplicates"; the figure is unmeasured
        figures["duplicates"] = None
        if "duplicate_generations" in figures:
            figures["duplicate_generations"] = None
    records = (
        read_records(drill_dir / "records.jsonl") if (drill_dir / "records.jsonl").exists() else []
    )
    load_error_file = drill_dir / LOAD_ERROR_FILE
    load_error = (
        load_error_file.read_text(encoding="utf-8").strip() if load_error_file.is_file() else None
    )
    t0, t1 = unix_time(started), unix_time(ended)
    try:
        verdict = drill_verdict(
            kind or drill_kind(name, experiment_path),
            drill_dir,
            journal,
            records,
            figures,
            ground,
            events,
            ledger_measured,
            criteria=criteria,
            stop=stop,
            load_error=load_error,
            start=t0,
            end=t1,
            replica_of=_replica_map(lab),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    status = status or verdict.state
    entry: dict[str, Any] = {
        "name": name,
        "experiment": experiment_path,
        "status": status,
        "reasons": verdict.reasons,
        "verdict": verdict.as_dict(),
        "criteria_overrides": dict(criteria or {}),
        "hypothesis": hyp,
        "started_at": started if isinstance(started, str) else _iso(started),
        "ended_at": ended if isinstance(ended, str) else _iso(ended),
        "figures": figures,
        "ground_truth": ground,
        "evidence": f"{name}/evidence.md",
    }
    if stop:
        entry["stop_condition"] = stop
    if (drill_dir / "records.jsonl").exists():  # Locust-format stats for existing dashboards
        from chaoslib_infer.load.locuststats import write_locust_stats

        with contextlib.suppress(OSError):
            write_locust_stats(drill_dir / "records.jsonl")
    plots, omitted = drill_plots(name, drill_dir, records, events, entry, target, t0, t1, stop)
    render_drill(
        drill_dir,
        entry,
        target,
        title,
        _slo_rows(journal),
        _activity_rows(journal),
        plots,
        omitted,
        t0,
    )
    return entry


def cli_criteria(
    plan: Plan, overrides: list[tuple[str | None, str, float | None]]
) -> dict[str, dict[str, Any]]:
    """Each drill's criteria: the plan's, with the ``--criterion`` overrides applied.

    Raises:
        ConfigError: an override names a drill the plan does not run, or a criterion no drill
            of the plan (or not that drill) has.
    """
    from chaoslib_infer.verdict import criteria_for

    out = {d.name: dict(d.criteria) for d in plan.drills}
    kinds = {d.name: d.kind for d in plan.drills}
    for drill, name, value in overrides:
        targets = [drill] if drill else list(out)
        if drill and drill not in out:
            raise ConfigError(f"--criterion {drill}:{name}: the plan runs no drill {drill!r}")
        applied = False
        for d in targets:
            if name in {c.name for c in criteria_for(kinds[d])}:
                out[d][name] = value
                applied = True
        if not applied:
            raise ConfigError(
                f"--criterion {name}: no drill {('of ' + drill) if drill else 'of the plan'} "
                "has this criterion (see docs/definitions.md, 'Drill criteria')"
            )
    return out


#: Ledger record kinds the service itself made (the lab's autoscaler), not a drill's fault.
SERVICE_OWN_KINDS = frozenset({"scale-out"})


def residue_check(lab: Lab | None, drill_dir: Path) -> list[str]:
    """Faults still in place after a drill's rollbacks: one line each ([] for none).

    Reads the lab's fault ledger (every record still there is a fault no rollback removed,
    except :data:`SERVICE_OWN_KINDS`: the service's own reaction, such as a scale-out its
    autoscaler started, which the ledger holds only so a dead-man can undo it) and the drill's
    Kubernetes state files (``k8s-state/``: a fault whose rollback did not clear it). An
    unreadable ledger is residue too (it may hold a fault still in place).
    """
    out: list[str] = []
    if lab is not None:
        try:
            out += [
                f"lab: {ledger.describe(r)}"
                for r in ledger.pending_faults(lab.state_dir)
                if r.get("kind") not in SERVICE_OWN_KINDS
            ]
        except LabError as exc:
            out.append(f"lab fault ledger unreadable: {exc}")
    with contextlib.suppress(FileNotFoundError):
        from chaoslib_infer.safety.k8s_replay import find_pending

        out += [f"kubernetes: {p.kind} ({p.path.name})" for p in find_pending(drill_dir)]
    return out


def run_drill(
    spec: DrillSpec,
    drill_dir: Path,
    lab: Lab | None,
    base_url: str | None,
    target: dict[str, Any],
    slo_overrides: dict[str, float],
    progress: Progress,
    *,
    stop_conditions: dict[str, Any] | None = None,
    secrets: list[str] | None = None,
    criteria: dict[str, Any] | None = None,
    allow_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one drill's experiment in-process, check for residue, judge it and write its evidence.

    Args:
        spec: the drill (name, experiment path, configuration overrides).
        drill_dir: the drill's evidence folder (created).
        lab: the local lab, or ``None`` for an external target.
        base_url: URL traffic goes to (``None``: the lab's frontend).
        target: the ``summary.json`` target block.
        slo_overrides: ``{metric: threshold}`` (e.g. ``{"p99_e2e_s": 0.5}``).
        progress: where progress lines go.
        stop_conditions: arguments of the stop-conditions control to add (the plan's
            ``stop_conditions:``), or ``None``.
        secrets: values scrubbed from everything the drill writes (see
            :mod:`chaoslib_infer.safety.redact`); the experiment's own secrets are added.
        criteria: threshold overrides of the drill's criteria (``{name: value | "off"}``); the
            drill's own plan ``criteria:`` are used when None. Also given to the experiment as
            its ``infer_criteria`` configuration key (its drill-criteria probe reads it).
        allow_vars: the operator's allowlists as configuration (``infer_allow``,
            ``infer_allow_contexts``, ``infer_allow_namespaces``; see
            :mod:`chaoslib_infer.safety.allowlist`).

    Returns:
        The drill's ``summary.json`` entry.

    Raises:
        ConfigError: the experiment file is malformed.
    """
    experiment = _load_experiment(spec.experiment)
    if stop_conditions:
        _add_guard(experiment, stop_conditions)
    secrets = redact.known_secrets([*(secrets or []), *redact.secrets_from_experiment(experiment)])
    redact.private_dir(drill_dir)
    stale_files = ("records.jsonl", "faults.jsonl", "journal.json", STOP_CONDITION_FILE)
    for stale in (*stale_files, LOAD_ERROR_FILE):
        (drill_dir / stale).unlink(missing_ok=True)
    config_vars: dict[str, Any] = {
        "infer_run_dir": str(drill_dir),
        "infer_base_url": base_url or "",
    }
    if lab is not None:
        config_vars["infer_lab_dir"] = str(lab.state_dir)
    if target.get("kind") == "kubernetes":
        config_vars["infer_k8s_target"] = str(target["file"])
    config_vars.update({f"slo_{k}": v for k, v in slo_overrides.items()})
    crit = dict(spec.criteria if criteria is None else criteria)
    config_vars["infer_criteria"] = ",".join(
        f"{k}={'off' if v is None else v}" for k, v in crit.items()
    )
    config_vars.update(spec.vars)
    config_vars.update(allow_vars or {})  # the operator's allowlists (safety.allowlist)
    settings = {"runtime": experiment.get("runtime") or {"rollbacks": {"strategy": "always"}}}
    ctk_logger = logging.getLogger("chaostoolkit")
    ctk_level, ctk_propagate = ctk_logger.level, ctk_logger.propagate  # put back after the drill
    log_handler = logging.FileHandler(drill_dir / "chaostoolkit.log", encoding="utf-8")
    log_handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s] %(message)s"))
    log_handler.addFilter(redact.RedactingFilter(secrets))
    ctk_logger.addHandler(log_handler)
    ctk_logger.setLevel(logging.DEBUG)
    ctk_logger.propagate = False
    started = time.time()
    progress(f"drill {spec.name}: {experiment.get('title', '')}")
    journal: dict[str, Any]
    try:
        with interrupt_on_sigterm(), no_pause_after_interrupt():
            journal = dict(
                run_experiment(
                    experiment,
                    settings=settings,
                    experiment_vars=(config_vars, {}),
                    event_handlers=[
                        _ProgressHandler(spec.name, progress, drill_dir / "journal.json", secrets)
                    ],
                )
            )
    finally:
        stop_load({"infer_run_dir": str(drill_dir)})
        from chaoslib_infer.locust.control import stop_locust

        stop_locust({"infer_run_dir": str(drill_dir)})  # a locustfile drove the load
        ctk_logger.removeHandler(log_handler)
        ctk_logger.setLevel(ctk_level)
        ctk_logger.propagate = ctk_propagate
        log_handler.close()
        write_residue(drill_dir, residue_check(lab, drill_dir), time.time())
    ended = time.time()
    # scrubbed once, here: the journal file and every evidence file rendered from it
    journal_text = redact.redact_text(json.dumps(journal, indent=2, default=str), secrets)
    journal = json.loads(journal_text)
    write_atomic(drill_dir / "journal.json", journal_text)
    entry = drill_evidence(
        spec.name,
        str(spec.experiment),
        str(experiment.get("title", "")),
        drill_dir,
        journal,
        lab,
        target,
        started,
        ended,
        criteria=crit,
        kind=spec.kind,
    )
    load_error = drill_dir / LOAD_ERROR_FILE
    if load_error.is_file():  # the load control interrupted the drill before any fault
        entry["error"] = redact.redact_text(load_error.read_text(encoding="utf-8"), secrets)
        progress(f"drill {spec.name}: load: {entry['error']}")
    redact.scrub_tree(drill_dir, secrets)
    figures = entry["figures"]
    stop = entry.get("stop_condition")
    if stop:
        progress(
            f"drill {spec.name}: stopped by stop condition {stop.get('guard')}: {stop.get('reason')}"
        )
    progress(f"drill {spec.name}: {entry['status'].upper()} (whole drill: {_headline(figures)})")
    for reason in entry.get("reasons") or []:
        progress(f"  reason: {reason}")
    return entry


_HEADLINE_KEYS = (
    "availability",
    "p99_e2e_s",
    "p99_request_e2e_s",
    "interruption_s",
    "failed_requests",
    "restart_s",
    "replacement_serving_s",
    "duplicate_generations",
    "ejection_s",
    "all_serving_s",
    "survivor_share_ratio",
    "shed_requests",
    "scale_out_s",
    "planned_instances",
    "instances_held",
)


def _headline(figures: dict[str, Any]) -> str:
    """One line of the figures an SRE looks at first (those the drill produced)."""
    parts = []
    # with retries the attempt P99 censors timed-out attempts: say so, and show the per-request one
    retried = figures.get("p99_request_e2e_s") is not None
    notes = {
        "p99_e2e_s": " (attempts; failed ones censored)",
        "p99_request_e2e_s": " (per request, retries included)",
    }
    for key in _HEADLINE_KEYS:
        value = figures.get(key)
        if value is None or isinstance(value, dict | list):
            continue
        text = f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
        parts.append(text + (notes.get(key, "") if retried else ""))
    return ", ".join(parts)


def redacting_progress(progress: Progress, secrets: list[str]) -> Progress:
    """``progress`` with the secrets scrubbed from every line.

    A console that went away (``chaos-infer gameday | head``, a closed terminal, a killed
    parent: ``BrokenPipeError`` / ``OSError`` on write) must not stop the run between a fault
    and its rollback or before the lab is taken down: progress is then dropped, the evidence
    on disk still records everything.
    """
    gone = False

    def _say(msg: str) -> None:
        nonlocal gone
        if gone:
            return
        try:
            progress(redact.redact_text(msg, secrets))
        except OSError:
            gone = True

    return _say


def _acquire_run_lock(out_dir: Path) -> Any:
    """Hold ``out_dir/.gameday.lock`` for the run (one game day per output folder).

    Raises:
        ConfigError: another game day holds it.
    """
    fh = open(out_dir / ".gameday.lock", "a+")  # noqa: SIM115 - held until the run ends
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise ConfigError(f"another game day is running with --out {out_dir}") from None
    return fh


def _recover_previous_lab(lab_dir: Path, progress: Progress) -> None:
    """Roll back faults left in ``lab_dir`` by a killed run and stop a lab it left running."""
    if not (lab_dir / "lab.json").exists():
        return
    result = ledger.rollback(lab_dir)
    if result.pending or result.undone:
        progress(
            f"safety: {len(result.pending)} pending fault record(s) left by a previous run in "
            f"{lab_dir}: rolled back"
        )
        for line in result.undone:
            progress(f"safety:   {line}")
    if result.failed:
        raise LabError(
            f"could not undo {len(result.failed)} fault(s) left in {lab_dir}: {result.failed[0]}"
        )
    old = Lab.attach(lab_dir)
    if old.supervisord_alive():
        progress(f"lab: a lab left running by a previous run in {lab_dir}: taking it down")
        old.down()


def preflight_url(url: str, timeout_s: float = 3.0) -> None:
    """Check that a ``--target`` URL answers before any drill starts: TCP connect and one GET.

    Any HTTP response (even 404/401) counts as reachable; redirects are not followed.

    Args:
        url: the target's base URL (already allowlist-checked).
        timeout_s: connect and read timeout, seconds.

    Raises:
        TargetUnreachable: refused, unresolvable, timed out, or not speaking HTTP.
    """
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn_cls = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    try:
        conn = conn_cls(parts.hostname or "", parts.port, timeout=timeout_s)
        try:
            conn.request("GET", parts.path or "/")
            conn.getresponse().read(65536)
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise TargetUnreachable(f"target {url} unreachable: {reason}; no drill started") from None


def validate_plan(plan: Plan) -> None:
    """Load every experiment of ``plan`` and its stop conditions (nothing is started).

    Raises:
        ConfigError: a malformed experiment (names its file) or stop condition.
    """
    for spec in plan.drills:
        _load_experiment(spec.experiment)
        plan_stop_conditions(plan.path, spec.name)


def run_gameday(
    plan: Plan,
    out_dir: Path,
    *,
    base_url: str | None = None,
    replicas: int | None = None,
    engine: str | None = None,
    slo_overrides: dict[str, float] | None = None,
    progress: Progress = print,
    allow: tuple[str, ...] = (),
    k8s_target: Any = None,
    criteria: list[tuple[str | None, str, float | None]] | None = None,
) -> int:
    """Run every drill of ``plan`` and write the evidence bundle to ``out_dir``.

    Without ``base_url`` it brings up the local lab in ``out_dir/lab`` and takes it down at the end,
    on Ctrl-C and on SIGTERM too. Fault records a killed earlier run left in ``out_dir/lab`` are
    rolled back first (and a lab it left running is taken down); on Kubernetes, the saved states
    it left in ``out_dir/*/k8s-state/`` are replayed first
    (:func:`~chaoslib_infer.safety.k8s_replay.recover_previous_run`). ``summary.json`` is
    written at the start and after each drill with ``"complete": false`` (and ``in_progress``),
    so a run killed mid-drill still leaves a summary that ``chaos-infer report`` renders. A drill
    aborted by a stop condition ends the game day with exit code 1. Secrets
    (:mod:`chaoslib_infer.safety.redact`) are scrubbed from every file before the bundle's
    manifest is written.

    Args:
        allow: extra target allowlist patterns (``--allow``; see
            :mod:`chaoslib_infer.safety.allowlist`).
        criteria: ``--criterion`` overrides ``[(drill or None, name, threshold or None)]``,
            applied over the plan's (a name without a drill applies to the drills that have it).
        k8s_target: a :class:`~chaoslib_infer.platforms.kubernetes.target.K8sTarget` (already
            checked against its allowlist): no lab is brought up, traffic goes to its ``url``
            (allowed because the target file names it), and every drill gets
            ``infer_k8s_target`` = its file.

    Returns:
        The exit code (see the module docstring).

    Raises:
        ConfigError: ``base_url`` outside the allowlist, a malformed experiment or stop condition,
            or another game day running in ``out_dir`` (nothing is started).
        ChaoslibIncompatible: the installed chaoslib lacks what the Ctrl-C / SIGTERM path replaces
            (:func:`chaoslib_infer.chaoslib_hooks.check_chaoslib_hooks`; nothing is started).
    """
    from chaoslib_infer.safety import allowlist as _allow

    if k8s_target is not None:
        # a target file narrows the operator's allowlist, never widens it: its url must be
        # allowed like any other target (--allow, $CHAOS_INFER_ALLOW, the plan's allow:)
        base_url = k8s_target.url
    if base_url:
        check_target(base_url, allow, plan.path)
    # the experiments check again (the load control also runs under `chaos run`): hand them the
    # operator's patterns through configuration, never through os.environ
    contexts, namespaces = _allow.operator_k8s_allow(plan_path=plan.path)
    allow_vars = {
        _allow.CONFIG_KEY: ",".join([*allow, *_allow.plan_allow(plan.path)]),
        _allow.CONFIG_CONTEXTS: ",".join(contexts),
        _allow.CONFIG_NAMESPACES: ",".join(namespaces),
    }
    check_chaoslib_hooks()  # the Ctrl-C / SIGTERM path: nothing is started on an unfit chaoslib
    validate_plan(plan)
    drill_criteria = cli_criteria(plan, criteria or [])
    secrets = redact.known_secrets()
    progress = redacting_progress(progress, secrets)
    redact.private_dir(out_dir)
    run_lock = _acquire_run_lock(out_dir)
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
    if k8s_target is not None:
        target.update(
            kind="kubernetes",
            file=str(Path(k8s_target.source).resolve()),
            context=k8s_target.context,
            namespace=k8s_target.namespace,
            selector=k8s_target.selector,
            # read by the evidence header "kind (engine, replicas replicas)"
            engine=f"pods {k8s_target.selector} in namespace {k8s_target.namespace}",
            replicas="the controller's",
        )
    summary: dict[str, Any] = {
        "plan": plan.name,
        "plan_path": str(plan.path),
        "target": target,
        "started_at": _iso(started),
        "ended_at": None,
        "tool": tool_versions(),
        "complete": False,
        "in_progress": None,
        "drills": [],
    }
    exit_code = EXIT_OK

    def _write_summary() -> None:
        summary["ended_at"] = _iso()
        text = json.dumps(summary, indent=2, default=str)
        write_atomic(out_dir / "summary.json", redact.redact_text(text, secrets))

    def _on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous_term = signal.signal(signal.SIGTERM, _on_term)
    try:
        _write_summary()
        if k8s_target is not None:  # faults a killed run left on the cluster: undo them first
            from chaoslib_infer.safety.k8s_replay import recover_previous_run

            recover_previous_run(out_dir, str(Path(k8s_target.source).resolve()), progress)
        if not base_url:
            _recover_previous_lab(out_dir / "lab", progress)
            progress(
                f"lab: bringing up {n_replicas} {engine_name} replica(s) behind {plan.lab.options.get('gateway', 'HAProxy')} in {out_dir / 'lab'} ..."
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
            summary["in_progress"] = {"drill": spec.name, "started_at": _iso()}
            _write_summary()
            entry = run_drill(
                spec,
                out_dir / spec.name,
                lab,
                base_url,
                target,
                slo_overrides or {},
                progress,
                stop_conditions=plan_stop_conditions(plan.path, spec.name),
                secrets=secrets,
                criteria=drill_criteria[spec.name],
                allow_vars=allow_vars,
            )
            summary["drills"].append(entry)
            summary["in_progress"] = None
            _write_summary()
            if entry.get("stop_condition"):
                summary["stopped_by"] = {"drill": spec.name, **entry["stop_condition"]}
                exit_code = max(exit_code, EXIT_DEVIATED)
                progress("stop condition tripped: rollbacks played; no further drill runs")
                break
            if entry.get("error"):  # e.g. no request succeeded in warm-up: not a Ctrl-C
                summary["error"] = f"drill {spec.name}: {entry['error']}"
                exit_code = EXIT_ERROR
                break
            if entry["status"] == "aborted":
                exit_code = EXIT_INTERRUPTED
                break
        else:
            summary["complete"] = True
        states = [str(d["status"]) for d in summary["drills"]]
        if "failed" in states:  # a failure (residue included) outranks how the run ended
            exit_code = EXIT_DEVIATED
        elif exit_code == EXIT_OK:
            exit_code = verdict_exit_code(states)
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
            verdict = {
                EXIT_OK: "PASSED",
                EXIT_DEVIATED: "FAILED",
                EXIT_ERROR: "ERROR",
                EXIT_INCONCLUSIVE: "INCONCLUSIVE",
            }.get(exit_code, "ABORTED")
            summary["verdict"] = verdict.lower()
            if summary.get("stopped_by"):
                verdict = "STOPPED"
            render_index(out_dir, summary, verdict)
            write_atomic(out_dir / "junit.xml", junit_xml(summary))
            _bundle_runbooks(out_dir, progress)
            redact.scrub_tree(out_dir, secrets)
            write_manifest(out_dir)
            run_lock.close()
    progress(f"game day {verdict}: {out_dir / 'summary.json'}, {out_dir / 'index.html'}")
    return exit_code


def _experiment_title(journal: dict[str, Any], experiment_path: str) -> str:
    title = (journal.get("experiment") or {}).get("title")
    if title:
        return str(title)
    try:
        raw = yaml.safe_load(Path(experiment_path).read_text(encoding="utf-8"))
        return str((raw or {}).get("title", "")) if isinstance(raw, dict) else ""
    except (OSError, ValueError, yaml.YAMLError):
        return ""


def runbooks_dir() -> Path:
    """The project's runbooks: ``$CHAOS_INFER_RUNBOOKS`` or the checkout's ``runbooks/``."""
    env = os.environ.get("CHAOS_INFER_RUNBOOKS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "runbooks"


def _bundle_runbooks(out_dir: Path, progress: Progress) -> None:
    """Copy the runbooks of the drills that ran into ``out_dir/runbooks`` and fill their Evidence
    sections from this run, so the bundle carries each runbook with its latest proof.

    (``chaos-infer report RUN_DIR --runbooks runbooks/`` updates the project's own copies.)
    """
    from chaoslib_infer.evidence.runbooks import fill_runbooks

    source = runbooks_dir()
    if not source.is_dir() or not (out_dir / "summary.json").exists():
        return
    target = out_dir / "runbooks"
    target.mkdir(exist_ok=True)
    for md in source.glob("*.md"):
        write_atomic(target / md.name, md.read_text(encoding="utf-8"))
    try:
        fill_runbooks(out_dir, target)
    except (OSError, ValueError) as exc:  # evidence already recorded must not be lost over this
        progress(f"warning: runbooks not filled: {exc}")


def report_run(run_dir: Path, progress: Progress = print) -> int:
    """Re-render the evidence of an existing game-day folder (``chaos-infer report RUN_DIR``).

    Every drill of ``summary.json`` is rendered again from its folder (journal, records, fault log)
    and the lab's ground-truth files (the lab may be down). A drill that was running when the
    runner died (``summary.json`` ``in_progress``) is added with status ``incomplete``; the
    summary keeps ``"complete": false``. Known secrets are scrubbed (the lab folder only when no
    lab runs there), then the index, JUnit file and manifest are written again.

    Returns:
        0 when rendered.

    Raises:
        ConfigError: no readable ``summary.json`` in ``run_dir``.
    """
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{run_dir}: no summary.json (not a game-day output folder)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{run_dir}/summary.json: unreadable: {exc}") from exc
    if not isinstance(summary, dict) or not isinstance(summary.get("drills", []), list):
        raise ConfigError(f"{run_dir}/summary.json: not a game-day summary")
    lab: Lab | None = None
    lab_running = False
    if (run_dir / "lab" / "lab.json").exists():
        with contextlib.suppress(LabError):
            lab = Lab.attach(run_dir / "lab")
            lab_running = lab.supervisord_alive()
    target = summary.get("target") or {}
    secrets = redact.known_secrets()
    rendered: list[dict[str, Any]] = []
    todo: list[tuple[dict[str, Any], str | None]] = [
        (d, None) for d in summary.get("drills") or [] if isinstance(d, dict)
    ]
    running = summary.get("in_progress")
    if isinstance(running, dict) and running.get("drill"):
        todo.append(
            ({"name": running["drill"], "started_at": running.get("started_at")}, "incomplete")
        )
    for old, forced in todo:
        name = str(old.get("name") or "")
        drill_dir = run_dir / name
        if not name or "/" in name or not drill_dir.is_dir():
            rendered.append(old)
            continue
        try:
            journal = json.loads((drill_dir / "journal.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            journal = {}
        if not isinstance(journal, dict):
            journal = {}
        if journal.get("status") not in ("completed", "failed", "aborted", "interrupted"):
            forced = "incomplete"
        experiment_path = str(old.get("experiment") or "")
        entry = drill_evidence(
            name,
            experiment_path,
            _experiment_title(journal, experiment_path),
            drill_dir,
            journal,
            lab,
            target,
            str(old.get("started_at") or ""),
            str(old.get("ended_at") or _iso()),
            status=forced,
            criteria=old.get("criteria_overrides") or None,
        )
        if forced:
            entry["complete"] = False
        rendered.append(entry)
        progress(f"report: {name}: {entry['status']}")
    summary["drills"] = rendered
    summary["reported_at"] = _iso()
    write_atomic(
        run_dir / "summary.json",
        redact.redact_text(json.dumps(summary, indent=2, default=str), secrets),
    )
    statuses = [d.get("status") for d in rendered]
    if not summary.get("complete"):
        verdict = "INCOMPLETE"
    elif summary.get("stopped_by"):
        verdict = "STOPPED"
    else:
        code = verdict_exit_code([str(s) for s in statuses])
        verdict = {0: "PASSED", 1: "FAILED", 2: "ERROR", 3: "INCONCLUSIVE"}.get(code, "ABORTED")
    render_index(run_dir, summary, verdict)
    write_atomic(run_dir / "junit.xml", junit_xml(summary))
    _bundle_runbooks(run_dir, progress)
    redact.scrub_tree(run_dir, secrets, skip=[run_dir / "lab"] if lab_running else [])
    write_manifest(run_dir)
    progress(f"report {verdict}: {run_dir / 'index.html'}")
    return 0


def default_plan_path() -> Path:
    """Return the default plan ``drills/gameday.yaml`` (from the checkout, or ``$CHAOS_INFER_PLAN``)."""
    env = os.environ.get("CHAOS_INFER_PLAN")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "drills" / "gameday.yaml"


def default_k8s_plan_path() -> Path:
    """Return the default Kubernetes plan ``drills/gameday-k8s.yaml`` (or ``$CHAOS_INFER_K8S_PLAN``)."""
    env = os.environ.get("CHAOS_INFER_K8S_PLAN")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "drills" / "gameday-k8s.yaml"
