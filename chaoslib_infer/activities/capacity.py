"""Actions of the capacity drills: quota cut (drill 7 of the list) and sudden traffic spike (drill 4).

Both act on the local lab (see :mod:`chaoslib_infer.lab.scaling`) and append their fault to the
drill's fault log (``<infer_run_dir>/faults.jsonl``), from which
``chaoslib_infer.evidence.kinds.quota_cut`` / ``traffic_spike`` compute the figures.

- :func:`cut_replica_quota` plans the instance count for the drill's own load with the capacity
  formula (:mod:`chaoslib_infer.capacity`) and caps the serving replicas at that quota (or at a
  given one).
- :func:`inject_traffic_spike` records the spike that the background load's rate ``profile`` is about
  to play (before it starts) and waits for it; :func:`wait_for_spike_over` waits until the spike and
  a settling time are over and reports the lab's scale-out ground truth.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.activities.lab import _lab, _last_fault, _log_fault
from chaoslib_infer.capacity import plan as capacity_plan
from chaoslib_infer.lab import scaling
from chaoslib_infer.lab.fleet import LabError
from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.schedule import check_profile, profile_schedule
from chaoslib_infer.measure.metrics import window_stats

__all__ = ["cut_replica_quota", "inject_traffic_spike", "wait_for_spike_over"]


def _records(configuration: dict[str, Any] | None) -> list[dict[str, Any]]:
    path = settings.records_path(configuration)
    return read_records(path) if path.exists() else []


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
    lab = _lab(configuration)
    now = time.time()
    window = float(window_s)
    records = _records(configuration)
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
    _log_fault(configuration, entry)
    return entry


def _load_started_at(
    records: list[dict[str, Any]], profile: list[tuple[float, float]], seed: Any
) -> float | None:
    """Unix time the load's schedule started: the earliest first-attempt ``intended_at`` minus the
    first scheduled offset of the profile's schedule for ``seed`` (None: the load generator's
    default seed 0; ``"random"``: the offset is taken as 0, an error of about one mean gap)."""
    firsts = [
        float(r["intended_at"])
        for r in records
        if int(r.get("attempt") or 1) == 1 and isinstance(r.get("intended_at"), int | float)
    ]
    if not firsts:
        return None
    first_offset = 0.0
    if seed != "random":
        offsets = profile_schedule(profile, 0 if seed is None else int(str(seed)))
        first_offset = offsets[0] if offsets else 0.0
    return min(firsts) - first_offset


def inject_traffic_spike(
    profile: list[list[float]],
    spike_phase: int = 1,
    seed: Any = None,
    wait_for_load_s: float = 10.0,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record the traffic spike that the background load's rate ``profile`` is about to play, then
    wait until it starts.

    The spike is phase ``spike_phase`` of the profile (the load control's ``profile`` argument, e.g.
    ``[[12, 8], [15, 28], [12, 8]]``: baseline, 2x the peak, back). The lab's fault ledger gets a
    ``traffic-spike`` record *before* the spike begins; its undo (the ``clear-lab-faults`` rollback)
    returns the lab to its initial size: every standby replica the autoscaler started goes back to
    maintenance and is stopped, so the next drill starts from the same lab.

    Args:
        profile: ``[[duration_s, rate_rps], ...]``, the same value as the load control's.
        spike_phase: index (0-based) of the spike phase in ``profile``.
        seed: the load control's ``seed`` (None: the load generator's default, 0), used to find
            the exact start time of the load's schedule.
        wait_for_load_s: seconds to wait for the first load record.
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind", "fault_at" (spike start, unix s), "spike_end_at", "spike_rps", "baseline_rps",
        "load_started_at", "profile", "spike_phase", "standby", "autoscale", "fault_id",
        "recorded_at"}``.

    Raises:
        ActivityFailed: bad profile or phase, no load records, or the spike already started (the
            baseline phase is too short for the warm-up and the hypothesis).
    """
    try:
        phases = check_profile(profile)
    except ValueError as exc:
        raise ActivityFailed(f"profile: {exc}") from exc
    k = int(spike_phase)
    if not 1 <= k < len(phases):
        raise ActivityFailed(f"spike_phase must be 1..{len(phases) - 1}, got {spike_phase!r}")
    lab = _lab(configuration)
    deadline = time.monotonic() + float(wait_for_load_s)
    started = _load_started_at(_records(configuration), phases, seed)
    while started is None:
        if time.monotonic() > deadline:
            raise ActivityFailed(
                f"no load record within {wait_for_load_s:g} s: is the load running?"
            )
        time.sleep(0.2)
        started = _load_started_at(_records(configuration), phases, seed)
    spike_at = started + sum(d for d, _ in phases[:k])
    spike_end = spike_at + phases[k][0]
    now = time.time()
    if now >= spike_at:
        raise ActivityFailed(
            f"the spike phase started {now - spike_at:.1f} s before it could be recorded; "
            "make the profile's baseline phase longer than the warm-up and the hypothesis"
        )
    standby = scaling.standby_names(lab)
    opts = lab.meta.get("scaling") or {}
    try:
        fault_id = lab.add_fault(
            {
                "kind": "traffic-spike",
                "module": scaling.MODULE,
                "replica": None,
                "standby": standby,
                "spike_start_at": spike_at,
                "spike_end_at": spike_end,
                "ttl_s": max(spike_end - now, 0.0) + 90.0,
            }
        )
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    entry = {
        "kind": "traffic-spike",
        "fault_at": spike_at,
        "spike_end_at": spike_end,
        "spike_rps": phases[k][1],
        "baseline_rps": phases[k - 1][1],
        "load_started_at": started,
        "profile": [list(p) for p in phases],
        "spike_phase": k,
        "standby": standby,
        "autoscale": bool(opts.get("autoscale")),
        "scaling": opts,
        "fault_id": fault_id,
        "lab_dir": str(lab.state_dir),
        "recorded_at": now,
    }
    _log_fault(configuration, entry)
    delay = spike_at - time.time()
    if delay > 0:
        time.sleep(delay)
    return entry


def wait_for_spike_over(
    settle_s: float = 8.0, timeout_s: float = 120.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Wait until the recorded spike is over plus ``settle_s`` seconds; report what the lab did.

    Args:
        settle_s: seconds after the end of the spike phase (the load back at its baseline).
        timeout_s: upper bound of the wait, seconds.
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"spike_start_at", "spike_end_at", "scale_out_events": [lab events since the spike was
        recorded], "shed_so_far" (429/503 records), "serving": [replicas serving now]}``.

    Raises:
        ActivityFailed: no traffic-spike recorded in this run, or no lab.
    """
    fault = _last_fault(configuration, "traffic-spike")
    if fault is None:
        raise ActivityFailed("no traffic-spike recorded in this run; nothing to wait for")
    lab = _lab(configuration)
    until = float(fault["spike_end_at"]) + float(settle_s)
    delay = min(until - time.time(), float(timeout_s))
    if delay > 0:
        time.sleep(delay)
    since = float(fault.get("recorded_at") or fault["fault_at"])
    events = [
        e
        for e in lab.events()
        if str(e.get("event", "")).startswith("scale_out") and float(e.get("t") or 0.0) >= since
    ]
    shed = sum(1 for r in _records(configuration) if r.get("status") in (429, 503))
    try:
        serving = scaling.serving_replicas(lab)
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    return {
        "spike_start_at": fault["fault_at"],
        "spike_end_at": fault["spike_end_at"],
        "scale_out_events": events,
        "shed_so_far": shed,
        "serving": serving,
    }
