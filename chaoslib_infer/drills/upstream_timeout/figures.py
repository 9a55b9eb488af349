"""Figures of the ``upstream-timeout`` fault: does the gateway fail fast, or let requests hang?

Definitions (``docs/definitions.md`` "Drill figures" plus the ones below), all times unix s:

- ``time_to_first_error_s``: fault injection to the first attempt that failed after it (its
  ``end_at``, when the user saw it); None when nothing failed.
- ``hung_requests``: attempts that ended at or after the fault in a timeout class
  (``timeout_ttft``, ``timeout_idle``, ``timeout_total``, ``timeout_connect``): they waited on the
  frozen replica until the *client* gave up. ``hung_request_max_s`` is the longest of them
  (send to give-up). A gateway that fails fast has none.
- ``ejection_s``: fault injection to the first HAProxy ``show stat`` sample (every ~50 ms) in
  which the frozen replica is no longer UP (ground truth: the gateway's own state).
- ``queue_max`` (requests queued in HAProxy), ``hung_sessions_max`` (sessions open on the frozen
  replica at once), ``survivor_waiting_max`` / ``survivor_running_max`` (engines'
  ``vllm:num_requests_waiting`` / ``running``): queue growth while the fault was held.
- ``interruption_s`` / ``failed_requests`` / ``interruption_settled``: :func:`interruption`, the
  docs/definitions.md definition with failures still pending counted (below).
- ``hung_sent_first_at`` / ``hung_sent_last_at``: send times of the first and last hung request
  (the window in which the gateway still sent requests to the frozen replica).

Interruption (``docs/definitions.md``, "Drill figures"): from the first user-visible failure
after the fault to the last failure before service is sustained again (a settling window). Here
the failures are sparse and late: each hung request shows only when the client gives up on it (its
first-token timeout, 10 s by default), so with the common 5 s window
(:func:`chaoslib_infer.measure.figures.interruption`) the first failure looked "settled" while the
other requests hung on the same frozen replica were still pending, and the figure read 0. The
settling window after a failure F therefore counts every failed attempt that was in flight in it
(sent before its end, ended after F), not only failures that became visible inside it.

Ground truth (lab side): ``ejected_at`` and ``hung_sessions`` (HAProxy's ``scur`` of the frozen
server once it was ejected: requests it had sent there that never came back), ``frozen_at`` (the
freezer write), ``thawed_at`` (the lab's ``fault cleared`` event), ``mode``/``freezer``,
``lb_up_again_at`` (the first ``lb_state`` snapshot after the ejection with the replica UP again;
only where the lab's recorder sampled HAProxy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.figkit import (
    FAULT,
    MILESTONE,
    RECOVERY,
    DrillContext,
    Marker,
    mark,
)

__all__ = [
    "LEDGER_LABELS",
    "SETTLE_S",
    "TIMEOUT_CLASSES",
    "compute",
    "hung_sessions",
    "interruption",
    "markers",
]

KIND = "upstream-timeout"
TIMEOUT_CLASSES = frozenset({"timeout_connect", "timeout_ttft", "timeout_idle", "timeout_total"})
#: Settling window of the interruption figure (s), as in ``measure.figures.interruption``.
SETTLE_S = 5.0
LEDGER_LABELS = ("freeze injected", "thawed (fault removed)")


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: replica frozen, first failure a client saw, ejection by HAProxy, last
    failure of the interruption, replica UP in HAProxy again after the thaw."""
    r = ground.get("replica")
    out = mark(ground.get("fault_at"), f"{r} frozen", FAULT)
    out += mark(figures.get("first_failure_at"), "first client failure", MILESTONE)
    out += mark(ground.get("ejected_at"), f"{r} ejected by HAProxy", MILESTONE)
    last = figures.get("last_failure_at")
    if last is not None and last != figures.get("first_failure_at"):
        out += mark(last, "last failure (interruption ends)", RECOVERY)
    out += mark(ground.get("lb_up_again_at"), f"{r} UP in HAProxy again", RECOVERY)
    return out


def interruption(
    records: list[dict[str, Any]], fault_at: float, settle_s: float = SETTLE_S
) -> dict[str, Any]:
    """:func:`chaoslib_infer.measure.figures.interruption` (failures still pending counted) with
    this drill's settling window."""
    return mfig.interruption(records, fault_at, settle_s)


