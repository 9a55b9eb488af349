"""Drill 3, upstream timeout: one replica stops answering while keeping its socket open.

Does the gateway fail fast, or let requests hang until the client gives up (and how many)? The
action freezes one replica (:mod:`chaoslib_infer.lab.freeze`), holds the fault while a background
thread samples HAProxy's ``show stat`` every ~50 ms (server status: ground truth of the ejection;
``qcur``/``scur``: queue growth) and the engines' ``vllm:num_requests_waiting`` where reachable,
then leaves the replica frozen for the steady-state hypothesis; the rollback thaws it.

Also home of :class:`GatewaySampler`, shared with the simultaneous-restarts drill.
"""

from __future__ import annotations

import json
import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.lab import freeze as lab_freeze
from chaoslib_infer.lab.activity import attach_lab, log_fault, pick_replica
from chaoslib_infer.lab.fleet import FAULTS_FILE, Lab, LabError
from chaoslib_infer.lab.gateway_sampler import GatewaySampler, serving_replicas

__all__ = [
    "freeze_replica",
    "thaw_replicas",
]

KIND = lab_freeze.KIND


def freeze_replica(
    replica: str = "auto",
    mode: str = "freeze",
    hold_s: float = 14.0,
    ttl_s: float = 120.0,
    sample_interval_s: float = 0.05,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Freeze one replica (socket left open) and hold the fault while sampling the gateway.

    The replica stays frozen after this action returns (the steady-state hypothesis then checks
    the service with one upstream hung); the rollback (:func:`thaw_replicas` /
    ``clear_lab_faults``) thaws it, and a dead-man timer thaws it after ``ttl_s`` whatever happens.

    Args:
        replica: replica name or ``"auto"`` (the first replica).
        mode: ``"freeze"`` (cgroup freezer, SIGSTOP fallback), ``"sigstop"``, or ``"blackhole"``
            (iptables DROP in the replica's network namespace; needs lab nodes).
        hold_s: seconds to hold the fault before returning (long enough for every request hung
            on the replica to reach the client's timeout).
        ttl_s: dead-man delay, seconds after injection.
        sample_interval_s: ``show stat`` sampling period, seconds.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"replica", "mode", "freezer", "fault_at" (unix s), "ejected_at" (unix s, HAProxy no
        longer has the replica UP; None if never), "ejection_s", "queue_max", "watched_scur_max"
        (requests hung on the replica at once), "survivor_waiting_max", "samples" (file)}``.

    Raises:
        ActivityFailed: no lab, unknown replica, ``blackhole`` without nodes, or the freeze failed.
    """
    if mode not in lab_freeze.MODES:
        raise ActivityFailed(f"mode must be one of {', '.join(lab_freeze.MODES)}, got {mode!r}")
    lab = attach_lab(configuration)
    name = pick_replica(lab, replica)
    survivors = [n for n in serving_replicas(lab) if n != name]
    sampler = GatewaySampler(lab, interval_s=float(sample_interval_s)).start()
    try:
        time.sleep(0.3)  # a few samples of the steady state
        try:
            rec = lab_freeze.freeze_replica(lab, name, mode=mode, ttl_s=float(ttl_s))
        except LabError as exc:
            raise ActivityFailed(str(exc)) from exc
        fault_at = float(rec["fault_at"])
        base = {
            "kind": KIND,
            "replica": name,
            "survivors": survivors,
            "mode": rec["mode"],
            "requested_mode": mode,
            "freezer": rec.get("freezer"),
            "cgroup": rec.get("cgroup"),
            "pids": rec.get("pids"),
            "fallback_reason": rec.get("fallback_reason"),
            "fault_id": rec.get("id"),
            "deadman_pid": rec.get("deadman_pid"),
            "fault_at": fault_at,
            "hold_s": float(hold_s),
            "lab_dir": str(lab.state_dir),
        }
        log_fault(configuration, {**base, "phase": "injected"})
        end = fault_at + float(hold_s)
        while time.time() < end:
            time.sleep(min(0.05, max(0.0, end - time.time())))
    finally:
        sampler.stop()
    samples = settings.run_dir(configuration) / "upstream-timeout-samples.jsonl"
    sampler.write(samples)
    held_until = time.time()
    ejected = sampler.ejected_at(name, fault_at)
    result = {
        **base,
        "phase": "held",
        "held_until": held_until,
        "ejected_at": ejected,
        "ejection_s": (ejected - fault_at) if ejected is not None else None,
        **sampler.queue_figures(fault_at, held_until, [name], survivors),
        "samples": str(samples),
    }
    log_fault(configuration, result)
    return result


def thaw_replicas(configuration: dict[str, Any] | None = None) -> list[str]:
    """Rollback: thaw every replica frozen by an upstream-timeout fault (idempotent).

    Returns:
        What was thawed (empty when nothing was frozen).
    """
    try:
        lab = Lab.attach(settings.lab_dir(configuration))
    except LabError:
        return []
    notes: list[str] = []
    for f in _recorded(lab):
        if f.get("kind") == KIND and f.get("id"):
            note = lab.remove_fault(str(f["id"]))
            if note:
                notes.append(note)
    return notes


def _recorded(lab: Lab) -> list[dict[str, Any]]:
    """Every fault record in the lab's ledger (active or not), so rollbacks also forget them."""
    try:
        data = json.loads((lab.state_dir / FAULTS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [f for f in data if isinstance(f, dict)]
