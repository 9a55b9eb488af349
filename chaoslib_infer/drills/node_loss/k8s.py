"""Kubernetes actions and rollbacks of the node-loss drill.

Lose a model pod's node three ways (drain through the Eviction API, a NoExecute taint, the Node
object deleted) and undo each.

Conventions every room's ``k8s.py`` follows: :mod:`chaoslib_infer.drills`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import nodes as k8s_nodes
from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
from chaoslib_infer.platforms.kubernetes.activity import (
    K8sContext,
    k8s_context,
    log_fault,
    refuse_bystanders,
    refuse_twice,
    save_state,
    state_path,
    undo_saved,
)

__all__ = [
    "k8s_delete_model_node",
    "k8s_drain_model_node",
    "k8s_remove_node_taint",
    "k8s_restore_node",
    "k8s_taint_model_node",
    "k8s_uncordon_node",
]


def k8s_drain_model_node(
    pod: str | None = None,
    deadline_s: float = 60.0,
    retry_s: float = 2.0,
    max_attempts: int = 10,
    recovery_timeout_s: float = 120.0,
    poll_s: float = 0.25,
    allow_bystanders: bool = False,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """node-loss: cordon the node of a model pod and drain it through the Eviction API.

    The node's schedulability is saved to ``k8s-state/node-loss.json`` before the cordon;
    :func:`k8s_uncordon_node` undoes it. DaemonSet and mirror pods are skipped; a 429 (PDB) is
    retried every ``retry_s`` up to ``max_attempts`` / ``deadline_s``, then reported. The target
    pods evicted are then timed until their replacements are Ready (krkn-style figures).

    Args:
        pod: the model pod whose node to drain (default: the first Ready target pod).
        deadline_s: bound on the drain, seconds. retry_s: pause between 429 retries, seconds.
        max_attempts: most eviction attempts per pod.
        recovery_timeout_s, poll_s: the recovery probe's bound and interval, seconds.
        target_file: the target YAML. configuration: Chaos Toolkit configuration.
        allow_bystanders: the operator accepts pods of other namespaces on the node (default:
            refused before any change when the node runs one; DaemonSet pods excepted).

    Returns:
        ``{"kind": "k8s-node-loss", "fault_at", "node", "drain": {...}, "recovery": {...}}``.

    Raises:
        ActivityFailed: evictions refused by a PodDisruptionBudget (names the pods and budget),
            missing permission (403), absent pod/node (404). The node stays cordoned until the
            rollback runs.
    """
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    try:
        before, chosen, node = _model_node(ctx, pod, allow_bystanders, configuration)
        was = k8s_nodes.is_unschedulable(ctx.core, node)
        save_state(configuration, "node-loss", {"node": node, "was_unschedulable": was}, t)
        fault_at = time.time()
        log_fault(
            configuration,
            {
                "kind": "k8s-node-loss",
                "fault_at": fault_at,
                "node": node,
                "pod": chosen,
            },
        )
        k8s_nodes.cordon(ctx.core, node)
        drained = k8s_nodes.drain(ctx.core, node, deadline_s, retry_s, max_attempts)
        mine = [
            e
            for e in drained["evicted"]
            if e["namespace"] == t.namespace
            and e["uid"] in {str(p["metadata"].get("uid")) for p in before}
        ]
        recovery = (
            k8s_pods.recovery_timings(
                ctx.core,
                t.namespace,
                t.selector,
                mine,
                {str(p["metadata"].get("uid")) for p in before},
                recovery_timeout_s,
                poll_s,
            )
            if mine
            else _no_recovery()
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    result = {
        "kind": "k8s-node-loss",
        "fault_at": fault_at,
        "node": node,
        "drain": drained,
        "recovery": recovery,
    }
    log_fault(
        configuration,
        {"kind": "k8s-recovery", "fault_at": fault_at, "node": node, "drain": drained, **recovery},
    )
    if drained["refused"]:
        first = drained["refused"][0]
        raise ActivityFailed(
            f"drain of node {node} incomplete: {len(drained['refused'])} pod(s) refused eviction after "
            f"{first['attempts']} attempt(s): {first['namespace']}/{first['pod']}: {first['message']}"
        )
    return result


def k8s_uncordon_node(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> str:
    """Rollback of :func:`k8s_drain_model_node`: make the node schedulable again (if it was).

    Returns:
        One line; ``"no node cordoned by this run"`` when nothing is recorded (idempotent).

    Raises:
        ActivityFailed: the PATCH was refused (403) or the node is gone (404).
    """
    return undo_saved(
        configuration,
        target_file,
        "node-loss",
        "no node cordoned by this run",
        lambda ctx, st: k8s_nodes.uncordon(ctx.core, st["node"], bool(st.get("was_unschedulable"))),
        log_keys=("node",),
    )


def _model_node(
    ctx: K8sContext, pod: str | None, allow_bystanders: bool, configuration: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], str, str]:
    """The target pods now, the chosen model pod's name (``pod``, default the first Ready target
    pod) and its node, once :func:`~chaoslib_infer.platforms.kubernetes.activity.refuse_bystanders` has
    accepted the node.

    Raises:
        K8sError: an API call failed (403, 404) or no such pod. ActivityFailed: bystanders.
    """
    t = ctx.target
    before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
    chosen = k8s_pods.select_pods(before, 1, [pod] if pod else None)[0]["metadata"]["name"]
    node = k8s_nodes.node_of_pod(ctx.core, t.namespace, chosen)
    refuse_bystanders(ctx, node, allow_bystanders, configuration)
    return before, chosen, node


def _strike_node(
    ctx: K8sContext,
    configuration: dict[str, Any] | None,
    kind: str,
    pod: str | None,
    allow_bystanders: bool,
    state: Callable[[str], dict[str, Any]],
    strike: Callable[[str], Any],
    logged: tuple[str, ...] | None = None,
) -> tuple[list[dict[str, Any]], str, float, Any]:
    """Strike the node of a model pod (:func:`_model_node`) the way ``kind`` says.

    Saves ``{"node", **state(node)}`` as ``k8s-state/<kind>.json``, logs a ``k8s-<kind>`` fault
    line (``fault_at``, ``node`` and the ``logged`` keys of the state, default all of them), then
    runs ``strike(node)``; when that fails, the saved state goes again (nothing to undo).

    Returns:
        ``(target pods before, node, fault_at (epoch s), what strike returned)``.

    Raises:
        K8sError: an API call failed. ActivityFailed: bystanders on the node.
    """
    before, _, node = _model_node(ctx, pod, allow_bystanders, configuration)
    extra = state(node)
    save_state(configuration, kind, {"node": node, **extra}, ctx.target)
    fault_at = time.time()
    shown = extra if logged is None else {k: extra[k] for k in logged}
    log_fault(configuration, {"kind": f"k8s-{kind}", "fault_at": fault_at, "node": node, **shown})
    try:
        done = strike(node)
    except K8sError:
        state_path(configuration, kind).unlink(missing_ok=True)  # not struck
        raise
    return before, node, fault_at, done


def _no_recovery() -> dict[str, Any]:
    """The recovery figures of a fault that evicted no target pod (the shape of
    :func:`~chaoslib_infer.platforms.kubernetes.pods.recovery_timings`)."""
    return {"pods": [], "recovered": 0, "unrecovered": [], "max_total_recovery_s": None, "polls": 0}


def _log_recovery(
    configuration: dict[str, Any] | None,
    fault_at: float,
    node: str,
    recovery: dict[str, Any],
    what: str,
    after: str,
) -> None:
    """Log ``recovery`` (a ``k8s-recovery`` line) and fail when a target pod has no Ready
    replacement.

    Raises:
        ActivityFailed: ``N target pod(s) of <what> without a Ready replacement after <after>:
            <pods>``.
    """
    log_fault(
        configuration, {"kind": "k8s-recovery", "fault_at": fault_at, "node": node, **recovery}
    )
    if recovery["unrecovered"]:
        raise ActivityFailed(
            f"{len(recovery['unrecovered'])} target pod(s) of {what} without a Ready "
            f"replacement after {after}: {', '.join(recovery['unrecovered'])}"
        )


def _node_pods_recovery(
    ctx: K8sContext,
    before: list[dict[str, Any]],
    node: str,
    fault_at: float,
    timeout_s: float,
    poll_s: float,
) -> dict[str, Any]:
    """krkn-style timings of the target pods that were on ``node``, from ``fault_at``."""
    t = ctx.target
    gone = [
        {
            "pod": p["metadata"]["name"],
            "uid": p["metadata"].get("uid"),
            "node": node,
            "owner_uid": k8s_pods.owner_uid(p),
            "deleted_at": fault_at,
        }
        for p in before
        if (p.get("spec") or {}).get("nodeName") == node
    ]
    if not gone:
        return _no_recovery()
    known = {str(p["metadata"].get("uid")) for p in before}
    return k8s_pods.recovery_timings(
        ctx.core, t.namespace, t.selector, gone, known, timeout_s, poll_s
    )


def k8s_taint_model_node(
    effect: str = "NoExecute",
    key: str = "chaos-infer.io/node-loss",
    pod: str | None = None,
    recovery_timeout_s: float = 120.0,
    poll_s: float = 0.25,
    allow_bystanders: bool = False,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """node-loss, taint variant: taint the node of a model pod ``key=true:effect``.

    With ``NoExecute`` the taint manager evicts every pod of the node that does not tolerate the
    taint, at once and without asking PodDisruptionBudgets (as a node failure would; DaemonSet
    pods go too unless they tolerate ``key``). The node, key and effect are saved to
    ``k8s-state/node-taint.json`` before the PATCH; :func:`k8s_remove_node_taint` removes the
    taint. The target pods that were on the node are timed until their replacements are Ready
    (krkn-style, from the taint).

    Args:
        effect: ``NoExecute``, ``NoSchedule`` or ``PreferNoSchedule``.
        key: taint key. pod: the model pod whose node to taint (default: first Ready pod).
        recovery_timeout_s, poll_s, allow_bystanders, target_file, configuration: as
            :func:`k8s_drain_model_node`.

    Returns:
        ``{"kind": "k8s-node-taint", "fault_at", "node", "taint", "taints_before", "recovery"}``
        (``recovery`` as :func:`~chaoslib_infer.platforms.kubernetes.pods.recovery_timings`;
        empty for the other effects, which evict nothing).

    Raises:
        ActivityFailed: bad effect, 403/404/409, a taint with that key and effect already on the
            node, or evicted pods without a Ready replacement within ``recovery_timeout_s``.
    """
    if effect not in ("NoExecute", "NoSchedule", "PreferNoSchedule"):
        raise ActivityFailed(
            f"k8s_taint_model_node: effect must be NoExecute, NoSchedule or PreferNoSchedule, got {effect!r}"
        )
    ctx = k8s_context(target_file, configuration)
    refuse_twice(configuration, "node-taint", "k8s_remove_node_taint")
    try:
        before, node, fault_at, done = _strike_node(
            ctx,
            configuration,
            "node-taint",
            pod,
            allow_bystanders,
            lambda node: {"key": key, "effect": effect},
            lambda node: k8s_nodes.taint(ctx.core, node, key, effect),
        )
        recovery = (
            _node_pods_recovery(ctx, before, node, fault_at, recovery_timeout_s, poll_s)
            if effect == "NoExecute"
            else _no_recovery()
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _log_recovery(
        configuration,
        fault_at,
        node,
        recovery,
        f"tainted node {node}",
        f"{recovery_timeout_s:g} s (a pod that tolerates {key}:{effect} stays)",
    )
    return {"kind": "k8s-node-taint", "fault_at": fault_at, **done, "recovery": recovery}


def k8s_remove_node_taint(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> str:
    """Rollback of :func:`k8s_taint_model_node`: remove that taint, leave any other (idempotent).

    Returns:
        One line; ``"no node tainted by this run"`` when nothing is recorded.

    Raises:
        ActivityFailed: 403, or 409 (the node changed during the PATCH).
    """
    return undo_saved(
        configuration,
        target_file,
        "node-taint",
        "no node tainted by this run",
        lambda ctx, st: k8s_nodes.untaint(ctx.core, st["node"], st["key"], st["effect"]),
        log_keys=("node",),
        when_gone=lambda st: f"node {st['node']} is gone; its taint went with it",
    )


def k8s_delete_model_node(
    pod: str | None = None,
    recovery_timeout_s: float = 180.0,
    poll_s: float = 0.25,
    allow_bystanders: bool = False,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """node-loss, delete variant: delete the Node object of a model pod's node.

    The machine and its kubelet are not touched. The Node is stored exactly (raw JSON) to
    ``k8s-state/node-delete.json`` before the DELETE; :func:`k8s_restore_node` creates it again.
    The pod garbage collector deletes the pods bound to a missing node (after its quarantine,
    about 40 s in a real cluster) and their controllers recreate them elsewhere; the target pods
    that were on the node are timed from the deletion.

    Args:
        pod: the model pod whose node to delete (default: the first Ready target pod).
        recovery_timeout_s, poll_s, allow_bystanders, target_file, configuration: as
            :func:`k8s_drain_model_node`.

    Returns:
        ``{"kind": "k8s-node-delete", "fault_at", "node", "recovery"}``.

    Raises:
        ActivityFailed: 403 (nodes delete), 404, or target pods without a Ready replacement
            within ``recovery_timeout_s``.
    """
    ctx = k8s_context(target_file, configuration)
    refuse_twice(configuration, "node-delete", "k8s_restore_node")
    try:
        before, node, fault_at, _ = _strike_node(
            ctx,
            configuration,
            "node-delete",
            pod,
            allow_bystanders,
            lambda node: {"raw": k8s_nodes.snapshot_node(ctx.core, node)},
            lambda node: k8s_nodes.delete_node(ctx.core, node),
            logged=(),
        )
        recovery = _node_pods_recovery(ctx, before, node, fault_at, recovery_timeout_s, poll_s)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _log_recovery(
        configuration, fault_at, node, recovery, f"deleted node {node}", f"{recovery_timeout_s:g} s"
    )
    return {"kind": "k8s-node-delete", "fault_at": fault_at, "node": node, "recovery": recovery}


def k8s_restore_node(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> str:
    """Rollback of :func:`k8s_delete_model_node`: create the Node again from the stored object.

    Server-set metadata (uid, resourceVersion, creationTimestamp, managedFields, ...) is dropped;
    labels, annotations, spec (taints, podCIDR, providerID, unschedulable) and status are sent as
    stored. A Node of that name that exists again (its kubelet re-registered it) is left alone.

    Returns:
        One line; ``"no node deleted by this run"`` when nothing is recorded (idempotent).

    Raises:
        ActivityFailed: 403 (nodes create) or another API error.
    """
    return undo_saved(
        configuration,
        target_file,
        "node-delete",
        "no node deleted by this run",
        lambda ctx, st: k8s_nodes.recreate_node(ctx.core, st["raw"]),
        log_keys=("node",),
    )
