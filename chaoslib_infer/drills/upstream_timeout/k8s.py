"""Kubernetes actions and rollbacks of the upstream-timeout drill.

Freeze a model server (socket left open) or block its ingress with a NetworkPolicy, and undo it.

Conventions every room's ``k8s.py`` follows: :mod:`chaoslib_infer.drills`.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import freeze as k8s_freeze
from chaoslib_infer.platforms.kubernetes import policy as k8s_policy
from chaoslib_infer.platforms.kubernetes.activity import (
    k8s_context,
    load_state,
    log_fault,
    networking_api,
    one_ready_pod,
    refuse_twice,
    save_state,
    state_path,
    undo_saved,
)

__all__ = [
    "k8s_block_pod_ingress",
    "k8s_freeze_model_server",
    "k8s_restore_pod_ingress",
    "k8s_thaw_model_server",
]


def k8s_freeze_model_server(
    pod: str | None = None,
    pid: int = 1,
    ttl_s: float = 120.0,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """upstream-timeout: SIGSTOP the model server in one pod (``pods/exec``), so it hangs.

    ``pid=1`` means the container's main process; as a PID namespace's init ignores SIGSTOP from
    inside its namespace, it is resolved: the server under an init (tini, dumb-init, a shell); the
    server's child processes (engine workers) when the server itself is PID 1 (``how`` says so);
    refused when PID 1 has no child (see :mod:`chaoslib_infer.platforms.kubernetes.freeze`). The processes (pid + start time) are saved
    to ``k8s-state/upstream-freeze.json`` before the signal; :func:`k8s_thaw_model_server` sends
    SIGCONT. A dead-man timer in the container thaws them after ``ttl_s`` anyway.

    Args:
        pod: target pod (default: the first Ready target pod).
        pid: process to freeze as seen in the container (1: the main process, resolved).
        ttl_s: the in-container dead-man timer, seconds (0: none).
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "k8s-upstream-freeze", "fault_at", "pod", "container", "pid", "how",
        "targets": [{"pid", "start", "comm"}], "stopped": [pids], "not_stopped": [pids],
        "ttl_s", "timer"}``.

    Raises:
        ActivityFailed: PID 1 is the model server with no child (unsupported), no such process, exec
            refused (403), pod absent (404), no interpreter, or nothing stopped.
    """
    if ttl_s < 0 or pid < 1:
        raise ActivityFailed(
            f"k8s_freeze_model_server: need pid >= 1 and ttl_s >= 0 (got {pid}, {ttl_s})"
        )
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    refuse_twice(configuration, "upstream-freeze", "k8s_thaw_model_server")
    try:
        chosen = one_ready_pod(ctx, pod)
        name = chosen["metadata"]["name"]
        interp, helper, procs = k8s_freeze.probe(ctx.core, t.namespace, name, t.container)
        targets, how = k8s_freeze.resolve_targets(procs, helper, pid)
        saved: dict[str, Any] = {
            "namespace": t.namespace,
            "pod": name,
            "container": t.container,
            "container_id": k8s_freeze.container_id(chosen, t.container),
            "interpreter": interp,
            "targets": [{"pid": p.pid, "start": p.start, "comm": p.comm} for p in targets],
            "how": how,
            "timer": None,
        }
        save_state(configuration, "upstream-freeze", saved, t)
        fault_at = time.time()
        log_fault(
            configuration,
            {
                "kind": "k8s-upstream-freeze",
                "fault_at": fault_at,
                "pod": name,
                "container": t.container,
                "pids": [p.pid for p in targets],
                "how": how,
            },
        )
        done = k8s_freeze.freeze(
            ctx.core, saved, ttl_s, lambda s: save_state(configuration, "upstream-freeze", s)
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    return {
        "kind": "k8s-upstream-freeze",
        "fault_at": fault_at,
        "pod": name,
        "container": t.container,
        "pid": pid,
        "how": how,
        "targets": saved["targets"],
        "stopped": done["stopped"],
        "not_stopped": done["not_stopped"],
        "ttl_s": ttl_s,
        "timer": done["timer"],
    }


def k8s_thaw_model_server(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> str:
    """Rollback of :func:`k8s_freeze_model_server`: SIGCONT the frozen processes (idempotent).

    Returns:
        One line; ``"no model server frozen by this run"`` when nothing is recorded.

    Raises:
        ActivityFailed: the pod could not be read or the exec was refused (403).
    """
    return undo_saved(
        configuration,
        target_file,
        "upstream-freeze",
        "no model server frozen by this run",
        lambda ctx, st: k8s_freeze.thaw(ctx.core, st),
        log_keys=("pod",),
    )


def k8s_block_pod_ingress(
    pod: str | None = None,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """upstream-timeout, network variant: a NetworkPolicy that denies all ingress to one pod.

    The pod's labels are saved exactly to ``k8s-state/upstream-ingress.json``, then it gets a
    unique label and a NetworkPolicy (``policyTypes: [Ingress]``, no rule) selects it;
    :func:`k8s_restore_pod_ingress` deletes the policy and puts the labels back exactly. Needs a
    CNI that enforces NetworkPolicy (see :mod:`chaoslib_infer.platforms.kubernetes.policy`).

    Args:
        pod: target pod (default: the first Ready target pod).
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "k8s-upstream-ingress-block", "fault_at", "pod", "policy", "label",
        "labelled_at", "created_at"}``.

    Raises:
        ActivityFailed: 403 (pods patch, networkpolicies create), pod absent (404), 409.
    """
    import uuid

    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    refuse_twice(configuration, "upstream-ingress", "k8s_restore_pod_ingress")
    token = uuid.uuid4().hex[:12]
    try:
        chosen = one_ready_pod(ctx, pod)
        name = chosen["metadata"]["name"]
        saved = {
            "namespace": t.namespace,
            "pod": name,
            "policy": f"chaos-infer-block-{token}",
            "token": token,
            "labels": dict(chosen["metadata"].get("labels") or {}),
        }
        save_state(configuration, "upstream-ingress", saved, t)
        fault_at = time.time()
        log_fault(
            configuration,
            {
                "kind": "k8s-upstream-ingress-block",
                "fault_at": fault_at,
                "pod": name,
                "policy": saved["policy"],
            },
        )
        done = k8s_policy.block(ctx.core, networking_api(ctx), t.namespace, name, token, saved)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    return {"kind": "k8s-upstream-ingress-block", "fault_at": fault_at, **done}


def k8s_restore_pod_ingress(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> list[str]:
    """Rollback of :func:`k8s_block_pod_ingress`: delete the policy, restore the pod's labels.

    Returns:
        One line per step; ``[]`` when nothing is recorded (idempotent).

    Raises:
        ActivityFailed: 403; a policy of that name this drill did not create; labels read back
            differ from the stored ones.
    """
    state = load_state(configuration, "upstream-ingress")
    if state is None:
        return []
    ctx = k8s_context(target_file, configuration)
    try:
        lines = k8s_policy.unblock(ctx.core, networking_api(ctx), state)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    state_path(configuration, "upstream-ingress").unlink(missing_ok=True)
    log_fault(
        configuration,
        {"kind": "k8s-upstream-ingress-block", "phase": "cleared", "at": time.time()},
    )
    return lines
