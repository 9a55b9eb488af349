"""One drill's run: its experiment loaded and run in-process by chaoslib (with the stop-conditions
control added), the load stopped, residue checked, the journal scrubbed and its evidence written.
Also each drill's criteria with the ``--criterion`` overrides applied.

Split out of :mod:`chaoslib_infer.gameday` (issue 12), which runs these drills one after another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ChaosException
from chaoslib.experiment import ensure_experiment_is_valid, run_experiment
from chaoslib.loader import load_experiment

from chaoslib_infer.chaoslib_hooks import interrupt_on_sigterm, no_pause_after_interrupt
from chaoslib_infer.controls.guard import STOP_CONDITION_FILE
from chaoslib_infer.controls.load import LOAD_ERROR_FILE, WARMUP_FILE, stop_load
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.detection import DetectionSetup, apply_detection, drill_detection
from chaoslib_infer.evidence.detection_view import detection_line
from chaoslib_infer.evidence.journal import read_journal
from chaoslib_infer.evidence.render import write_atomic
from chaoslib_infer.evidence.verdicts import write_residue
from chaoslib_infer.gameday_evidence import drill_evidence, headline
from chaoslib_infer.lab import ledger
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.load.records import read_records
from chaoslib_infer.plan import DrillSpec, Plan
from chaoslib_infer.run_progress import Progress, ProgressHandler
from chaoslib_infer.safety import redact
from chaoslib_infer.verdict.policy import VerdictPolicy, make_policy

__all__ = [
    "SERVICE_OWN_KINDS",
    "cli_criteria",
    "drill_policy",
    "load_drill_experiment",
    "residue_check",
    "run_drill",
]


def load_drill_experiment(path: Path) -> dict[str, Any]:
    """Load and validate a drill's Chaos Toolkit experiment file (nothing is run).

    Raises:
        ConfigError: the file is unreadable, does not parse, or is not a valid experiment
            (one line, naming the file).
    """
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


def _declare_load_vars(experiment: dict[str, Any], config_vars: dict[str, Any]) -> None:
    """Declare in ``experiment``'s configuration each load setting ``config_vars`` gives that
    it does not declare itself: chaoslib drops an override of an undeclared key, so an
    operator's own experiment takes ``vars: {load_retry_attempts: 3}`` too (the background-load
    control reads it: :func:`chaoslib_infer.controls.load.control_arguments`)."""
    from chaoslib_infer.load.options import LOAD_SETTINGS

    declared = experiment.setdefault("configuration", {})
    for setting in LOAD_SETTINGS:
        if setting.var in config_vars and setting.var not in declared:
            declared[setting.var] = config_vars[setting.var]


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
        from chaoslib_infer.k8s_replay import find_pending

        out += [f"kubernetes: {p.kind} ({p.path.name})" for p in find_pending(drill_dir)]
    return out


def _records(drill_dir: Path) -> list[dict[str, Any]]:
    path = drill_dir / "records.jsonl"
    return list(read_records(path)) if path.is_file() else []


def drill_policy(spec: DrillSpec, slo_overrides: dict[str, float] | None = None) -> VerdictPolicy:
    """The verdict policy of one drill: its plan's (or ``--verdict-policy``'s) name, its
    expected incidents per month, and the availability SLO whose monthly budget the fault spends
    (:mod:`chaoslib_infer.verdict.policy`): the drill's ``vars: {slo_availability: ...}``, else
    the run's ``--slo availability=``, else 0.999 (the order its experiment's configuration
    takes them in, so its probes and its verdict judge one budget).

    Raises:
        ConfigError: a value the policy refuses (one line).
    """
    try:
        return make_policy(
            spec.verdict_policy,
            spec.incidents_per_month,
            spec.vars.get("slo_availability", (slo_overrides or {}).get("availability")),
        )
    except ValueError as exc:
        raise ConfigError(f"drill {spec.name}: {exc}") from None


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
    detection: DetectionSetup | None = None,
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
        detection: where the drill's alerts are read after it (:mod:`chaoslib_infer.evidence.
            detection`); None: not read.

    Returns:
        The drill's ``summary.json`` entry.

    Raises:
        ConfigError: the experiment file is malformed.
    """
    experiment = load_drill_experiment(spec.experiment)
    if stop_conditions:
        _add_guard(experiment, stop_conditions)
    secrets = redact.known_secrets([*(secrets or []), *redact.secrets_from_experiment(experiment)])
    redact.private_dir(drill_dir)
    stale_files = ("records.jsonl", "faults.jsonl", "journal.json", STOP_CONDITION_FILE)
    for stale in (*stale_files, LOAD_ERROR_FILE, WARMUP_FILE):
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
    policy = drill_policy(spec, slo_overrides)
    config_vars["infer_verdict_policy"] = policy.name  # the drill-criteria probe judges by it
    config_vars["infer_incidents_per_month"] = policy.incidents_per_month
    config_vars.update(spec.vars)
    config_vars.update(allow_vars or {})  # the operator's allowlists (safety.allowlist)
    _declare_load_vars(experiment, config_vars)
    settings = {"runtime": experiment.get("runtime") or {"rollbacks": {"strategy": "always"}}}
    ctk_logger = logging.getLogger("chaostoolkit")
    ctk_level, ctk_propagate = ctk_logger.level, ctk_logger.propagate  # put back after the drill
    log_handler = logging.FileHandler(drill_dir / "chaostoolkit.log", encoding="utf-8")
    log_handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s] %(message)s"))
    log_handler.addFilter(redact.RedactingFilter(secrets))
    ctk_logger.addHandler(log_handler)
    ctk_logger.setLevel(logging.DEBUG)
    ctk_logger.propagate = False
    if detection is not None and detection.exporter is not None:
        detection.exporter.follow(drill_dir / "records.jsonl")  # the client's counters
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
                        ProgressHandler(spec.name, progress, drill_dir / "journal.json", secrets)
                    ],
                )
            )
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM where chaoslib does not catch it (a control's after-hook: the load's
        # after window, past the rollbacks): the journal so far is on disk; the drill is judged
        # from it as interrupted (aborted), so what it already measured is not lost; none
        # saved yet: interrupted before the run started
        so_far = read_journal(drill_dir)
        if so_far is None:
            raise
        progress(f"drill {spec.name}: interrupted; judging what was recorded")
        journal = {**so_far, "status": "interrupted"}
    finally:
        stop_load({"infer_run_dir": str(drill_dir)})
        from chaoslib_infer.locust.control import stop_locust

        stop_locust({"infer_run_dir": str(drill_dir)})  # a locustfile drove the load
        ctk_logger.removeHandler(log_handler)
        ctk_logger.setLevel(ctk_level)
        ctk_logger.propagate = ctk_propagate
        log_handler.close()
        residue = residue_check(lab, drill_dir)
        write_residue(drill_dir, residue, time.time())
        progress(
            f"drill {spec.name}: residue check: "
            + (
                f"{len(residue)} fault(s) left behind: {'; '.join(residue)}"
                if residue
                else "no fault left"
            )
        )
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
        policy=policy,
        detect=(
            None
            if detection is None
            else lambda e: apply_detection(
                e,
                drill_detection(detection, e, _records(drill_dir), spec.kind or spec.name),
                drill_dir,
            )
        ),
    )
    load_error = drill_dir / LOAD_ERROR_FILE
    if load_error.is_file():  # the load control interrupted the drill before any fault
        entry["error"] = redact.redact_text(load_error.read_text(encoding="utf-8"), secrets)
        progress(f"drill {spec.name}: load: {entry['error']}")
    if entry.get("detection"):
        progress(f"drill {spec.name}: detection: {detection_line(entry['detection'])}")
    redact.scrub_tree(drill_dir, secrets)
    figures = entry["figures"]
    stop = entry.get("stop_condition")
    if stop:
        progress(
            f"drill {spec.name}: stopped by stop condition {stop.get('guard')}: {stop.get('reason')}"
        )
    progress(f"drill {spec.name}: {entry['status'].upper()} (whole drill: {headline(figures)})")
    for reason in entry.get("reasons") or []:
        progress(f"  reason: {reason}")
    for note in (entry.get("verdict") or {}).get("notes") or []:
        if note.startswith("load: "):  # Locust's closed loop, its lost workers (any state)
            progress(f"  {note}")
    return entry
