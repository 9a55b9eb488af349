"""Lab actions of the quota-cut drill (drill 7 of the list).

:func:`cut_replica_quota` plans the instance count for the drill's own load with the capacity
formula (:mod:`chaoslib_infer.capacity`) and caps the serving replicas at that quota (or at a given
one) through :mod:`chaoslib_infer.lab.scaling`; the fault goes to the drill's fault log
(``<infer_run_dir>/faults.jsonl``), from which :mod:`chaoslib_infer.drills.quota_cut.figures`
computes the figures. Rollback: the shared :func:`chaoslib_infer.activities.lab.clear_lab_faults`.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.capacity import plan as capacity_plan
from chaoslib_infer.lab import scaling
from chaoslib_infer.lab.activity import attach_lab, log_fault, run_records
from chaoslib_infer.lab.fleet import LabError
from chaoslib_infer.measure.metrics import window_stats

__all__ = [
    "cut_replica_quota",
]


def _auto(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto"))


def _number(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ActivityFailed(f"{name} must be a number or 'auto', got {value!r}") from None
    if not out > 0:
        raise ActivityFailed(f"{name} must be > 0, got {value!r}")
    return out


def cut_replica_quota(
    quota: Any = "auto",
    offered_rps: Any = "auto",
    expected_latency_s: Any = "auto",
    redundancy_factor: float = 0.7,
    window_s: float = 8.0,
    drain_timeout_s: float = 5.0,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lower the replicas allowed to ``quota`` while the planned load goes on.

    The quota defaults to the capacity formula for the offered load (``docs/definitions.md``):
    ``ceil(offered_rps x expected_latency_s / max_concurrency_per_instance / redundancy_factor)``,
    with the latency the steady-state P50 E2E of the last ``window_s`` seconds and the concurrency
    the engine's ``max_num_seqs`` (from the lab's engine arguments). The replicas beyond the quota
    go to HAProxy maintenance (``set server engines/rX state maint``), are drained and stopped
    through supervisord; the cap is in the lab's fault ledger before anything changes, and the
    ``clear-lab-faults`` rollback starts and re-enables every stopped replica.

    Args:
        quota: replicas allowed (integer >= 1), or ``"auto"`` for the formula's answer.
        offered_rps: the drill's offered load in requests/s, or ``"auto"`` to measure it from the
            records (first attempts whose intended send time is in the last ``window_s``).
        expected_latency_s: seconds, or ``"auto"`` for the steady-state P50 E2E latency.
        redundancy_factor: target utilisation in (0, 1] (the formula's divisor).
        window_s: look-back window in seconds for the measured inputs.
        drain_timeout_s: seconds to let each stopped replica finish its in-flight requests.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"fault_at", "cut_done_at" (unix s), "quota", "quota_source" ("formula" | "given"),
        "planned_instances", "capacity_raw", "offered_rps", "expected_latency_s",
        "max_concurrency_per_instance", "redundancy_factor", "kept", "stopped", "fault_id"}``.

    Raises:
        ActivityFailed: no lab, no steady-state data for an ``"auto"`` input, a bad argument, or
            the lab could not apply the cap.
    """
    lab = attach_lab(configuration)
    now = time.time()
    window = float(window_s)
    records = run_records(configuration)
    recent = window_stats(records, start=now - window, end=now)
    if _auto(offered_rps):
        sent = [
            r
            for r in records
            if int(r.get("attempt") or 1) == 1
            and isinstance(r.get("intended_at"), int | float)
            and now - window <= float(r["intended_at"]) < now
        ]
        if not sent:
            raise ActivityFailed(f"no request in the last {window:g} s to measure the offered load")
        offered = len(sent) / window
    else:
        offered = _number("offered_rps", offered_rps)
    if _auto(expected_latency_s):
        if recent.get("p50_e2e_s") is None:
            raise ActivityFailed(f"no successful request in the last {window:g} s: no P50 latency")
        latency = float(recent["p50_e2e_s"])
    else:
        latency = _number("expected_latency_s", expected_latency_s)
    concurrency = scaling.max_concurrency_per_instance(lab)
    try:
        cap = capacity_plan(offered, latency, concurrency, float(redundancy_factor))
    except ValueError as exc:
        raise ActivityFailed(f"capacity formula: {exc}") from exc
    if _auto(quota):
        allowed, source = cap.instances, "formula"
    else:
        try:
            allowed = int(str(quota))
        except ValueError:
            raise ActivityFailed(
                f"quota must be an integer >= 1 or 'auto', got {quota!r}"
            ) from None
        source = "given"
    plan_info = {
        "planned_instances": cap.instances,
        "capacity_raw": cap.raw,
        "offered_rps": offered,
        "expected_latency_s": latency,
        "max_concurrency_per_instance": concurrency,
        "redundancy_factor": cap.redundancy_factor,
        "quota_source": source,
    }
    try:
        cut = scaling.cap_replicas(lab, allowed, float(drain_timeout_s), **plan_info)
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    entry = {
        "kind": "quota-cut",
        "fault_at": cut["cut_at"],
        "cut_done_at": cut["cut_done_at"],
        "quota": allowed,
        **plan_info,
        "kept": cut["kept"],
        "stopped": cut["stopped"],
        "serving_before": cut["serving_before"],
        "drained": {s["replica"]: s["drained"] for s in cut["stops"]},
        "fault_id": cut["fault_id"],
        "lab_dir": str(lab.state_dir),
        "formula": cap.describe(),
    }
    log_fault(configuration, entry)
    return entry
