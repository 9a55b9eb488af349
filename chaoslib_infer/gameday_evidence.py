"""One drill's evidence: figures from its folder and the lab's ground truth, the verdict, the
rendered Markdown/HTML/plots, and the console headline of its figures.

Split out of :mod:`chaoslib_infer.gameday` (issue 12). Used right after a drill
(:func:`chaoslib_infer.drill_run.run_drill`) and to re-render a run folder
(:func:`chaoslib_infer.report.report_run`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.controls.guard import read_stop_condition
from chaoslib_infer.controls.load import LOAD_ERROR_FILE, WARMUP_FILE
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.detection import append_detection_section, reapply_saved_detection
from chaoslib_infer.evidence.figures import drill_figures, read_jsonl, unix_time
from chaoslib_infer.evidence.hypothesis import steady_state_outline
from chaoslib_infer.evidence.journal import failed_activities, hypothesis_results
from chaoslib_infer.evidence.plots import drill_plots
from chaoslib_infer.evidence.render import render_drill
from chaoslib_infer.evidence.verdicts import drill_verdict
from chaoslib_infer.lab.fleet import Lab
from chaoslib_infer.load.clientside import CLIENT_FIGURES
from chaoslib_infer.load.records import read_records
from chaoslib_infer.locust.control import CO_NOTE, LOCUST_FILE
from chaoslib_infer.measure.rerun import LEDGER_FIGURES
from chaoslib_infer.plan import drill_kind
from chaoslib_infer.run_progress import iso
from chaoslib_infer.verdict.policy import VerdictPolicy

__all__ = [
    "K8S_OMITTED",
    "drill_evidence",
    "experiment_title",
    "headline",
    "locust_load",
    "verdict_table",
]

#: Why a Kubernetes drill's evidence has no lab ground truth (shown in its ground-truth table).
K8S_OMITTED = (
    "omitted on a Kubernetes target: cgroup OOM counters, supervisor events, the HAProxy log and "
    "the engine's generation ledger (duplicates) exist only in the local lab; the cluster's own "
    "record of each fault is in faults.jsonl"
)


def _haproxy_retries(state_dir: Path, drill_dir: Path) -> int | None:
    """Retries HAProxy made for this drill's requests (its request log's ``%rc``,
    :func:`chaoslib_infer.lab.requestlog.gateway_retries`); None without records or log."""
    from chaoslib_infer.lab.haproxy import parse_request_log
    from chaoslib_infer.lab.requestlog import gateway_retries
    from chaoslib_infer.lab.statedir import REQUEST_LOG

    path = drill_dir / "records.jsonl"
    log = state_dir / REQUEST_LOG
    if not path.exists() or not log.exists():
        return None
    ids = {str(r["request_id"]) for r in read_records(path) if r.get("request_id")}
    return gateway_retries(parse_request_log(log), ids)


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


def _replica_map(lab: Lab | None) -> dict[str, str]:
    """Request id -> replica from the lab's engine ledger and HAProxy log ({} off the lab)."""
    if lab is None:
        return {}
    from chaoslib_infer.activities.health import lab_replica_map

    try:
        return lab_replica_map(lab)
    except (OSError, ValueError):
        return {}


