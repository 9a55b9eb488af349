"""Kubernetes actions and rollbacks of the network-jitter drill.

netem delay/jitter/loss on a model pod's ``eth0`` through an ephemeral container, and its removal.

Conventions every room's ``k8s.py`` follows: :mod:`chaoslib_infer.drills`.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import network as k8s_network
from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
from chaoslib_infer.platforms.kubernetes.activity import (
    k8s_context,
    load_state,
    log_fault,
    save_state,
    state_path,
)

__all__ = [
    "k8s_network_jitter",
    "k8s_remove_network_jitter",
]


def k8s_network_jitter(
    delay_ms: float = 100.0,
    jitter_ms: float = 20.0,
    loss_pct: float = 0.0,
    pod: str | None = None,
    image: str = k8s_network.DEFAULT_IMAGE,
    timeout_s: float = 60.0,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Add netem delay/jitter/loss on ``eth0`` of a model pod through an ephemeral container.

    The pod and container name are saved to ``k8s-state/network-jitter.json`` before the PATCH;
    :func:`k8s_remove_network_jitter` runs ``tc qdisc del`` in a second ephemeral container
    (ephemeral containers cannot be removed). Needs ``NET_ADMIN``, refused by Pod Security
    "baseline" or stricter.

    Args:
        delay_ms, jitter_ms, loss_pct: netem parameters (ms, ms, percent).
        pod: target pod (default: the first Ready target pod).
        image: image providing ``tc``. timeout_s: bound on waiting for tc to run, seconds.
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "k8s-network-jitter", "fault_at", "pod", "container", "command", "exit_code"}``.

    Raises:
        ActivityFailed: bad netem values, Pod Security or RBAC refusal (403), pod absent (404),
            tc failed (its stderr) or did not run within ``timeout_s``.
    """
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    if load_state(configuration, "network-jitter") is not None:
        raise ActivityFailed("network jitter is already in place in this run; roll it back first")
    name = f"chaos-netem-{int(time.time() * 1000) % 10**10:010d}"
    try:
        spec = k8s_network.ephemeral_netem_spec(name, delay_ms, jitter_ms, loss_pct, image)
    except ValueError as exc:
        raise ActivityFailed(f"k8s_network_jitter: {exc}") from None
    try:
        chosen = k8s_pods.select_pods(
            k8s_pods.list_pods(ctx.core, t.namespace, t.selector), 1, [pod] if pod else None
        )[0]
        pod_name = chosen["metadata"]["name"]
        save_state(
            configuration,
            "network-jitter",
            {"namespace": t.namespace, "pod": pod_name, "container": name, "image": image},
            t,
        )
        fault_at = time.time()
        log_fault(
            configuration,
            {
                "kind": "k8s-network-jitter",
                "fault_at": fault_at,
                "pod": pod_name,
                "delay_ms": delay_ms,
                "jitter_ms": jitter_ms,
                "loss_pct": loss_pct,
            },
        )
        k8s_network.add_ephemeral(ctx.core, t.namespace, pod_name, spec)
        done = k8s_network.wait_ephemeral(ctx.core, t.namespace, pod_name, name, timeout_s)
    except K8sError as exc:
        if exc.status in (403, 404):  # nothing was injected: no rollback needed
            state_path(configuration, "network-jitter").unlink(missing_ok=True)
        raise ActivityFailed(str(exc)) from None
    if done["exit_code"] != 0:  # tc added no qdisc: nothing to roll back
        state_path(configuration, "network-jitter").unlink(missing_ok=True)
        raise ActivityFailed(
            f"tc in ephemeral container {name} of pod {t.namespace}/{pod_name} "
            f"exited {done['exit_code']}: {done['message'] or done['reason']}"
        )
    return {
        "kind": "k8s-network-jitter",
        "fault_at": fault_at,
        "pod": pod_name,
        "container": name,
        "command": spec["command"],
        "exit_code": done["exit_code"],
    }


def k8s_remove_network_jitter(
    timeout_s: float = 60.0,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> str:
    """Rollback of :func:`k8s_network_jitter`: a second ephemeral container deletes the qdisc.

    Returns:
        One line; ``"no network jitter injected by this run"`` when nothing is recorded.

    Raises:
        ActivityFailed: the PATCH was refused (403), the pod is gone (404: its netns went with it,
            reported), or ``tc qdisc del`` failed for another reason than "no qdisc".
    """
    state = load_state(configuration, "network-jitter")
    if state is None:
        return "no network jitter injected by this run"
    ctx = k8s_context(target_file, configuration)
    ns, pod_name = state["namespace"], state["pod"]
    name = f"{state['container']}-undo"
    spec = k8s_network.ephemeral_netem_spec(
        name, 0, 0, 0, state.get("image", k8s_network.DEFAULT_IMAGE), remove=True
    )
    try:
        k8s_network.add_ephemeral(ctx.core, ns, pod_name, spec)
        done = k8s_network.wait_ephemeral(ctx.core, ns, pod_name, name, timeout_s)
    except K8sError as exc:
        if exc.status == 404:
            state_path(configuration, "network-jitter").unlink()
            return f"pod {ns}/{pod_name} is gone; its network namespace (and qdisc) went with it"
        raise ActivityFailed(str(exc)) from None
    if done["exit_code"] != 0 and "No such file" not in (done["message"] or ""):
        raise ActivityFailed(
            f"tc qdisc del in pod {ns}/{pod_name} exited {done['exit_code']}: "
            f"{done['message'] or done['reason']}"
        )
    state_path(configuration, "network-jitter").unlink()
    log_fault(
        configuration,
        {"kind": "k8s-network-jitter", "phase": "cleared", "at": time.time(), "pod": pod_name},
    )
    return f"netem qdisc removed from pod {ns}/{pod_name} (ephemeral container {name})"
