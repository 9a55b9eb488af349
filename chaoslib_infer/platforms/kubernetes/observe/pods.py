"""The target's pods: the LIST and the per-pod state a sample records."""

from __future__ import annotations

from typing import Any

from chaoslib_infer.platforms.kubernetes import call
from chaoslib_infer.platforms.kubernetes.observe.common import (
    SAMPLE_TIMEOUT_S,
)
from chaoslib_infer.platforms.kubernetes.pods import is_ready
from chaoslib_infer.platforms.kubernetes.target import K8sTarget


def container_status(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    """The ``containerStatuses`` entry of ``container`` (the first one when none has that name)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == container:
            return dict(cs)
    return dict(statuses[0]) if statuses else None


def pod_state(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """What the sampler keeps of one pod.

    Returns:
        ``{"uid", "phase", "ready" (bool), "restarts" (restartCount of ``container``),
        "last_reason" (lastState.terminated.reason: OOMKilled, Error... or None), "reason" (the
        current waiting/terminated reason: CrashLoopBackOff, OOMKilled... or None), "node"}``.
    """
    cs = container_status(pod, container) or {}
    state = cs.get("state") or {}
    current = state.get("waiting") or state.get("terminated") or {}
    return {
        "uid": pod["metadata"].get("uid"),
        "phase": (pod.get("status") or {}).get("phase"),
        "ready": is_ready(pod),
        "restarts": int(cs.get("restartCount") or 0),
        "last_reason": ((cs.get("lastState") or {}).get("terminated") or {}).get("reason"),
        "reason": current.get("reason"),
        "node": (pod.get("spec") or {}).get("nodeName"),
    }


def list_target_pods(core: Any, target: K8sTarget) -> list[dict[str, Any]]:
    """The target pods (raw dicts, sorted by name), with the observation timeout.

    Raises:
        K8sError: the LIST failed.
    """
    doc = call(
        f"list pods -l {target.selector} in namespace {target.namespace}",
        core.list_namespaced_pod,
        target.namespace,
        label_selector=target.selector,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    return sorted((doc or {}).get("items") or [], key=lambda p: p["metadata"]["name"])
