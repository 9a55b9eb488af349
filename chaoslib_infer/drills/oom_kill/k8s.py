"""Kubernetes actions and rollbacks of the oom-kill drill.

A memory hog inside a model pod's memory cgroup until the kernel OOM-kills the server, and its stop.

Conventions every room's ``k8s.py`` follows: :mod:`chaoslib_infer.drills`.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import oom as k8s_oom
from chaoslib_infer.platforms.kubernetes.activity import (
    k8s_context,
    load_state,
    log_fault,
    one_ready_pod,
    refuse_twice,
    save_state,
    state_path,
)
from chaoslib_infer.safety.signals import held_interrupts

__all__ = [
    "k8s_oom_kill",
    "k8s_stop_memory_hog",
]


_WARMUP_OMITTED = (
    "the target sends traffic to 'url' (a Service, Ingress or gateway), not to one pod, so the "
    "first requests served by the restarted pod cannot be told apart here"
)


def k8s_oom_kill(
    pod: str | None = None,
    hog_mb: int | None = None,
    timeout_s: float = 180.0,
    poll_s: float = 0.5,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """oom-kill: exec a memory hog into the model-server container until the kernel OOM-kills it.

    The hog runs inside the target container (``pods/exec``; ``python3 -c``, else ``sh -c``
    with ``head``/``tail``), so the container's own memory cgroup hits its limit; the model
    server is made the OOM victim (see :mod:`chaoslib_infer.platforms.kubernetes.oom`). The pod
    is then polled until ``lastState.terminated.reason == "OOMKilled"`` with ``restartCount`` + 1
    and the container is Ready again. The pod, container and hog are saved to
    ``k8s-state/oom-kill.json`` before the exec; :func:`k8s_stop_memory_hog` kills a hog still
    running. The hog also ends by itself ``timeout_s`` + 30 s after it started.

    Args:
        pod: target pod (default: the first Ready target pod).
        hog_mb: hog size, MiB (default: the container's memory limit + 10% + 64 MiB).
        timeout_s: bound on OOM + restart + Ready, seconds.
        poll_s: polling interval (the figures' precision), seconds.
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "k8s-oom-kill", "fault_at", "pod", "container", "hog_mb",
        "memory_limit_bytes", "hog": {...}, "restart_count_before", "restart_count_after",
        "reason", "exit_code", "oom_at", "running_at", "ready_at" (unix s, observed),
        "time_to_oom_s", "restart_s" (death -> running), "ready_s" (death -> Ready),
        "api_restart_s" (API finishedAt -> startedAt, 1 s resolution), "warmup_ttft_s": None,
        "warmup_omitted": reason}``.

    Raises:
        ActivityFailed: container without memory limit (refused: the hog would press on the
            node), bad ``hog_mb``, exec refused (403 ``pods/exec``), pod absent (404), no
            interpreter in the image, no OOM kill within ``timeout_s`` (the hog is left to the
            rollback), a restart for another reason, or no Ready container within ``timeout_s``.
    """
    if hog_mb is not None and hog_mb < 1:
        raise ActivityFailed(f"k8s_oom_kill: hog_mb must be >= 1, got {hog_mb}")
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    refuse_twice(configuration, "oom-kill", "k8s_stop_memory_hog")
    try:
        chosen = one_ready_pod(ctx, pod)
        name = chosen["metadata"]["name"]
        limit = k8s_oom.memory_limit_bytes(chosen, t.container)
        if limit is None:
            raise ActivityFailed(
                f"container {t.container} of pod {t.namespace}/{name} has no memory limit: its "
                "cgroup has none of its own, so a hog would press on the whole node; refusing"
            )
        mb = int(hog_mb or k8s_oom.default_hog_mb(limit))
        cs = k8s_oom.container_status(chosen, t.container)
        before = int(cs.get("restartCount") or 0)
        state: dict[str, Any] = {
            "namespace": t.namespace,
            "pod": name,
            "container": t.container,
            "container_id": cs.get("containerID"),
            "hog_mb": mb,
            "hog": None,
        }
        save_state(configuration, "oom-kill", state, t)
        fault_at = time.time()
        line = {
            "kind": "k8s-oom-kill",
            "fault_at": fault_at,
            "pod": name,
            "container": t.container,
            "hog_mb": mb,
            "memory_limit_bytes": limit,
        }
        log_fault(configuration, line)
        with held_interrupts():  # the hog is recorded before a Ctrl-C can reach the rollback
            try:
                hog = k8s_oom.start_hog(
                    ctx.core, t.namespace, name, t.container, mb, timeout_s + 30
                )
            except K8sError:
                state_path(configuration, "oom-kill").unlink(missing_ok=True)  # nothing started
                raise
            state["hog"] = hog
            save_state(configuration, "oom-kill", state)
        fig = k8s_oom.watch_restart(
            ctx.core,
            t.namespace,
            name,
            t.container,
            before,
            cs.get("containerID"),
            fault_at,
            timeout_s,
            poll_s,
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    result = {
        **line,
        "hog": hog,
        "restart_count_before": before,
        **{k: v for k, v in fig.items() if k not in ("died", "polls")},
        "warmup_ttft_s": None,
        "warmup_omitted": _WARMUP_OMITTED,
    }
    log_fault(configuration, {**result, "kind": "k8s-oom-recovery"})
    where = f"container {t.container} of pod {t.namespace}/{name}"
    if not fig["died"]:
        raise ActivityFailed(
            f"{where} was not OOM-killed within {timeout_s:g} s (hog {mb} MiB, memory limit "
            f"{limit / 2**20:.0f} MiB, oom_score {hog['oom_score_mode']}); the hog runs until "
            "the rollback k8s_stop_memory_hog or its own end"
        )
    if fig["reason"] != "OOMKilled":
        raise ActivityFailed(
            f"{where} restarted, but lastState.terminated.reason is {fig['reason']!r} "
            f"(exit {fig['exit_code']}), not 'OOMKilled'"
        )
    if fig["ready_at"] is None:
        raise ActivityFailed(
            f"{where} was OOM-killed but is not Ready again within {timeout_s:g} s "
            f"(restart_count {fig['restart_count_after']}, "
            f"{'running' if fig['running_at'] else 'not running'})"
        )
    return result


def k8s_stop_memory_hog(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> str:
    """Rollback of :func:`k8s_oom_kill`: kill the memory hog if it still runs (idempotent).

    A hog dies with its container: when the container restarted (new container id) or the pod is
    gone, nothing is exec'd.

    Returns:
        One line; ``"no memory hog started by this run"`` when nothing is recorded.

    Raises:
        ActivityFailed: the pod could not be read or the exec was refused (403).
    """
    state = load_state(configuration, "oom-kill")
    if state is None:
        return "no memory hog started by this run"
    if not state.get("hog"):
        state_path(configuration, "oom-kill").unlink(missing_ok=True)
        return "no memory hog started by this run"
    ctx = k8s_context(target_file, configuration)
    try:
        line = k8s_oom.stop_hog(ctx.core, state)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    state_path(configuration, "oom-kill").unlink(missing_ok=True)
    log_fault(
        configuration,
        {"kind": "k8s-oom-kill", "phase": "cleared", "at": time.time(), "pod": state["pod"]},
    )
    return line
