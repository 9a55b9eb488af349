"""Figures of the ``traffic-spike`` fault: how fast the lab scaled out, what it shed, how the tail
latency held, and how long it took to be back to normal after the spike.

Definitions (``docs/definitions.md``): shed requests are attempts answered 429 or 503 (the engines'
queue-full answer, HAProxy's queue timeout; what the verdict counts as shed, and how: ``shed.py``,
re-exported here); percentiles over successful requests sent in the spike
phase; recovery time from ``chaoslib_infer.measure.figures.recovery`` against the baseline phase.
Ground truth: the autoscaler's ``scale_out_*`` events (``events.jsonl``), HAProxy's request log
(statuses it returned), the load generator's phase boundaries (its run summary in ``load.log``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoslib_infer.drills.traffic_spike.shed import SHED_STATUSES, is_shed, non_shed_failures
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.load.clientside import read_run_summary
from chaoslib_infer.measure import figkit
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.figkit import DrillContext, Marker, mark, num
from chaoslib_infer.measure.metrics import window_stats

__all__ = [
    "LEDGER_LABELS",
    "SHED_STATUSES",
    "compute",
    "is_shed",
    "load_phases",
    "load_summary",
    "markers",
    "non_shed_failures",
]

#: The fault is recorded when the load restarts with the spike profile; the spike itself starts
#: with the profile's spike phase.
LEDGER_LABELS = ("spike scheduled (profile load started)", "spike fault cleared")


def load_summary(run_dir: Path) -> dict[str, Any] | None:
    """The load generator's run summary (its last JSON line in ``load.log``,
    :func:`chaoslib_infer.load.clientside.read_run_summary`) when it carries phases, or None."""
    summary = read_run_summary(run_dir / "load.log")
    return summary if summary and summary.get("phases") else None


def load_phases(run_dir: Path, fault: dict[str, Any]) -> list[dict[str, Any]]:
    """Rate phases with unix boundaries: from the load generator's summary line in ``load.log``
    (exact), else rebuilt from the fault's ``profile`` and ``load_started_at``.

    Returns:
        ``[{"index", "rate_rps", "start_at", "end_at", "duration_s", "sent"?, "scheduled"?}]``.
    """
    summary = load_summary(run_dir)
    if summary is not None:
        return [dict(p) for p in summary["phases"]]
    out: list[dict[str, Any]] = []
    t = float(fault.get("load_started_at") or 0.0)
    for i, (d, r) in enumerate(fault.get("profile") or []):
        out.append(
            {"index": i, "rate_rps": r, "duration_s": d, "start_at": t, "end_at": t + float(d)}
        )
        t += float(d)
    return out


def _first_event(
    events: list[dict[str, Any]], name: str, after: float, replica: str | None = None
) -> dict[str, Any] | None:
    cands = [
        e
        for e in events
        if e.get("event") == name
        and float(e.get("t") or 0.0) >= after
        and (replica is None or e.get("replica") == replica)
    ]
    return min(cands, key=lambda e: float(e["t"])) if cands else None


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: spike start and end, the autoscaler's scale-out (trigger, the new
    replica ready, enabled in HAProxy, serving), back in the baseline bands after the spike."""
    r = ground.get("scale_out_replica")
    q = ground.get("queue_depth_at_trigger")
    out = mark(ground.get("fault_at"), "spike starts", figkit.FAULT)
    out += mark(ground.get("spike_end_at"), "spike ends", figkit.REMOVED)
    out += mark(
        ground.get("scale_out_triggered_at"),
        f"scale-out triggered ({r}, queue {q})",
        figkit.MILESTONE,
    )
    out += mark(ground.get("scale_out_ready_at"), f"{r} ready", figkit.RECOVERY)
    out += mark(ground.get("scale_out_enabled_at"), f"{r} enabled in HAProxy", figkit.RECOVERY)
    out += mark(ground.get("scale_out_serving_at"), f"{r} serving", figkit.RECOVERY)
    rec, end = figures.get("recovery_s"), ground.get("spike_end_at")
    if rec is not None and end is not None:
        out += mark(float(end) + float(rec), "P99 and errors back in baseline", figkit.RECOVERY)
    return out


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``traffic-spike`` fault of the run.

    Figures: ``shed_requests`` (attempts answered 429/503), ``shed_429``, ``shed_503``,
    ``p99_e2e_during_spike_s``, ``p50_e2e_during_spike_s``, ``availability_during_spike``,
    ``requests_during_spike`` (due by the schedule during the spike: first attempts whose
    ``intended_at`` is in it, sent or ``not_sent``), ``not_sent_during_spike`` (of those, due while
    the load's in-flight cap was full), ``scale_out_s`` (client view: trigger, from the lab's event, to the
    send time of the first successful request the new replica answered; None without a
    scale-out), ``scale_out_triggered_after_s`` (spike start to trigger), ``cold_start_s`` (trigger
    to the replica's health 200), ``recovery_s`` (from the end of the spike until per-window P99 and
    error rate are back in the baseline bands for 5 s), ``recovery_note`` (why ``recovery_s`` is
    None: never back, or unmeasured as the load ended first), ``recovery_from_spike_start_s`` (the same
    from the spike's start), ``phase_rates`` (per phase: planned, offered and successful requests/s
    over the part of the phase the load ran; the load's own count of requests scheduled (None when
    the load was stopped early), sent and not sent).
    Ground truth: ``fault_at`` (spike start), ``spike_end_at``, ``scale_out_replica``,
    ``scale_out_triggered_at``, ``scale_out_ready_at``, ``scale_out_enabled_at``,
    ``scale_out_serving_at``, ``scale_out_s`` (serving - triggered), ``queue_depth_at_trigger``,
    ``shed_requests`` / ``shed_429`` / ``shed_503`` (HAProxy's request log, this run's request ids),
    ``scale_outs`` (triggers during the drill).
    """
    fault = ctx.last_fault("traffic-spike")
    if fault is None:
        return {}, {}
    phases = load_phases(ctx.run_dir, fault)
    k = int(fault.get("spike_phase") or 1)
    spike = phases[k] if k < len(phases) else None
    start = float(spike["start_at"]) if spike else float(fault["fault_at"])
    end = float(spike["end_at"]) if spike else float(fault["spike_end_at"])
    recs = ctx.records
    figures: dict[str, Any] = {}
    ground: dict[str, Any] = {"fault_at": start, "spike_end_at": end}

    shed = [r for r in recs if r.get("status") in SHED_STATUSES]
    figures["shed_requests"] = len(shed)
    figures["shed_429"] = sum(1 for r in shed if r.get("status") == 429)
    figures["shed_503"] = sum(1 for r in shed if r.get("status") == 503)
    during = window_stats(recs, start=start, end=end)
    # due during the spike by the schedule (first attempts by intended_at), sent or not: a
    # request the in-flight cap refused was planned and due (the service held every slot), and
    # the count agrees with the load's own phase summary (sent + not_sent)
    due = [
        r
        for r in recs
        if int(r.get("attempt") or 1) == 1
        and isinstance(r.get("intended_at"), int | float)
        and start <= float(r["intended_at"]) < end
    ]
    figures["requests_during_spike"] = len(due)
    figures["not_sent_during_spike"] = sum(1 for r in due if r.get("not_sent"))
    figures["availability_during_spike"] = num(during.get("availability"))
    figures["p50_e2e_during_spike_s"] = num(during.get("p50_e2e_s"))
    figures["p99_e2e_during_spike_s"] = num(during.get("p99_e2e_s"))
    base_start = float(phases[0]["start_at"]) if phases else None
    baseline = window_stats(recs, start=base_start, end=start)
    figures["baseline_p99_e2e_s"] = num(baseline.get("p99_e2e_s"))
    if baseline.get("p99_e2e_s") is not None:
        figures["recovery_s"], figures["recovery_note"] = mfig.recovery_outcome(recs, end, baseline)
        figures["recovery_from_spike_start_s"] = mfig.recovery(recs, start, baseline)
    else:
        figures["recovery_s"] = figures["recovery_from_spike_start_s"] = None
    rates: list[dict[str, Any]] = []
    summary = load_summary(ctx.run_dir) or {}
    stopped_at = float(summary["ended_at"]) if summary.get("stopped") else None
    for p in phases:
        p0, p1 = float(p["start_at"]), float(p["end_at"])
        if stopped_at is not None:  # the load was stopped before the profile's end
            p1 = max(p0, min(p1, stopped_at))
        dur = max(p1 - p0, 1e-9)
        offered = sum(
            1
            for r in recs
            if int(r.get("attempt") or 1) == 1
            and isinstance(r.get("intended_at"), int | float)
            and p0 <= float(r["intended_at"]) < p1
        )
        ok = sum(
            1
            for r in recs
            if r.get("ok")
            and isinstance(r.get("sent_at"), int | float)
            and p0 <= float(r["sent_at"]) < p1
        )
        rates.append(
            {
                "phase": int(p.get("index", len(rates))),
                "planned_rps": num(p.get("rate_rps")),
                "offered_rps": offered / dur,
                "ok_rps": ok / dur,
                "duration_s": dur,
                "scheduled": p.get("scheduled") if stopped_at is None else None,
                "sent": p.get("sent"),
                "not_sent": p.get("not_sent"),
            }
        )
    figures["phase_rates"] = rates

    since = float(fault.get("recorded_at") or start) - 0.5
    events = ctx.lab_events
    trig = _first_event(events, "scale_out_triggered", since)
    ground["scale_outs"] = sum(
        1 for e in events if e.get("event") == "scale_out_triggered" and float(e["t"]) >= since
    )
    figures["scale_out_s"] = None
    figures["scale_out_triggered_after_s"] = None
    figures["cold_start_s"] = None
    if trig is not None:
        name = str(trig["replica"])
        t0 = float(trig["t"])
        ready = _first_event(events, "scale_out_ready", t0, name)
        enabled = _first_event(events, "scale_out_enabled", t0, name)
        serving = _first_event(events, "scale_out_serving", t0, name)
        ground.update(
            scale_out_replica=name,
            scale_out_triggered_at=t0,
            queue_depth_at_trigger=trig.get("queue_depth"),
            scale_out_ready_at=float(ready["t"]) if ready else None,
            scale_out_enabled_at=float(enabled["t"]) if enabled else None,
            scale_out_serving_at=float(serving["t"]) if serving else None,
            scale_out_s=(float(serving["t"]) - t0) if serving else None,
        )
        first = min(
            (
                float(r["sent_at"])
                for r in recs
                if r.get("ok") and r.get("replica") == name and float(r.get("sent_at") or 0) >= t0
            ),
            default=None,
        )
        figures["scale_out_s"] = (first - t0) if first is not None else None
        figures["scale_out_triggered_after_s"] = t0 - start
        figures["cold_start_s"] = (float(ready["t"]) - t0) if ready else None

    ids = {r.get("request_id") for r in recs}
    h_shed = {429: 0, 503: 0}
    lab_dir = fault.get("lab_dir")
    if lab_dir:
        for entry in hap.parse_request_log(Path(str(lab_dir)) / "haproxy-requests.log"):
            if entry.status in h_shed and entry.request_id in ids:
                h_shed[entry.status] += 1
    ground["shed_requests"] = h_shed[429] + h_shed[503]
    ground["shed_429"] = h_shed[429]
    ground["shed_503"] = h_shed[503]
    return figures, ground
