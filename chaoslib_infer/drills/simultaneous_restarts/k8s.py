"""Kubernetes actions and rollbacks of the simultaneous-restarts drill.

Delete several target pods at the same instant and time each one's recovery.

Conventions every room's ``k8s.py`` follows: :mod:`chaoslib_infer.drills`.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
from chaoslib_infer.platforms.kubernetes.activity import (
    k8s_context,
    log_fault,
)

__all__ = [
    "k8s_simultaneous_restarts",
]


def k8s_simultaneous_restarts(
    count: int = 2,
    pods: list[str] | None = None,
    grace_period_s: int = 0,
    recovery_timeout_s: float = 120.0,
    poll_s: float = 0.25,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Delete ``count`` Ready target pods at the same instant, then time each one's recovery.

    One thread per pod sends its DELETE, all released by one barrier; then the target pods are
    polled until every deleted pod has a Ready replacement (krkn-style figures, see
    :mod:`chaoslib_infer.platforms.kubernetes.pods`). Nothing to roll back: the controller
    recreates the pods.

    Args:
        count: how many pods (the first Ready ones by name) when ``pods`` is not given.
        pods: exact pod names to delete instead.
        grace_period_s: deletion grace period, seconds (0: immediate SIGKILL).
        recovery_timeout_s: bound on the recovery wait, seconds.
        poll_s: polling interval of the recovery probe, seconds (the timings' precision).
        target_file: the target YAML (default: ``infer_k8s_target`` / ``$CHAOS_INFER_K8S_TARGET``).
        configuration: Chaos Toolkit configuration (``infer_run_dir``).

    Returns:
        ``{"kind": "k8s-simultaneous-restarts", "fault_at" (unix s), "deleted": [...],
        "recovery": {...}}`` (see :func:`~chaoslib_infer.platforms.kubernetes.pods.recovery_timings`).

    Raises:
        ActivityFailed: allowlist refusal, too few Ready pods, a DELETE refused (403/404), or a
            pod not recovered within ``recovery_timeout_s``.
    """
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    try:
        before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
        chosen = k8s_pods.select_pods(before, count, pods)
        known = {str(p["metadata"].get("uid")) for p in before}
        fault_at = time.time()
        log_fault(
            configuration,
            {
                "kind": "k8s-simultaneous-restarts",
                "fault_at": fault_at,
                "namespace": t.namespace,
                "pods": [p["metadata"]["name"] for p in chosen],
            },
        )
        deleted = k8s_pods.delete_simultaneously(ctx.core, t.namespace, chosen, grace_period_s)
        errors = [d["error"] for d in deleted if d["error"]]
        if errors:
            raise ActivityFailed(errors[0])
        recovery = k8s_pods.recovery_timings(
            ctx.core, t.namespace, t.selector, deleted, known, recovery_timeout_s, poll_s
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    result = {
        "kind": "k8s-simultaneous-restarts",
        "fault_at": fault_at,
        "deleted": deleted,
        "recovery": recovery,
    }
    log_fault(configuration, {"kind": "k8s-recovery", "fault_at": fault_at, **recovery})
    if recovery["unrecovered"]:
        raise ActivityFailed(
            f"{len(recovery['unrecovered'])} deleted pod(s) without a Ready replacement after "
            f"{recovery_timeout_s:g} s: {', '.join(recovery['unrecovered'])}"
        )
    return result
