"""The main job: run a game-day plan of drills against the local lab (or a given target).

Data flow of one drill: plan -> lab (brought up here unless a target is given) -> Chaos Toolkit
experiment run in-process (the load control starts the background load, the steady-state hypothesis
is checked, the fault is injected, the hypothesis is checked again, rollbacks always play) -> journal
+ records + lab ground truth -> figures -> evidence (Markdown, HTML, plot) -> ``summary.json``.

Exit codes (the drills' verdicts, :mod:`chaoslib_infer.verdict`): 0 every drill passed; 1 a drill
failed (a criterion broken, a fault left behind, a defect before the fault); 2 error (bad input,
unreachable target, a drill the tool could not run); 3 a drill was inconclusive (the others
passed); 130 interrupted (Ctrl-C / SIGTERM; rollbacks played and the lab taken down). A stop
condition (a safety floor the service fell below, ``docs/safety.md``) aborts its drill (state
``aborted``, its reason ``stopped: ...``) and stops the game day with exit code 1 and verdict
``STOPPED``: the service was damaged past the plan's floor, a failure for CI, not an operator's
interruption (130).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from chaoslib_infer.chaoslib_hooks import check_chaoslib_hooks
from chaoslib_infer.drill_run import (
    SERVICE_OWN_KINDS,
    cli_criteria,
    load_drill_experiment,
    residue_check,
    run_drill,
)
from chaoslib_infer.errors import ConfigError, InferChaosError, TargetUnreachable
from chaoslib_infer.evidence.bundle import (
    JUNIT_INCONCLUSIVE_DEFAULT,
    junit_xml,
    tool_versions,
    write_manifest,
)
from chaoslib_infer.evidence.detection_plan import plan_detection, start_detection
from chaoslib_infer.evidence.render import render_index, write_atomic
from chaoslib_infer.gameday_evidence import K8S_OMITTED, drill_evidence, headline, verdict_table
from chaoslib_infer.lab import ledger
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.plan import Plan
from chaoslib_infer.report import bundle_runbooks, report_run, runbooks_dir
from chaoslib_infer.run_progress import Progress, iso, redacting_progress
from chaoslib_infer.safety import redact
from chaoslib_infer.safety.allowlist import check_target
from chaoslib_infer.safety.guard import plan_stop_conditions
from chaoslib_infer.verdict import exit_code as verdict_exit_code

# This module is the game day itself (run_gameday, validate_plan, preflight_url, the run lock,
# the recovery of a previous run's lab, the default plans). One drill's run is in
# chaoslib_infer.drill_run, its evidence in chaoslib_infer.gameday_evidence, the progress and
# journal plumbing in chaoslib_infer.run_progress, ``chaos-infer report`` and the runbooks in
# chaoslib_infer.report (issue 12). The names other code and the tests import from here are
# re-exported below; ``_headline`` and ``_load_experiment`` (now public there as ``headline``
# and ``load_drill_experiment``) under their old private names too.
_headline = headline
_load_experiment = load_drill_experiment

__all__ = [
    "EXIT_DEVIATED",
    "EXIT_ERROR",
    "EXIT_INCONCLUSIVE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "K8S_OMITTED",
    "SERVICE_OWN_KINDS",
    "Progress",
    "_headline",
    "_load_experiment",
    "cli_criteria",
    "default_k8s_plan_path",
    "default_plan_path",
    "gameday_verdict",
    "drill_evidence",
    "final_exit_code",
    "headline",
    "load_drill_experiment",
    "preflight_url",
    "redacting_progress",
    "report_run",
    "residue_check",
    "run_drill",
    "run_gameday",
    "runbooks_dir",
    "validate_plan",
]

EXIT_OK = 0
EXIT_DEVIATED = 1
EXIT_ERROR = 2
EXIT_INCONCLUSIVE = 3
EXIT_INTERRUPTED = 130


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
    """Load every experiment of ``plan``, its load settings and its stop conditions (nothing is
    started).

    Raises:
        ConfigError: a malformed experiment (names its file), a bad load setting (names the
            experiment, the drill and ``load_<name>``) or stop condition.
    """
    from chaoslib_infer.controls.load import settings_in_force

    for spec in plan.drills:
        experiment = load_drill_experiment(spec.experiment)
        try:  # a bad load setting is refused here, before the lab comes up
            settings_in_force(experiment, spec.vars)
        except ValueError as exc:
            raise ConfigError(f"{spec.experiment}: drill {spec.name}: {exc}") from None
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
    junit_inconclusive: str = JUNIT_INCONCLUSIVE_DEFAULT,
    label: str = "game day",
    prometheus_url: str | None = None,
    rules: list[Path] | None = None,
    history: str | None = None,
    fail_on_regression: bool = False,
) -> int:
    """Run every drill of ``plan`` and write the evidence bundle to ``out_dir``.

    Without ``base_url`` it brings up the local lab in ``out_dir/lab`` and takes it down at the end,
    on Ctrl-C and on SIGTERM too. Fault records a killed earlier run left in ``out_dir/lab`` are
    rolled back first (and a lab it left running is taken down); on Kubernetes, the saved states
    it left in ``out_dir/*/k8s-state/`` are replayed first
    (:func:`~chaoslib_infer.k8s_replay.recover_previous_run`). ``summary.json`` is
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
            (which the command line has checked against the operator's URL patterns: a target
            file never allows itself), and every drill gets
            ``infer_k8s_target`` = its file.
        junit_inconclusive: how ``junit.xml`` writes an inconclusive drill, ``failure``
            (default) or ``skipped`` (``--junit-inconclusive``;
            :func:`chaoslib_infer.evidence.bundle.junit_xml`), recorded in ``summary.json``
            (``junit_inconclusive``) so ``chaos-infer report`` writes it the same way.
        label: what the last line calls the run, ``LABEL VERDICT: ...`` (``game day``;
            ``drill NAME`` for ``chaos-infer drill run NAME``).
        prometheus_url: read each drill's detection from this Prometheus (``--prometheus``,
            the plan's ``detection: {prometheus: URL}``) instead of the lab's own server.
        rules: the team's rule files loaded into the lab's Prometheus (``--rules``).
        history: the history store a complete run is appended to and compared with
            (:mod:`chaoslib_infer.history`; None: not recorded); the comparison goes to
            ``summary.json`` ``history``, ``index.html`` and the console.
        fail_on_regression: ``--fail-on-regression``: a drill the comparison reads
            ``regressed`` makes the exit code 1 (from 0 or 3) and adds a junit failure; the
            drills' own verdicts are unchanged.

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
    detection_plan = plan_detection(plan, prometheus_url, rules)  # bad URL/rules: exit 2 here
    secrets = redact.known_secrets()
    progress = redacting_progress(progress, secrets)
    redact.private_dir(out_dir)
    run_lock = _acquire_run_lock(out_dir)
    started = time.time()
    lab: Lab | None = None
    monitoring: Any = None
    detection: Any = None
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
        # the lab's settings (the history store's service and gateway settings, issue 32)
        "lab": None if base_url else lab_settings(plan),
        "started_at": iso(started),
        "ended_at": None,
        "tool": tool_versions(),
        "complete": False,
        "in_progress": None,
        "junit_inconclusive": junit_inconclusive,
        "drills": [],
    }
    exit_code = EXIT_OK

    def _write_summary() -> None:
        summary["ended_at"] = iso()
        text = json.dumps(summary, indent=2, default=str)
        write_atomic(out_dir / "summary.json", redact.redact_text(text, secrets))

    def _on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous_term = signal.signal(signal.SIGTERM, _on_term)
    try:
        _write_summary()
        if k8s_target is not None:  # faults a killed run left on the cluster: undo them first
            from chaoslib_infer.k8s_replay import recover_previous_run

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
        monitoring, detection = start_detection(detection_plan, lab, slo_overrides, progress)
        for spec in plan.drills:
            if lab is not None:
                lab.wait_healthy(60.0)
            summary["in_progress"] = {"drill": spec.name, "started_at": iso()}
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
                detection=detection,
            )
            entry.setdefault("settings", drill_settings(spec))  # the client's: issue 32
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
        exit_code = final_exit_code(exit_code, [str(d["status"]) for d in summary["drills"]])
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
            if monitoring is not None:
                monitoring.close()
            if lab is not None:
                progress("lab: taking down")
                lab.down()
        finally:
            signal.signal(signal.SIGTERM, previous_term)
            verdict = gameday_verdict(exit_code, bool(summary.get("stopped_by")))
            summary["verdict"] = verdict.lower()
            _write_summary()
            if history is not None:
                summary["history"] = record_history(summary, out_dir, history, progress)
                summary["history"]["fail_on_regression"] = fail_on_regression
                exit_code = regression_exit_code(exit_code, summary["history"])
                _write_summary()
            render_index(out_dir, summary, verdict)
            write_atomic(out_dir / "junit.xml", junit_xml(summary))
            bundle_runbooks(out_dir, progress)
            redact.scrub_tree(out_dir, secrets)
            write_manifest(out_dir)
            run_lock.close()
    if len(summary["drills"]) > 1:  # each drill's verdict at a glance, after the long run
        for line in verdict_table(summary["drills"]):
            progress(line)
    progress(f"{label} {verdict}: {out_dir / 'summary.json'}, {out_dir / 'index.html'}")
    return exit_code


def record_history(
    summary: dict[str, Any], out_dir: Path, where: str, progress: Progress
) -> dict[str, Any]:
    """Append a finished run to the history store ``where`` and compare its drills with their
    history (:func:`chaoslib_infer.history.record_summary`); ``summary.json``'s ``history``
    block. A run that did not complete, or a store that cannot be written, is not recorded:
    the block says why (``error``) and one line is printed; the evidence is written either way.
    """
    from chaoslib_infer.history import record_summary, shown_url

    if not summary.get("complete"):
        return {"store": shown_url(where), "error": "the run did not complete: not recorded"}
    try:
        return record_summary(summary, out_dir, where, progress)
    except Exception as exc:  # the evidence comes first: a store failure is one line
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        progress(f"history: not recorded: {why}")
        return {"store": shown_url(where), "error": why}


def regression_exit_code(exit_code: int, history: dict[str, Any]) -> int:
    """The exit code once the history comparison is in (``--fail-on-regression``): 1 when
    ``history["fail_on_regression"]`` and a drill regressed and the run would have exited 0 or
    3; else ``exit_code`` (a failed, errored or interrupted run keeps its own code)."""
    if history.get("fail_on_regression") and history.get("regressed"):
        if exit_code in (EXIT_OK, EXIT_INCONCLUSIVE):
            return EXIT_DEVIATED
    return exit_code


def lab_settings(plan: Plan) -> dict[str, Any]:
    """The plan's lab as ``summary.json`` ``lab`` records it: ``memory_limit_mb`` and the
    options of ``Lab.up`` (gateway, gateway_retry, engine_args, nodes, ...)."""
    return {"memory_limit_mb": plan.lab.memory_limit_mb, **plan.lab.options}


def drill_settings(spec: Any) -> dict[str, Any]:
    """A drill's client settings as ``summary.json`` records them (``settings``): the load
    settings in force (:func:`chaoslib_infer.controls.load.settings_in_force`; None for a
    locustfile) and the plan's ``vars`` for the drill. Empty when the experiment cannot be read."""
    from chaoslib_infer.controls.load import settings_in_force

    try:
        load = settings_in_force(load_drill_experiment(spec.experiment), spec.vars)
    except (ConfigError, ValueError):
        return {}
    return {"load": load, "vars": dict(spec.vars)}


def final_exit_code(so_far: int, states: list[str]) -> int:
    """The game day's exit code once its loop of drills has ended.

    Args:
        so_far: how the loop ended: :data:`EXIT_INTERRUPTED` (a drill aborted by Ctrl-C /
            SIGTERM: the game day is incomplete), :data:`EXIT_ERROR` (a drill the tool could
            not run), :data:`EXIT_DEVIATED` (a stop condition tripped) or :data:`EXIT_OK`.
        states: the drills' states, in order.

    Returns:
        130 for an interrupted game day whatever its earlier drills said (it is aborted, its
        verdict ``ABORTED``: README, "Exit code"); else 1 when a drill failed (a failure, residue
        included, outranks an error); else ``so_far`` when the loop stopped early, or the
        drills' own code (:func:`chaoslib_infer.verdict.exit_code`).
    """
    if so_far == EXIT_INTERRUPTED:
        return EXIT_INTERRUPTED
    if "failed" in states:
        return EXIT_DEVIATED
    return verdict_exit_code(states) if so_far == EXIT_OK else so_far


def gameday_verdict(exit_code: int, stopped: bool) -> str:
    """The game day's verdict word (console, ``index.html``; lower case in ``summary.json``
    ``verdict``).

    Args:
        exit_code: the game day's exit code (module docstring).
        stopped: a stop condition aborted a drill (``summary["stopped_by"]``).

    Returns:
        ``STOPPED`` when a stop condition tripped (exit code 1, unless a drill errored first:
        2), else ``PASSED`` (0), ``FAILED`` (1), ``ERROR`` (2), ``INCONCLUSIVE`` (3) or
        ``ABORTED`` (130, Ctrl-C / SIGTERM).
    """
    if stopped and exit_code == EXIT_DEVIATED:
        return "STOPPED"
    return {
        EXIT_OK: "PASSED",
        EXIT_DEVIATED: "FAILED",
        EXIT_ERROR: "ERROR",
        EXIT_INCONCLUSIVE: "INCONCLUSIVE",
    }.get(exit_code, "ABORTED")


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
