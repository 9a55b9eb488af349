"""Lab actions of the traffic-spike drill (drill 4 of the list).

:func:`inject_traffic_spike` records the spike that the background load's rate ``profile`` is about
to play (before it starts) and waits for it; :func:`wait_for_spike_over` waits until the spike and a
settling time are over and reports the lab's scale-out ground truth
(:mod:`chaoslib_infer.lab.scaling`).
The fault goes to the drill's fault log (``<infer_run_dir>/faults.jsonl``), from which
:mod:`chaoslib_infer.drills.traffic_spike.figures` computes the figures.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab import scaling
from chaoslib_infer.lab.activity import attach_lab, last_fault, log_fault, run_records
from chaoslib_infer.lab.fleet import LabError
from chaoslib_infer.load.schedule import check_profile, profile_schedule

__all__ = [
    "inject_traffic_spike",
    "wait_for_spike_over",
]


def load_started_at(
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
    lab = attach_lab(configuration)
    deadline = time.monotonic() + float(wait_for_load_s)
    started = load_started_at(run_records(configuration), phases, seed)
    while started is None:
        if time.monotonic() > deadline:
            raise ActivityFailed(
                f"no load record within {wait_for_load_s:g} s: is the load running?"
            )
        time.sleep(0.2)
        started = load_started_at(run_records(configuration), phases, seed)
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
    log_fault(configuration, entry)
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
    fault = last_fault(configuration, "traffic-spike")
    if fault is None:
        raise ActivityFailed("no traffic-spike recorded in this run; nothing to wait for")
    lab = attach_lab(configuration)
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
    shed = sum(1 for r in run_records(configuration) if r.get("status") in (429, 503))
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
