"""node-loss on Kubernetes: cordon the node of a model pod and drain it through the Eviction API.

Drain follows ``kubectl drain``: DaemonSet pods and mirror (static) pods are skipped, finished pods
(``Succeeded``/``Failed``) are ignored, every other pod on the node is evicted with a
``policy/v1`` ``Eviction`` (POST ``pods/{name}/eviction``), so PodDisruptionBudgets are respected.
An eviction refused with 429 (the budget allows no disruption now) is retried every ``retry_s``
until ``deadline_s`` or ``max_attempts``, then *reported* as refused; it is never retried forever.
Rollback: :func:`uncordon` (only when the node was schedulable before the cordon).

Two more variants (issue 4): :func:`taint` adds a ``NoExecute`` taint (the taint manager evicts
every pod that does not tolerate it, PodDisruptionBudgets are *not* consulted, as on a real node
failure), undone by :func:`untaint`; :func:`delete_node` deletes the Node object (the VM and its
kubelet are not touched; the pod garbage collector deletes the pods bound to a missing node after
its quarantine, about 40 s, and their controllers recreate them elsewhere), undone by
:func:`recreate_node` from the stored object. A running kubelet does not re-register a deleted
Node by itself (kubernetes/kubernetes#71398; it does when it restarts), so the restore matters;
once the object is back, the kubelet's status updates reach it again.
"""

from __future__ import annotations

import json
import time
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call, call_bytes, request_json

__all__ = [
    "cordon",
    "delete_node",
    "drain",
    "is_unschedulable",
    "node_of_pod",
    "recreate_node",
    "snapshot_node",
    "taint",
    "uncordon",
    "untaint",
]

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
    _patch_unschedulable(core, node, True, "cordon")


def _patch_unschedulable(core: Any, node: str, value: bool | None, verb: str) -> None:
    """Strategic-merge PATCH ``spec.unschedulable: value`` (None: remove the field)."""
    call(
        f"{verb} node {node}",
        core.patch_node,
        node,
        {"spec": {"unschedulable": value}},
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
    _patch_unschedulable(core, node, None, "uncordon")
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


def bystanders(core: Any, node: str, allowed: Any) -> list[str]:
    """The pods on ``node`` a node-level fault would hit outside the allowed namespaces.

    DaemonSet pods (one per node by design; a node fault is theirs to survive), mirror pods and
    finished pods are left out.

    Args:
        core: ``CoreV1Api``. node: node name.
        allowed: ``callable(namespace) -> bool``: the namespaces the drill may touch.

    Returns:
        ``["namespace/pod", ...]`` sorted (empty: the node holds only allowed pods).

    Raises:
        K8sError: listing the node's pods failed (e.g. 403).
    """
    listing = call(
        f"list pods on node {node}",
        core.list_pod_for_all_namespaces,
        field_selector=f"spec.nodeName={node}",
    )
    out = []
    for pod in listing.get("items") or []:
        if _skip_reason(pod) is None and not allowed(pod["metadata"]["namespace"]):
            out.append(_key(pod))
    return sorted(out)


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


_MERGE = "application/merge-patch+json"
#: ``metadata`` fields the API server sets; stripped before a Node is created again.
SERVER_SET = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
)


def taint(
    core: Any, node: str, key: str, effect: str = "NoExecute", value: str = "true"
) -> dict[str, Any]:
    """Add taint ``key=value:effect`` to ``node`` (JSON merge patch of the whole ``spec.taints``).

    The patch carries the node's ``resourceVersion``, so a concurrent change of the node makes it
    fail with 409 rather than drop someone else's taint.

    Returns:
        ``{"node", "taint": {...}, "taints_before": [...] | None}`` (None: the node had no
        ``spec.taints``).

    Raises:
        K8sError: 404 node absent, 403, 409 changed meanwhile; a taint with the same key and
            effect is already there (the rollback could not tell it from ours).
    """
    if effect not in ("NoExecute", "NoSchedule", "PreferNoSchedule"):
        raise K8sError(
            f"taint effect must be NoExecute, NoSchedule or PreferNoSchedule, got {effect!r}"
        )
    doc = call(f"get node {node}", core.read_node, node)
    spec = doc.get("spec") or {}
    before = spec.get("taints")
    if any(t.get("key") == key and t.get("effect") == effect for t in before or []):
        raise K8sError(f"node {node} already has a taint {key}:{effect}; refusing to add it twice")
    new = {"key": key, "value": value, "effect": effect}
    call(
        f"taint node {node}",
        core.patch_node,
        node,
        {
            "metadata": {"resourceVersion": doc["metadata"]["resourceVersion"]},
            "spec": {"taints": [*(before or []), new]},
        },
        _content_type=_MERGE,
    )
    return {"node": node, "taint": new, "taints_before": before}


def untaint(core: Any, node: str, key: str, effect: str) -> str:
    """Remove the taints ``key:effect`` from ``node``, leaving any other taint as it is now.

    Returns:
        One line saying what was done.

    Raises:
        K8sError: 403; 404 node absent; 409 changed meanwhile.
    """
    doc = call(f"get node {node}", core.read_node, node)
    taints = (doc.get("spec") or {}).get("taints") or []
    keep = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
    if len(keep) == len(taints):
        return f"node {node} has no taint {key}:{effect}"
    call(
        f"untaint node {node}",
        core.patch_node,
        node,
        {
            "metadata": {"resourceVersion": doc["metadata"]["resourceVersion"]},
            "spec": {"taints": keep or None},
        },
        _content_type=_MERGE,
    )
    return f"taint {key}:{effect} removed from node {node}"


def snapshot_node(core: Any, node: str) -> str:
    """The Node object exactly as the API server sends it (JSON text), for :func:`recreate_node`.

    Raises:
        K8sError: 404 node absent, 403.
    """
    return call_bytes(f"get node {node}", core.read_node, node).decode("utf-8")


def delete_node(core: Any, node: str) -> None:
    """DELETE the Node object (the machine is not touched).

    Raises:
        K8sError: 404 node absent, 403.
    """
    call(f"delete node {node}", core.delete_node, node)


def recreate_node(core: Any, raw: str) -> str:
    """Create the Node again from its stored object, minus :data:`SERVER_SET` metadata fields.

    The body is sent as-is (``spec``, labels, annotations and ``status``, which a Node accepts on
    create, so the scheduler sees its capacity before the kubelet's next status update).

    Returns:
        One line; a Node of that name that exists again (its kubelet restarted and re-registered
        it) is left as it is.

    Raises:
        K8sError: 403, or another API error.
    """
    body = json.loads(raw)
    meta = body.setdefault("metadata", {})
    for key in SERVER_SET:
        meta.pop(key, None)
    name = meta.get("name")
    try:
        request_json(core.api_client, f"create node {name}", "POST", "/api/v1/nodes", body)
    except K8sError as exc:
        if exc.status == 409:
            return f"node {name} exists again (re-registered meanwhile); left as it is"
        raise
    return f"node {name} recreated"
