"""node-loss on Kubernetes: cordon the node of a model pod and drain it through the Eviction API.

Drain follows ``kubectl drain``: DaemonSet pods and mirror (static) pods are skipped, finished pods
(``Succeeded``/``Failed``) are ignored, every other pod on the node is evicted with a
``policy/v1`` ``Eviction`` (POST ``pods/{name}/eviction``), so PodDisruptionBudgets are respected.
An eviction refused with 429 (the budget allows no disruption now) is retried every ``retry_s``
until ``deadline_s`` or ``max_attempts``, then *reported* as refused; it is never retried forever.
Rollback: :func:`uncordon` (only when the node was schedulable before the cordon).
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call

__all__ = ["cordon", "drain", "is_unschedulable", "node_of_pod", "uncordon"]

_STRATEGIC = "application/strategic-merge-patch+json"


def node_of_pod(core: Any, namespace: str, pod: str) -> str:
    """The node a pod runs on.

    Raises:
        K8sError: pod absent (404) or not yet scheduled.
    """
    doc = call(f"get pod {namespace}/{pod}", core.read_namespaced_pod, pod, namespace)
    node = (doc.get("spec") or {}).get("nodeName")
    if not node:
        raise K8sError(f"pod {namespace}/{pod} is not scheduled on a node")
    return str(node)


def is_unschedulable(core: Any, node: str) -> bool:
    """Whether ``node`` is cordoned now (``spec.unschedulable``).

    Raises:
        K8sError: node absent (404) or permission denied (403).
    """
    doc = call(f"get node {node}", core.read_node, node)
    return bool((doc.get("spec") or {}).get("unschedulable"))


def cordon(core: Any, node: str) -> None:
    """Mark ``node`` unschedulable (strategic-merge PATCH ``spec.unschedulable: true``).

    Record :func:`is_unschedulable` first: the rollback needs it.

    Raises:
        K8sError: node absent (404) or permission denied (403).
    """
    call(
        f"cordon node {node}",
        core.patch_node,
        node,
        {"spec": {"unschedulable": True}},
        _content_type=_STRATEGIC,
    )


def uncordon(core: Any, node: str, was_unschedulable: bool = False) -> str:
    """Undo :func:`cordon`: PATCH ``spec.unschedulable: null`` unless the node was cordoned before.

    Returns:
        One line saying what was done.

    Raises:
        K8sError: the PATCH failed (403; 404 when the node object is gone).
    """
    if was_unschedulable:
        return f"node {node} was unschedulable before the drill; left cordoned"
    call(
        f"uncordon node {node}",
        core.patch_node,
        node,
        {"spec": {"unschedulable": None}},
        _content_type=_STRATEGIC,
    )
    return f"node {node} uncordoned"


def _skip_reason(pod: dict[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    if (meta.get("annotations") or {}).get("kubernetes.io/config.mirror"):
        return "mirror pod"
    if any(
        o.get("kind") == "DaemonSet" and o.get("controller")
        for o in meta.get("ownerReferences") or []
    ):
        return "DaemonSet"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    return None


def _key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def drain(
    core: Any,
    node: str,
    deadline_s: float = 60.0,
    retry_s: float = 2.0,
    max_attempts: int = 10,
) -> dict[str, Any]:
    """Evict every evictable pod of ``node`` (the node should be cordoned first).

    Args:
        core: ``CoreV1Api``.
        node: node name.
        deadline_s: bound on the whole drain, seconds (evictions and waiting for pods to go).
        retry_s: pause between rounds of retries of refused (429) evictions, seconds.
        max_attempts: most eviction attempts per pod.

    Returns:
        ``{"node", "evicted": [{"namespace", "pod", "uid", "owner_uid", "deleted_at", "attempts"}],
        "refused": [{"namespace", "pod", "attempts", "message"}], "skipped": [{"namespace", "pod",
        "reason"}], "still_terminating": [names], "drain_s"}``.

    Raises:
        K8sError: listing the node's pods or an eviction failed with anything but 429/404
            (e.g. 403: the service account may not create ``pods/eviction``).
    """
    t0 = time.monotonic()
    stop = t0 + deadline_s
    listing = call(
        f"list pods on node {node}",
        core.list_pod_for_all_namespaces,
        field_selector=f"spec.nodeName={node}",
    )
    pending: list[dict[str, Any]] = []
    skipped = []
    for pod in listing.get("items") or []:
        reason = _skip_reason(pod)
        meta = pod["metadata"]
        if reason:
            skipped.append(
                {"namespace": meta.get("namespace"), "pod": meta["name"], "reason": reason}
            )
        else:
            pending.append(pod)
    attempts: dict[str, int] = {}
    messages: dict[str, str] = {}
    evicted = []
    refused_pods: list[dict[str, Any]] = []
    while pending:
        still = []
        for pod in pending:
            meta = pod["metadata"]
            ns, name = meta["namespace"], meta["name"]
            key = f"{ns}/{name}"
            attempts[key] = attempts.get(key, 0) + 1
            at = time.time()
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": ns},
            }
            try:
                call(f"evict pod {key}", core.create_namespaced_pod_eviction, name, ns, body)
            except K8sError as exc:
                if exc.status == 429:
                    messages[key] = str(exc)
                    still.append(pod)
                    continue
                if exc.status != 404:  # 404: already gone, nothing to evict
                    raise
            evicted.append(
                {
                    "namespace": ns,
                    "pod": name,
                    "uid": meta.get("uid"),
                    "owner_uid": next(
                        (
                            o.get("uid")
                            for o in meta.get("ownerReferences") or []
                            if o.get("controller")
                        ),
                        None,
                    ),
                    "deleted_at": at,
                    "attempts": attempts[key],
                }
            )
        exhausted = [p for p in still if attempts[_key(p)] >= max_attempts]
        retryable = [p for p in still if attempts[_key(p)] < max_attempts]
        refused_pods += exhausted
        if retryable and time.monotonic() + retry_s > stop:
            refused_pods += retryable
            retryable = []
        pending = retryable
        if pending:
            time.sleep(retry_s)
    refused = [
        {
            "namespace": p["metadata"]["namespace"],
            "pod": p["metadata"]["name"],
            "attempts": attempts[_key(p)],
            "message": messages.get(_key(p), ""),
        }
        for p in refused_pods
    ]
    # wait for the evicted pods to be gone (or replaced: same name, other uid)
    terminating = {(e["namespace"], e["pod"]): e["uid"] for e in evicted}
    while terminating and time.monotonic() < stop:
        for (ns, name), uid in list(terminating.items()):
            try:
                doc = call(f"get pod {ns}/{name}", core.read_namespaced_pod, name, ns)
            except K8sError as exc:
                if exc.status != 404:
                    raise
                doc = None
            if doc is None or doc["metadata"].get("uid") != uid:
                del terminating[(ns, name)]
        if terminating:
            time.sleep(min(0.25, max(0.0, stop - time.monotonic())))
    return {
        "node": node,
        "evicted": evicted,
        "refused": refused,
        "skipped": skipped,
        "still_terminating": [f"{ns}/{n}" for ns, n in terminating],
        "drain_s": round(time.monotonic() - t0, 3),
    }
