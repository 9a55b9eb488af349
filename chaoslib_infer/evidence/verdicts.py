"""Gather a drill's facts from its run folder and the lab, then judge it.

The glue between the evidence (journal, records, figures, ground truth, the lab's ledger) and
:func:`chaoslib_infer.verdict.judge_drill`. The residue check (``residue.json``, written by the
game day right after the rollbacks) is read back here, so a re-rendered run keeps its verdict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.figures import replica_count_series
from chaoslib_infer.evidence.journal import drill_status, failed_activities, method_findings
from chaoslib_infer.verdict import (
    DrillFacts,
    Verdict,
    figure_error_reason,
    format_value,
    judge_drill,
    timeline,
)
from chaoslib_infer.verdict.policy import VerdictPolicy

__all__ = [
    "PROBE_DIFFERS",
    "RESIDUE_FILE",
    "drill_verdict",
    "hypothesis_failures",
    "probe_differences",
    "read_residue",
    "window_settings",
    "write_residue",
]

#: In the drill folder: faults still active after the rollbacks (``{"checked_at", "residue"}``).
RESIDUE_FILE = "residue.json"


def write_residue(drill_dir: Path, lines: list[str], checked_at: float) -> None:
    """Record the residue check of a drill (one line per fault still active, [] for none)."""
    (drill_dir / RESIDUE_FILE).write_text(
        json.dumps({"checked_at": checked_at, "residue": list(lines)}), encoding="utf-8"
    )


def read_residue(drill_dir: Path) -> list[str] | None:
    """The residue lines of a drill, or None when no check was recorded."""
    try:
        doc = json.loads((drill_dir / RESIDUE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    lines = doc.get("residue") if isinstance(doc, dict) else None
    return [str(x) for x in lines] if isinstance(lines, list) else None


def _probe_line(name: str, out: Mapping[str, Any]) -> str:
    """One deviated probe with a ``value`` as ``"NAME: METRIC = VALUE (OP THRESHOLD required, N
    requests; attempts: ...)[: STATEMENT]"`` (the statement of the window's binomial test:
    its bad count, the count it fails at, its false-alarm rate and power), each part only when
    the probe gave it (never ``None``): a
    probe without a threshold (``replicas_in_service``: ``expected``, ``missing``) says what
    it expected instead."""
    metric = out.get("metric")
    head = f"{name}: {metric} = {out.get('value')}" if metric else f"{name}: {out.get('value')}"
    parts = []
    if out.get("op") is not None and out.get("threshold") is not None:
        parts.append(f"{out['op']} {out['threshold']} required")
    elif out.get("expected") is not None:
        parts.append(f"{out['expected']} expected")
    if out.get("requests") is not None:
        unit = "logical requests" if out.get("unit") else "requests"
        parts.append(f"{out['requests']} {unit}")
    tail = ", ".join(parts)
    if out.get("attempt_value") is not None:  # the attempts, shown beside
        tail += f"; attempts: {out['attempt_value']} over {out.get('attempts')}"
    missing = out.get("missing")
    if isinstance(missing, list) and missing:
        tail += ("; " if tail else "") + "missing: " + ", ".join(str(m) for m in missing)
    line = f"{head} ({tail.lstrip('; ')})" if tail else head
    statement = out.get("statement")  # the window's binomial test (activities/slo.py)
    return f"{line}: {statement}" if isinstance(statement, str) and statement else line


def window_settings(journal: Mapping[str, Any]) -> dict[str, float]:
    """The binomial test's settings (``{"false_alarm", "power", "defect"}``) the drill's SLO
    probes ran with (``test_settings`` of an ``slo_check`` output, the plan's
    ``window_false_alarm``, ``window_power``, ``window_defect``), so the verdict judges its
    windows the same way; {} (the defaults) when no probe gave them."""
    for phase in ("before", "after"):
        entry = (journal.get("steady_states") or {}).get(phase) or {}
        for probe in entry.get("probes") or []:
            out = probe.get("output")
            got = out.get("test_settings") if isinstance(out, dict) else None
            if isinstance(got, dict):
                return {
                    k: float(v)
                    for k, v in got.items()
                    if k in ("false_alarm", "power", "defect") and isinstance(v, int | float)
                }
    return {}


def hypothesis_failures(journal: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``[(phase, line)]`` for each steady-state probe that deviated (``before`` / ``after``).

    The line names the probe and, for the SLO probes (``slo_check``), the value and threshold
    over logical requests (the verdict's unit), with the attempts' value beside when the probe
    gave it.
    """
    out: list[tuple[str, str]] = []
    for phase in ("before", "after"):
        entry = (journal.get("steady_states") or {}).get(phase) or {}
        for probe in entry.get("probes") or []:
            if probe.get("tolerance_met") is not False:
                continue
            name = (probe.get("activity") or {}).get("name")
            out_v = probe.get("output")
            if isinstance(out_v, dict) and "judged" in out_v:
                continue  # the drill-criteria probe: its reasons are the verdict's own rows
            if isinstance(out_v, dict) and "value" in out_v:
                line = _probe_line(str(name), out_v)
                reasons = out_v.get("reasons")
                if isinstance(reasons, list) and reasons:
                    line = f"{name}: " + "; ".join(str(r) for r in reasons)
            else:
                line = f"{name}: {out_v!r}"[:300]
            out.append((phase, line))
    return out


