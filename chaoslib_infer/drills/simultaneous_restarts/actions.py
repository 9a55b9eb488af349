"""Drill 4, simultaneous restarts: does the load balancer pour all traffic onto the survivor?

The action restarts K of the N replicas at the same instant through supervisord
(:mod:`chaoslib_infer.lab.restarts`), samples the gateway meanwhile (HAProxy ``show stat`` every
~50 ms: queue and sessions per server; the survivors' ``vllm:num_requests_waiting``), waits for the
lab's ground truth that every restarted replica serves again, and holds until ``hold_s`` after the
restart so that the steady-state hypothesis that follows looks at the requests sent *during* the
restart period (not at the ones already in flight on a killed replica, which are lost either way
and counted in the figures).
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.lab import restarts as lab_restarts
from chaoslib_infer.lab.activity import attach_lab, log_fault
from chaoslib_infer.lab.fleet import LabError
from chaoslib_infer.lab.gateway_sampler import GatewaySampler, serving_replicas

__all__ = ["restart_replicas"]

KIND = lab_restarts.KIND


def restart_replicas(
    k: int | str = "all-but-one",
    method: str = "kill",
    hold_s: float = 8.2,
    timeout_s: float = 30.0,
    sample_interval_s: float = 0.05,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Restart ``k`` replicas at the same instant and wait until every one serves again.

    Args:
        k: ``"all-but-one"`` (default: one survivor, the last replica), ``"all"``, or a count
            (the first ``k`` replicas restart, the others survive).
        method: ``"kill"`` (SIGKILL through supervisord, which respawns) or ``"stop-start"``.
        hold_s: return no earlier than ``hold_s`` seconds after the restart (set it to the
            hypothesis ``window_s`` plus a little so the after-hypothesis window starts just after
            the restart instant).
        timeout_s: seconds to wait for every restarted replica to serve again.
        sample_interval_s: HAProxy ``show stat`` sampling period, seconds.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"replicas", "survivors", "method", "fault_at" (unix s), "restarts" ({replica:
        {"died_at", "cause", "started_at", "new_pid", "ready_at", "serving_again_at"}}),
        "all_serving_at", "all_serving_s", "queue_max", "survivor_scur_max",
        "survivor_waiting_max", "samples" (file)}``.

    Raises:
        ActivityFailed: no lab, bad ``k``/``method``, a replica not running, or not every
            replica served again within ``timeout_s``.
    """
    lab = attach_lab(configuration)
    try:
        targets, survivors = lab_restarts.pick_targets(serving_replicas(lab), k)
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    if method not in lab_restarts.METHODS:
        raise ActivityFailed(
            f"method must be one of {', '.join(lab_restarts.METHODS)}, got {method!r}"
        )
    sampler = GatewaySampler(lab, interval_s=float(sample_interval_s)).start()
    samples = settings.run_dir(configuration) / "simultaneous-restarts-samples.jsonl"
    base: dict[str, Any] = {"kind": KIND, "k": k, "lab_dir": str(lab.state_dir)}
    try:
        time.sleep(0.3)  # a few samples of the steady state
        try:
            res = lab_restarts.restart(lab, targets, method=method)
        except LabError as exc:
            raise ActivityFailed(str(exc)) from exc
        base.update(
            replicas=targets,
            survivors=survivors,
            method=method,
            fault_at=float(res["fault_at"]),
            fault_id=res["id"],
            killed_pids=res["killed_pids"],
            calls=res["calls"],
        )
        log_fault(configuration, {**base, "phase": "injected"})
        try:
            res = lab_restarts.wait_restarted(lab, res, timeout_s=float(timeout_s))
        except LabError as exc:
            raise ActivityFailed(str(exc)) from exc
        end = float(res["fault_at"]) + float(hold_s)
        while time.time() < end:
            time.sleep(min(0.05, max(0.0, end - time.time())))
    finally:
        sampler.stop()
        sampler.write(samples)
    fault_at = float(res["fault_at"])
    result = {
        **base,
        "phase": "restarted",
        "restarts": res["restarts"],
        "all_serving_at": res["all_serving_at"],
        "all_serving_s": res["all_serving_s"],
        **sampler.queue_figures(fault_at, float(res["all_serving_at"]), targets, survivors),
        "samples": str(samples),
    }
    log_fault(configuration, result)
    return result