def locust_load(
    drill_dir: Path, started: float | None = None
) -> tuple[dict[str, Any] | None, list[str]]:
    """What a Locust-driven drill's load control left in ``<drill>/locust.json``
    (:mod:`chaoslib_infer.locust.control`): the ground-truth block and the lost-worker lines.

    Args:
        drill_dir: the drill folder.
        started: drill start (unix s), to say when a worker was found dead relative to it.

    Returns:
        ``(load, lost)``: ``load`` is None when the drill had no Locust load (no file), else
        ``{"engine": "locust", "locustfile", "users", "processes", "note", "workers_lost":
        [{"pid", "found_dead_at"}]}`` (``note``: the closed-loop warning, ``CO_NOTE`` when the
        file has none); ``lost``: one line per lost worker naming its pid and when it was found
        dead. An unreadable file still says the load was Locust's, with its workers unknown.
    """
    path = drill_dir / LOCUST_FILE
    if not path.is_file():
        return None, []
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        note = f"{CO_NOTE}; {LOCUST_FILE} is unreadable ({exc}): lost workers unknown"
        return {"engine": "locust", "note": note}, []
    lost = [w for w in info.get("workers_lost") or [] if isinstance(w, dict)]
    load = {
        "engine": "locust",
        "locustfile": info.get("locustfile"),
        "users": info.get("users"),
        "processes": info.get("processes"),
        "note": str(info.get("note") or CO_NOTE),
        "workers_lost": lost,
    }
    lines = []
    for w in lost:
        at = w.get("found_dead_at")
        when = "at an unknown time"
        if isinstance(at, int | float):
            when = f"at {iso(at)}"
            if started is not None:
                when += f", {at - started:+.1f} s from the drill start"
        lines.append(
            f"Locust worker pid {w.get('pid')} died during the drill (found dead {when}): the "
            "offered load dropped and its attempts in flight have no record"
        )
    return load, lines


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
    policy: VerdictPolicy | None = None,
    detect: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Compute one drill's figures from its folder and the lab's ground truth, judge it, and write
    its evidence.

    Used right after a drill (:func:`chaoslib_infer.drill_run.run_drill`) and to re-render an
    existing run folder (:func:`chaoslib_infer.report.report_run`, ``chaos-infer report``).

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
        policy: the verdict policy (default: the ``default`` policy, 1 incident/month, 0.999).
        detect: called with the entry once judged, before the plots: reads and judges the
            drill's alerts (:mod:`chaoslib_infer.evidence.detection`); None: the drill's saved
            ``detection.json``, if any, is applied again (a re-render).

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
        if "gateway_retries" not in figures:  # HAProxy: its log's retries (%rc), retry cost
            figures["gateway_retries"] = _haproxy_retries(lab.state_dir, drill_dir)
    ledger_measured = any(e.get("event", "generation") == "generation" for e in ledger_entries)
    if target.get("kind") == "kubernetes":
        ground.setdefault("lab_only_figures", K8S_OMITTED)
    if not ledger_measured:
        # no engine ledger (a cluster, a URL, llama.cpp): a count of 0 would read as "no
        # duplicates"; the figure is unmeasured
        figures["duplicates"] = None
        for ledger_figure in (*LEDGER_FIGURES, "frozen_completed"):
            if ledger_figure in figures:
                figures[ledger_figure] = None
    records = (
        read_records(drill_dir / "records.jsonl") if (drill_dir / "records.jsonl").exists() else []
    )
    load_error_file = drill_dir / LOAD_ERROR_FILE
    load_error = (
        load_error_file.read_text(encoding="utf-8").strip() if load_error_file.is_file() else None
    )
    warmup = _warmup_finding(drill_dir)
    if warmup is not None:
        ground["load_warmup"] = warmup
    t0, t1 = unix_time(started), unix_time(ended)
    locust, lost = locust_load(drill_dir, t0)
    if locust is not None:  # closed loop, lost workers: docs/definitions.md, "Send time"
        ground["load"] = locust
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
            closed_loop=locust["note"] if locust is not None else None,
            load_lost=lost,
            warmup=warmup,
            client={k: figures[k] for k in CLIENT_FIGURES if k in figures},
            policy=policy,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # the fault's error-budget cost is the verdict's (its windows): in the figures too
    budget = {r["criterion"]: r.get("value") for r in verdict.rows}
    for key in BUDGET_FIGURES:
        figures[key] = budget.get(key)
    status = status or verdict.state
    entry: dict[str, Any] = {
        "name": name,
        "experiment": experiment_path,
        "status": status,
        "reasons": verdict.reasons,
        "verdict": verdict.as_dict(),
        "criteria_overrides": dict(criteria or {}),
        "verdict_policy": (policy or VerdictPolicy()).as_dict(),
        "hypothesis": hyp,
        "steady_state": steady_state_outline(journal),
        "started_at": started if isinstance(started, str) else iso(started),
        "ended_at": ended if isinstance(ended, str) else iso(ended),
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
    if detect is not None:  # the drill's alerts, read and judged (evidence.detection)
        detect(entry)
    else:  # chaos-infer report: the detection read after the drill, if any
        reapply_saved_detection(entry, drill_dir)
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
    append_detection_section(drill_dir, entry)
    return entry


def _warmup_finding(drill_dir: Path) -> str | None:
    """What the service did when nothing succeeded in the load's warm-up (``warmup.json``'s
    ``finding``, :func:`chaoslib_infer.controls.load.warmup_finding`), or None."""
    try:
        doc = json.loads((drill_dir / WARMUP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    finding = doc.get("finding") if isinstance(doc, dict) else None
    return str(finding) if finding else None


#: The verdict's error-budget figures copied into a drill's figures (``verdict/budget.py``).
BUDGET_FIGURES = ("budget_cost_s", "budget_share", "burn_rate_5m", "burn_rate_1h", "fast_burn_page")

_HEADLINE_KEYS = (
    "availability",
    "request_availability",
    *BUDGET_FIGURES,
    "p99_e2e_s",
    "p99_request_e2e_s",
    "interruption_s",
    "failed_requests",
    "restart_s",
    "replacement_serving_s",
    "duplicate_generations",
    "wasted_tokens",
    "rerun_generations",
    "fault_cut_generations",
    "frozen_completed",
    "ejection_s",
    "all_serving_s",
    "survivor_share_ratio",
    "shed_requests",
    "scale_out_s",
    "planned_instances",
    "instances_held",
)


def headline(figures: dict[str, Any]) -> str:
    """One line of the figures an SRE looks at first (those the drill produced)."""
    parts = []
    # with retries the attempt P99 censors timed-out attempts: say so, and show the per-request one
    retried = figures.get("p99_request_e2e_s") is not None
    notes = {  # with retries a failed attempt is not a lost request: say which is which
        "availability": " (attempts)",
        "request_availability": " (per request, retries included)",
        "failed_requests": " (attempts)",
        "p99_e2e_s": " (attempts; failed ones censored)",
        "p99_request_e2e_s": " (per request, retries included)",
    }
    for key in _HEADLINE_KEYS:
        value = figures.get(key)
        if value is None or isinstance(value, dict | list):
            continue
        text = f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
        parts.append(text + (notes.get(key, "") if retried else ""))
    if figures.get("replica_exits"):  # a crash told whole: exits, their codes, restarts
        codes = ", ".join(f"{c} x{n}" for c, n in (figures.get("exit_codes") or {}).items())
        parts.append(
            f"replica_exits={figures['replica_exits']} ({codes}), "
            f"replica_restarts={figures.get('replica_restarts')}"
        )
    return ", ".join(parts)


def verdict_table(drills: list[dict[str, Any]], width: int = 100) -> list[str]:
    """The game day's closing table, one line per drill: name, verdict, first reason (cut to
    ``width`` characters with ``...``; the whole reasons are printed with each drill and kept in
    ``summary.json``) and how many more reasons follow.

    Args:
        drills: ``summary.json``'s ``drills`` entries (``name``, ``status``, ``reasons``).
        width: the most characters of the first reason shown.

    Returns:
        The lines, a header first; [] without drills.
    """
    if not drills:
        return []
    name_w = max(len("drill"), *(len(str(d.get("name", ""))) for d in drills))
    out = [f"{'drill':<{name_w}}  {'verdict':<12}  first reason"]
    for d in drills:
        reasons = [str(r) for r in d.get("reasons") or []]
        first = reasons[0] if reasons else ""
        if len(first) > width:
            first = first[: width - 3] + "..."
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        status = str(d.get("status", "")).upper()
        out.append(f"{d.get('name', '')!s:<{name_w}}  {status:<12}  {first}{more}".rstrip())
    return out


def experiment_title(journal: dict[str, Any], experiment_path: str) -> str:
    """The experiment's title: from the journal, else from its file ("" when unreadable)."""
    title = (journal.get("experiment") or {}).get("title")
    if title:
        return str(title)
    try:
        raw = yaml.safe_load(Path(experiment_path).read_text(encoding="utf-8"))
        return str((raw or {}).get("title", "")) if isinstance(raw, dict) else ""
    except (OSError, ValueError, yaml.YAMLError):
        return ""