def _samples(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    out: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and item.get("source") == "haproxy":
            out.append(item)
    return out


def hung_sessions(samples: list[dict[str, Any]], server: str, start: float, end: float) -> int:
    """Max ``scur`` of ``server`` in HAProxy samples taken in ``[start, end]`` (0 without any)."""
    vals = [
        int(s.get("servers", {}).get(server, {}).get("scur", 0))
        for s in samples
        if start <= float(s["t"]) <= end
    ]
    return max(vals, default=0)


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``upstream-timeout`` fault of the run.

    See the module docstring for every name. Figures are None where the data is missing (e.g.
    the run was interrupted before the fault was held).
    """
    fault = ctx.last_fault(KIND)
    if fault is None:
        return {}, {}
    fault_at = float(fault["fault_at"])
    replica = str(fault["replica"])
    held_until = float(fault.get("held_until") or fault_at)
    ejected_at = fault.get("ejected_at")
    figures: dict[str, Any] = {}
    ground: dict[str, Any] = {
        "fault_at": fault_at,
        "replica": replica,
        "mode": fault.get("mode"),
        "requested_mode": fault.get("requested_mode"),
        "freezer": fault.get("freezer"),
        "fallback_reason": fault.get("fallback_reason"),
        "ejected_at": ejected_at,
        "held_until": fault.get("held_until"),
    }
    samples = _samples(fault.get("samples"))
    ground["hung_sessions"] = (
        hung_sessions(samples, replica, float(ejected_at), held_until)
        if ejected_at is not None
        else None
    )
    cleared = [
        float(e["t"])
        for e in ctx.lab_events
        if e.get("event") == "fault"
        and e.get("phase") == "cleared"
        and e.get("fault_id") == fault.get("fault_id")
    ]
    ground["thawed_at"] = min(cleared) if cleared else None
    snapshots = [e for e in ctx.lab_events if e.get("event") == "lb_state"]
    if snapshots and ejected_at is not None:
        ground["lb_up_again_at"] = next(
            (
                float(e["t"])
                for e in sorted(snapshots, key=lambda e: float(e["t"]))
                if float(e["t"]) > float(ejected_at)
                and (e.get("servers") or {}).get(replica) == "UP"
            ),
            None,
        )

    after = [r for r in ctx.records if r.get("end_at") is not None and r["end_at"] >= fault_at]
    failed = sorted((r for r in after if not r.get("ok")), key=lambda r: r["end_at"])
    hung = [r for r in failed if r.get("error_class") in TIMEOUT_CLASSES]
    figures["time_to_first_error_s"] = (failed[0]["end_at"] - fault_at) if failed else None
    figures["hung_requests"] = len(hung)
    figures["hung_request_max_s"] = max(r["end_at"] - r["sent_at"] for r in hung) if hung else None
    figures["hung_sent_first_at"] = min((r["sent_at"] for r in hung), default=None)
    figures["hung_sent_last_at"] = max((r["sent_at"] for r in hung), default=None)
    figures["hung_by_class"] = {
        c: sum(1 for r in hung if r.get("error_class") == c)
        for c in sorted({str(r.get("error_class")) for r in hung})
    }
    figures["fails_fast"] = not hung
    figures["ejection_s"] = fault.get("ejection_s")
    figures["queue_max"] = fault.get("queue_max")
    figures["hung_sessions_max"] = fault.get("watched_scur_max")
    figures["survivor_scur_max"] = fault.get("survivor_scur_max")
    figures["survivor_waiting_max"] = fault.get("survivor_waiting_max")
    figures["survivor_running_max"] = fault.get("survivor_running_max")
    intr = interruption(ctx.records, fault_at)
    figures["interruption_s"] = float(intr["interruption_s"])
    figures["failed_requests"] = int(intr["failed_requests"])
    figures["interruption_settled"] = bool(intr["sustained"])
    figures["interruption_sustained"] = bool(intr["sustained"])
    figures["first_failure_at"] = intr.get("first_failure_at")
    figures["last_failure_at"] = intr.get("last_failure_at")
    return figures, ground