#: How a note of :func:`probe_differences` starts (the evidence shows it beside the verdict).
PROBE_DIFFERS = "in-run probe "


def _probe_failed(out: Mapping[str, Any]) -> list[str]:
    """The criteria a drill-criteria probe's output failed: its ``failed_criteria``, or (older
    journals) the ``(NAME)`` that ends each of its reasons."""
    names = out.get("failed_criteria")
    if isinstance(names, list):
        return [str(n) for n in names]
    found = (re.search(r"\(([a-z0-9_]+)\)$", str(r)) for r in out.get("reasons") or [])
    return [m.group(1) for m in found if m]


def probe_differences(journal: Mapping[str, Any], verdict: Verdict) -> list[str]:
    """One note per in-run ``drill-criteria-hold`` probe (:func:`chaoslib_infer.activities.
    criteria.drill_criteria`) whose judgement the final verdict does not share: the probe failed
    a criterion that the verdict's row does not fail. The probe judged the records written up to
    its own time (the run went on); the verdict judged every record of the run, and is final.

    Args:
        journal: the Chaos Toolkit journal. verdict: the drill's final verdict.

    Returns:
        ``["in-run probe NAME (hypothesis PHASE the fault) failed CRITERION on the records
        written by then; the verdict, over every record of the run, reads it RESULT (VALUE):
        the verdict is final"]``, one per such probe; [] when they agree.
    """
    rows = {r["criterion"]: r for r in verdict.rows}
    notes = []
    for phase in ("before", "after"):
        entry = (journal.get("steady_states") or {}).get(phase) or {}
        for probe in entry.get("probes") or []:
            out = probe.get("output")
            if not isinstance(out, dict) or not out.get("judged") or out.get("passed") is not False:
                continue
            differ = []
            for name in _probe_failed(out):
                row = rows.get(name)
                if row is not None and row["result"] != "fail":
                    value = format_value(row.get("value"), row.get("unit"), "no value")
                    differ.append(f"{name}, which the verdict reads {row['result']} ({value})")
            if differ:
                what = "; ".join(differ)
                name = (probe.get("activity") or {}).get("name") or "drill-criteria"
                notes.append(
                    f"{PROBE_DIFFERS}{name} (hypothesis {phase} the fault) failed {what}: the "
                    "probe judged the records written by its own time, while the run went on; "
                    "the verdict judged every record of the run and is final"
                )
    return notes


def _serving(
    drill: str,
    ground: Mapping[str, Any],
    figures: Mapping[str, Any],
    events: list[dict[str, Any]],
    start: float | None,
    end: float | None,
) -> tuple[int | None, int | None]:
    if not events or start is None or end is None:
        return None, None
    tl = timeline(drill, ground, figures, events)
    series = replica_count_series(events, start, end)
    if not series or not series["t"]:
        return None, None
    before_t = tl.fault_at if tl.fault_at is not None else start
    before = None
    for t, n in zip(series["t"], series["serving"], strict=True):
        if t <= before_t:
            before = n
    return before, series["serving"][-1]


