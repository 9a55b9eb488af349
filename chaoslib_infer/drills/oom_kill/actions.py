"""Lab actions of the oom-kill drill: the kernel OOM killer picks a replica's model server.

:func:`oom_kill_replica` drives the lab's memory hog (:meth:`chaoslib_infer.lab.fleet.Lab.oom_kill`,
:mod:`chaoslib_infer.lab.hog`) and appends the fault to the drill's fault log
(``<infer_run_dir>/faults.jsonl``), from which :mod:`chaoslib_infer.drills.oom_kill.figures`
computes the figures. Rollback: the shared :func:`chaoslib_infer.activities.lab.clear_lab_faults`.
"""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab.activity import attach_lab, log_fault, pick_replica
from chaoslib_infer.lab.fleet import LabError

__all__ = ["oom_kill_replica"]


def oom_kill_replica(
    replica: str = "auto", timeout_s: float = 30.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """OOM-kill one replica's model-server process through memory pressure inside its own cgroup.

    A memory hog joins the replica's memory cgroup with ``oom_score_adj = -1000`` and allocates until
    the cgroup hits its limit, so the *kernel* OOM killer picks the model server (as it would pick a
    vLLM worker whose KV cache or a fragmented allocator outgrew the container limit). The hog frees
    its memory and exits once the cgroup's ``oom_kill`` counter rises; supervisord then restarts the
    server, paying its weight-load delay and warm-up.

    Args:
        replica: replica name (``r0``...) or ``"auto"`` for the first replica.
        timeout_s: seconds to wait for the kernel OOM kill before giving up (the hog is removed).
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"replica", "fault_at" (unix s: the last read of the cgroup's OOM counter that saw no
        kill), "oom_observed_at" (the read that saw it), "oom_kills_before", "oom_kills_after",
        "killed_pid", "hog_pid", "cgroup", "injected_at"}``.

    Raises:
        ActivityFailed: no lab, unknown replica, or no OOM kill within ``timeout_s``.
    """
    lab = attach_lab(configuration)
    name = pick_replica(lab, replica)
    try:
        result = lab.oom_kill(name, timeout_s=float(timeout_s))
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    log_fault(configuration, {"kind": "oom-kill", **result})
    return result
