"""Kubernetes actions and rollbacks of the quota-cut drill.

Lower the target's GPU ResourceQuota (and its Deployment's replicas) and put it back.

Conventions every room's ``k8s.py`` follows: :mod:`chaoslib_infer.drills`.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import quota as k8s_quota
from chaoslib_infer.platforms.kubernetes.activity import (
    k8s_context,
    load_state,
    log_fault,
    save_state,
    undo_saved,
)

__all__ = [
    "k8s_cut_quota",
    "k8s_restore_quota",
]


def k8s_cut_quota(
    gpus: int | None = None,
    replicas: int | None = None,
    hpa_max_replicas: int | None = None,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lower the target's ResourceQuota ``requests.nvidia.com/gpu``, its Deployment's replicas
    and/or its HorizontalPodAutoscaler's ``maxReplicas``.

    The objects (target ``quota:``, ``deployment:``, ``hpa:``) are read and saved raw to
    ``k8s-state/quota-cut.json`` *before* the cut; :func:`k8s_restore_quota` puts them back.
    The HPA is the target's ``hpa:``; without one, the HPA named like the Deployment (what
    ``kubectl autoscale`` creates) if it exists (else that part of the cut is skipped, reported
    as ``hpa_skipped``). ``minReplicas`` is lowered too when it exceeds the new maximum.

    Args:
        gpus: new GPU hard limit (None: quota untouched).
        replicas: new replica count (None: Deployment untouched).
        hpa_max_replicas: new HPA ``maxReplicas`` (None: HPA untouched).
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "k8s-quota-cut", "fault_at", "quota": {"name", "before", "after"} | None,
        "deployment": {"name", "before", "after"} | None, "hpa": {"name", "before", "after",
        "min_before", "min_after"} | None, "hpa_skipped": str | None}``.

    Raises:
        ActivityFailed: nothing to cut, a cut already in place (restore it first), an object absent
            (404) or not writable (403), an HPA that scales another object.
    """
    if gpus is None and replicas is None and hpa_max_replicas is None:
        raise ActivityFailed("k8s_cut_quota: give gpus, replicas, hpa_max_replicas, or several")
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    if load_state(configuration, "quota-cut") is not None:
        raise ActivityFailed(
            "a quota cut is already in place in this run; roll it back first (k8s_restore_quota)"
        )
    try:
        hpa_named = getattr(t, "hpa", None)
        saved = k8s_quota.snapshot(
            ctx.core,
            ctx.apps,
            t.namespace,
            t.quota if gpus is not None else None,
            t.deployment if replicas is not None else None,
            (hpa_named or t.deployment) if hpa_max_replicas is not None else None,
            hpa_optional=not hpa_named,
            hpa_target=t.deployment,
        )
        save_state(configuration, "quota-cut", saved, t)
        fault_at = time.time()
        done = k8s_quota.cut(ctx.core, ctx.apps, saved, gpus, replicas, hpa_max_replicas)
        done["hpa_skipped"] = saved.get("hpa_skipped")
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    entry = {"kind": "k8s-quota-cut", "fault_at": fault_at, "namespace": t.namespace, **done}
    log_fault(configuration, entry)
    return entry


def k8s_restore_quota(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> list[str]:
    """Rollback of :func:`k8s_cut_quota`: PUT back the saved objects (resourceVersion-free).

    Args:
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        One line per restored object; ``[]`` when no cut is recorded (idempotent).

    Raises:
        ActivityFailed: a PUT refused (403/404) or the object read back differs from the saved one.
    """
    nothing: list[str] = []
    return undo_saved(
        configuration,
        target_file,
        "quota-cut",
        nothing,
        lambda ctx, saved: k8s_quota.restore(ctx.core, ctx.apps, saved),
    )