def drill_verdict(
    name: str,
    drill_dir: Path,
    journal: Mapping[str, Any],
    records: list[dict[str, Any]],
    figures: Mapping[str, Any],
    ground: Mapping[str, Any],
    lab_events: list[dict[str, Any]],
    ledger_measured: bool,
    criteria: Mapping[str, Any] | None = None,
    stop: Mapping[str, Any] | None = None,
    load_error: str | None = None,
    start: float | None = None,
    end: float | None = None,
    replica_of: dict[str, str] | None = None,
    closed_loop: str | None = None,
    load_lost: Sequence[str] = (),
    warmup: str | None = None,
    client: Mapping[str, Any] | None = None,
    policy: VerdictPolicy | None = None,
) -> Verdict:
    """Judge drill ``name`` from what its run left.

    Args:
        name: drill name (its criteria: :data:`chaoslib_infer.verdict.DRILL_CRITERIA`).
        drill_dir: its folder (``residue.json``).
        journal: the Chaos Toolkit journal.
        records: attempt records.
        figures, ground: from :func:`chaoslib_infer.evidence.figures.drill_figures`.
        lab_events: the lab's events ([] off the lab).
        ledger_measured: an engine generation ledger exists for this target.
        criteria: threshold overrides ``{name: value | "off"}``.
        stop: the stop-condition record, if one aborted the drill.
        load_error: why the load could not start, if so.
        start, end: drill start and end (unix s), for the replica-count comparison.
        replica_of: request id -> replica from the lab's logs (health disagreement of attempts
            that never got a response header).
        closed_loop: why the load had no schedule (Locust's closed-loop users), or None
            (``DrillFacts.closed_loop``: the schedule lag reads unmeasured).
        load_lost: one line per load worker lost mid-drill (``DrillFacts.load_lost``: each
            makes the drill inconclusive).
        warmup: what the service did when nothing succeeded in the load's warm-up
            (``DrillFacts.warmup``: the drill fails before the fault), or None.
        client: the load client's own figures (``DrillFacts.client``: its CPU, its cap).
        policy: the verdict policy (``DrillFacts.policy``; None: the default one).

    Returns:
        The :class:`~chaoslib_infer.verdict.Verdict`: ``error`` (exit code 2) with one reason
        per figure kind in ``figures["figure_errors"]``, naming the kind and the exception's
        first line (:func:`~chaoslib_infer.verdict.figure_error_reason`), unless a residue or an
        abort outranks it (the reasons are then listed after theirs).

    Raises:
        ValueError: a criterion override names no criterion of this drill.
    """
    errors: list[str] = []
    if load_error:
        errors.append(f"the load could not run: {load_error}")
    status = drill_status(dict(journal)) if journal else None
    if status == "error":
        for a in failed_activities(dict(journal)):
            if a["section"] == "run":
                errors.append(f"activity {a['name']} {a['status']}: {a['exception']}")
        if not errors:
            errors.append("the experiment did not complete both hypotheses")
    for kind, err in (figures.get("figure_errors") or {}).items():  # drill_figures' failed kinds
        errors.append(figure_error_reason(str(kind), str(err)))
    residue = read_residue(drill_dir) or []
    for a in failed_activities(dict(journal)) if journal else []:
        if a["section"] == "rollbacks":
            residue.append(f"rollback {a['name']} {a['status']}: {a['exception']}")
    facts = DrillFacts(
        drill=name,
        records=records,
        figures=figures,
        ground=ground,
        lab_events=lab_events,
        ledger_measured=ledger_measured,
        journal_status=status,
        hypothesis_failures=hypothesis_failures(journal) if journal else [],
        findings=method_findings(dict(journal)) if journal else [],
        errors=errors,
        residue=residue,
        stop_reason=(f"{stop.get('guard')}: {stop.get('reason')}" if stop else None),
        serving=_serving(name, ground, figures, lab_events, start, end),
        replica_of=dict(replica_of or {}),
        closed_loop=closed_loop,
        load_lost=list(load_lost),
        warmup=warmup,
        client=dict(client or {}),
        window_settings=window_settings(journal) if journal else {},
        policy=policy or VerdictPolicy(),
    )
    verdict = judge_drill(facts, criteria)
    if journal:  # the in-run probe's judgement, where the final verdict does not share it
        verdict.notes.extend(probe_differences(journal, verdict))
    return verdict
