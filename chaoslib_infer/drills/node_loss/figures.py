"""Figures of the ``node-loss`` fault: interruption, failed requests, replacement serving time,
recovery, lost replicas.

Definitions: ``docs/definitions.md`` ("Drill figures"); "replacement serving time" is ours: from
the node loss (network cut, ``fault_at``) until the last lost replica serves a request again at its
new place. Ground truth comes from the lab: its events (``node_down``, ``node_up``, ``rescheduled``,
``ready``, ``serving``), the first request each replica served (engine ledger / HAProxy request log,
``Lab.served``) and HAProxy's request log for the failures the load balancer saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoslib_infer.drills.interruption import interruption_figures
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.measure import figkit
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.figkit import DrillContext, Marker, mark, num
from chaoslib_infer.measure.metrics import window_stats

__all__ = ["LEDGER_LABELS", "SETTLE_S", "compute", "inflight_at_loss", "markers"]

LEDGER_LABELS = ("node loss injected", "node loss removed")

REQUEST_LOG = "haproxy-requests.log"
#: Settling window of the interruption figure (s). A node that drops silently makes requests fail
#: only when the client gives up: up to the load client's first-token timeout (10 s) after they were
#: sent (requests that HAProxy sent over pooled connections to the dead node before ejecting it).
#: A shorter window would declare the service settled while such failures are still pending.
SETTLE_S = 10.0


def _end_t(entry: hap.RequestLogEntry) -> float:
    """Unix time HAProxy finished a request (first request byte + total active time)."""
    return entry.request_t + max(entry.ta_ms, 0) / 1000.0


def inflight_at_loss(
    state_dir: Path, ledger: list[dict[str, Any]], lost: list[str], fault_at: float
) -> list[str]:
    """Request ids the lost replicas were generating when the node dropped (lab ground truth).

    A generation started on a lost replica before ``fault_at`` (engine ledger) whose request
    HAProxy never logged as completed cleanly before ``fault_at`` (request log; HAProxy logs a
    request when it ends, and one stuck on a dead node ends only at its server timeout).
    """
    done = {
        e.request_id
        for e in hap.parse_request_log(Path(state_dir) / REQUEST_LOG)
        if e.request_id
        and 200 <= e.status < 400
        and e.term_state[:2] == "--"
        and _end_t(e) < fault_at
    }
    out = []
    for g in ledger:
        rid = g.get("request_id")
        if (
            g.get("event", "generation") == "generation"
            and g.get("replica") in lost
            and float(g.get("t", 0.0)) < fault_at
            and isinstance(rid, str)
            and rid not in done
        ):
            out.append(rid)
    return out


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: node down, per lost replica its ejection, rescheduling, ready, HAProxy
    UP and first request served at its new place; back in the baseline bands; node back up."""
    node = ground.get("node")
    out = mark(ground.get("node_down_at"), f"node {node} down", figkit.FAULT)
    for r in ground.get("lost_replica_names") or []:
        out += mark(
            (ground.get("lb_ejected_at") or {}).get(r), f"{r} ejected by HAProxy", figkit.MILESTONE
        )
        move = (ground.get("rescheduled") or {}).get(r) or {}
        out += mark(
            move.get("t"),
            f"{r} rescheduled {move.get('from_node')}→{move.get('to_node')}",
            figkit.MILESTONE,
        )
        out += mark((ground.get("replica_ready_at") or {}).get(r), f"{r} ready", figkit.RECOVERY)
        out += mark((ground.get("lb_up_at") or {}).get(r), f"{r} UP in HAProxy", figkit.RECOVERY)
        out += mark(
            (ground.get("replica_serving_at") or {}).get(r), f"{r} serving again", figkit.RECOVERY
        )
    rec, fault_at = figures.get("recovery_s"), ground.get("fault_at")
    if rec is not None and fault_at is not None:
        out += mark(
            float(fault_at) + float(rec), "P99 and errors back in baseline", figkit.RECOVERY
        )
    out += mark(
        ground.get("node_up_at"), f"node {node} back ({ground.get('node_up_by')})", figkit.REMOVED
    )
    return out


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``node-loss`` fault of the run.

    Figures: ``interruption_s``, ``failed_requests``, ``first_failure_at``, ``last_failure_at``
    (client records, :func:`chaoslib_infer.measure.figures.interruption` with a :data:`SETTLE_S`
    settling window), ``lost_replicas`` (count), ``moved_replicas`` (count rescheduled onto another
    node), ``replacement_serving_s`` (client view: loss to the first successful request sent to
    each lost replica after the loss, the latest of them), ``replacement_serving_s_ground_truth``
    (lab view), ``lb_ejection_s_ground_truth`` (loss until HAProxy had ejected every lost
    replica), ``recovery_s`` (:func:`chaoslib_infer.measure.figures.recovery`, baseline = the
    records before the loss; None when not recovered within the data), ``recovery_note`` (why
    it is None: never back, or unmeasured as the load ended first;
    :func:`chaoslib_infer.measure.figures.recovery_outcome`).

    Ground truth: ``fault_at``, ``node``, ``lost_replica_names``, ``node_down_at``, ``node_up_at``,
    ``node_up_by`` (``rollback`` or ``dead-man timer``), ``replicas_killed_at``, ``rescheduled``
    ({replica: {"t", "from_node", "to_node"}}), ``replica_ready_at``, ``lb_ejected_at``,
    ``lb_up_at``, ``replica_serving_at`` ({replica: unix s}), ``replica_serving_again_at`` (the
    last of them), ``replacement_serving_s``, ``lost_inflight_request_ids`` /
    ``lost_inflight_requests`` (what the lost replicas were generating at the loss:
    :func:`inflight_at_loss`). All times unix seconds.
    """
    fault = ctx.last_fault("node-loss")
    if fault is None:
        return {}, {}
    fault_at = float(fault["fault_at"])
    fault_id = fault.get("fault_id")
    lost = [str(r) for r in fault.get("replicas") or []]

    def first(kind: str, **match: Any) -> dict[str, Any] | None:
        cands = [
            e
            for e in ctx.lab_events
            if e.get("event") == kind
            and e.get("fault_id") == fault_id
            and all(e.get(k) == v for k, v in match.items())
        ]
        return min(cands, key=lambda e: float(e["t"])) if cands else None

    ground: dict[str, Any] = {
        "fault_at": fault_at,
        "node": fault.get("node"),
        "lost_replica_names": lost,
        "replicas_killed_at": fault.get("killed_at"),
        "replica_died_at": fault.get("killed_at"),
    }
    down = first("node_down")
    up = first("node_up")
    ground["node_down_at"] = float(down["t"]) if down else None
    ground["node_up_at"] = float(up["t"]) if up else None
    ground["node_up_by"] = up.get("by") if up else None
    rescheduled: dict[str, Any] = {}
    ready: dict[str, float | None] = {}
    serving: dict[str, float | None] = {}
    for replica in lost:
        ev = first("rescheduled", replica=replica)
        if ev:
            rescheduled[replica] = {
                "t": float(ev["t"]),
                "from_node": ev.get("from_node"),
                "to_node": ev.get("to_node"),
            }
        rdy = [
            e
            for e in ctx.lab_events
            if e.get("event") == "ready"
            and e.get("replica") == replica
            and float(e["t"]) > fault_at
        ]
        ready[replica] = min(float(e["t"]) for e in rdy) if rdy else None
        served = ctx.served_after(replica, fault_at) if ctx.served_after else None
        if served is None:
            sev = first("serving", replica=replica)
            served = float(sev["t"]) if sev else None
        serving[replica] = served
    ground["rescheduled"] = rescheduled
    ground["replica_ready_at"] = ready
    ground["replica_serving_at"] = serving
    all_served = bool(lost) and all(v is not None for v in serving.values())
    last_served = max(v for v in serving.values() if v is not None) if all_served else None
    ground["replica_serving_again_at"] = last_served
    ground["replacement_serving_s"] = (last_served - fault_at) if last_served else None

    ejected = {r: first("lb_ejected", replica=r) for r in lost}
    ground["lb_ejected_at"] = {r: (float(e["t"]) if e else None) for r, e in ejected.items()}
    back = {r: first("lb_up", replica=r) for r in lost}
    ground["lb_up_at"] = {r: (float(e["t"]) if e else None) for r, e in back.items()}
    state_dir = fault.get("state_dir")
    if state_dir:
        ground["lost_inflight_request_ids"] = inflight_at_loss(
            Path(state_dir), ctx.ledger, lost, fault_at
        )
        ground["lost_inflight_requests"] = len(ground["lost_inflight_request_ids"])

    figures: dict[str, Any] = {}
    intr = mfig.interruption(ctx.records, fault_at, settle_s=SETTLE_S)
    figures.update(interruption_figures(intr))
    figures["lost_replicas"] = len(lost)
    times = [t for t in ground["lb_ejected_at"].values() if t is not None]
    figures["lb_ejection_s_ground_truth"] = (
        max(times) - fault_at if times and len(times) == len(lost) else None
    )
    figures["moved_replicas"] = sum(
        1 for v in rescheduled.values() if v.get("to_node") != v.get("from_node")
    )
    client = [mfig.restart_from_records(ctx.records, r, fault_at) for r in lost]
    figures["replacement_serving_s"] = (
        max(float(c) for c in client if c is not None)
        if lost and all(c is not None for c in client)
        else None
    )
    figures["replacement_serving_s_ground_truth"] = ground["replacement_serving_s"]
    before = ctx.records_before(fault_at)
    base = window_stats(before) if before else {}
    try:
        rec, figures["recovery_note"] = mfig.recovery_outcome(ctx.records, fault_at, base)
        figures["recovery_s"] = num(rec)
    except ValueError:  # no baseline (no successful request before the loss)
        figures["recovery_s"] = None
    return figures, ground
