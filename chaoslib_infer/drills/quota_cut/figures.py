"""Figures of the ``quota-cut`` fault: does the quota (by default the capacity formula's instance
count for the drill's own load) carry the load within the SLO?

Definitions: the capacity formula of ``docs/definitions.md`` ("Capacity planning"); SLO figures
as in ``docs/definitions.md`` over the requests *sent* while the cap was in place. Ground truth: the
lab's fault ledger events (cut recorded, cap cleared), its exit/ready events for the stopped
replicas, and HAProxy's request log (which replicas served requests during the cut).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.measure.figkit import MILESTONE, RECOVERY, DrillContext, Marker, mark, num
from chaoslib_infer.measure.metrics import window_stats

__all__ = ["LEDGER_LABELS", "compute", "markers", "replica_lines"]

LEDGER_LABELS = ("quota cut injected", "quota lifted")


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: the cut done (replicas above the quota drained and stopped) and each
    stopped replica ready again after the quota is lifted."""
    stopped = ", ".join(ground.get("stopped") or []) or "none"
    out = mark(ground.get("cut_done_at"), f"cut done ({stopped} stopped)", MILESTONE)
    for r, t in (ground.get("restored_ready_at") or {}).items():
        out += mark(t, f"{r} ready again", RECOVERY)
    return out


def replica_lines(ground: dict[str, Any], figures: dict[str, Any]) -> list[tuple[float, str, str]]:
    """Reference lines of the replica-count plot: the capacity formula's planned instance count
    and, when it differs, the quota held."""
    out: list[tuple[float, str, str]] = []
    planned, held = figures.get("planned_instances"), figures.get("instances_held")
    if planned is not None:
        out.append((float(planned), f"planned instances (capacity formula): {planned}", "#9467bd"))
    if held is not None and held != planned:
        out.append((float(held), f"quota held: {held}", "#d62728"))
    return out


def _hypothesis_after(run_dir: Path) -> bool | None:
    """The after-method steady-state verdict from the run's journal (None if not run)."""
    try:
        journal = json.loads((run_dir / "journal.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    after = (journal.get("steady_states") or {}).get("after") or {}
    met = after.get("steady_state_met")
    return bool(met) if met is not None else None


#: The quota window's figures, each ``quota_<name>`` (fractions; seconds).
_AT_QUOTA = ("availability", "error_rate", "timeout_rate", "p50_e2e_s", "p95_e2e_s", "p99_e2e_s")


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``quota-cut`` fault of the run.

    Figures: ``planned_instances`` (formula), ``instances_held`` (the quota Q), ``held_at_quota``
    (the after-method hypothesis verdict at Q: True / False / None when not evaluated),
    ``quota_source``, the formula inputs (``offered_rps``, ``expected_latency_s``,
    ``max_concurrency_per_instance``, ``redundancy_factor``, ``capacity_raw``), ``replicas_stopped``,
    ``cut_s`` (seconds to drain and stop them) and the SLO figures over requests sent while the cap
    held: ``quota_requests``, ``quota_availability``, ``quota_error_rate``, ``quota_timeout_rate``,
    ``quota_p50_e2e_s``, ``quota_p95_e2e_s``, ``quota_p99_e2e_s``.
    Ground truth: ``fault_at``, ``cut_done_at``, ``restored_at`` (cap cleared in the fault ledger),
    ``lift_started_at`` (the rollback starts the first stopped replica: the cap's end for the
    "at quota" window and ``servers_serving_during_cut``),
    ``quota``, ``kept``, ``stopped``, ``stopped_exits`` (the lab's exit events of the stopped
    replicas), ``servers_serving_during_cut`` (HAProxy log: servers that were sent requests while
    the cap held), ``instances_serving_during_cut``, ``restored_ready_at`` (ready events after the
    rollback), ``scale_outs_during_cut`` (autoscaler triggers while capped; 0 expected).
    """
    fault = ctx.last_fault("quota-cut")
    if fault is None:
        return {}, {}
    fault_at = float(fault["fault_at"])
    cut_done = float(fault.get("cut_done_at") or fault_at)
    stopped = [str(n) for n in fault.get("stopped") or []]
    restored_at = next(
        (
            float(e["t"])
            for e in ctx.lab_events
            if e.get("event") == "fault"
            and e.get("phase") == "cleared"
            and e.get("fault_id") == fault.get("fault_id")
        ),
        None,
    )
    # the cap holds until the rollback starts the first stopped replica again (the ledger's
    # "cleared" event comes only once the undo is complete, replicas ready and back in HAProxy)
    lift_started_at = min(
        (
            float(e["t"])
            for e in ctx.lab_events
            if e.get("event") == "start"
            and e.get("replica") in stopped
            and float(e["t"]) >= cut_done
        ),
        default=None,
    )
    end = min((t for t in (restored_at, lift_started_at) if t is not None), default=None)
    if end is None:
        end = max((float(r["sent_at"]) for r in ctx.records if r.get("sent_at")), default=cut_done)
    at_q = window_stats(ctx.records, start=cut_done, end=end)
    figures: dict[str, Any] = {
        "planned_instances": int(fault["planned_instances"]),
        "instances_held": int(fault["quota"]),
        "held_at_quota": _hypothesis_after(ctx.run_dir),
        "quota_source": fault.get("quota_source"),
        "offered_rps": num(fault.get("offered_rps")),
        "expected_latency_s": num(fault.get("expected_latency_s")),
        "max_concurrency_per_instance": fault.get("max_concurrency_per_instance"),
        "redundancy_factor": num(fault.get("redundancy_factor")),
        "capacity_raw": num(fault.get("capacity_raw")),
        "capacity_formula": fault.get("formula"),
        "replicas_stopped": len(stopped),
        "cut_s": cut_done - fault_at,
        "quota_requests": int(at_q.get("requests") or 0),
        **{f"quota_{k}": num(at_q.get(k)) for k in _AT_QUOTA},
    }
    exits = [
        e
        for e in ctx.lab_events
        if e.get("event") == "exit"
        and e.get("replica") in stopped
        and fault_at - 0.5 <= float(e["t"]) <= (restored_at or float("inf"))
    ]
    ready = {
        e["replica"]: float(e["t"])
        for e in ctx.lab_events
        if e.get("event") == "ready" and e.get("replica") in stopped and float(e["t"]) >= cut_done
    }
    serving: set[str] = set()
    lab_dir = fault.get("lab_dir")
    if lab_dir:
        for entry in hap.parse_request_log(Path(str(lab_dir)) / "haproxy-requests.log"):
            t = entry.forwarded_t
            if t is not None and cut_done <= t < end and entry.server != "<NOSRV>":
                serving.add(entry.server)
    scale_outs = [
        e
        for e in ctx.lab_events
        if e.get("event") == "scale_out_triggered" and fault_at <= float(e["t"]) < end
    ]
    ground: dict[str, Any] = {
        "fault_at": fault_at,
        "cut_done_at": cut_done,
        "restored_at": restored_at,
        "lift_started_at": lift_started_at,
        "quota": int(fault["quota"]),
        "kept": fault.get("kept"),
        "stopped": stopped,
        "stopped_exits": [
            {"replica": e["replica"], "t": e["t"], "expected": e.get("expected")} for e in exits
        ],
        "servers_serving_during_cut": sorted(serving),
        "instances_serving_during_cut": len(serving),
        "restored_ready_at": ready,
        "scale_outs_during_cut": len(scale_outs),
    }
    return figures, ground
