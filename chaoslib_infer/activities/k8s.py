"""Chaos Toolkit actions running the drills against a Kubernetes cluster (official client).

The cluster is named by a target file (see :mod:`chaoslib_infer.platforms.kubernetes.target`):
the ``target_file`` argument, else the ``infer_k8s_target`` configuration key, else the
``CHAOS_INFER_K8S_TARGET`` environment variable. The target's allowlist is enforced before any API
call. Each action appends a line to the drill's fault log (``faults.jsonl``, see
:mod:`chaoslib_infer.settings`), and a fault that stays in place is saved *before* injection to
``<infer_run_dir>/k8s-state/<kind>.json``, which its rollback reads (and removes once undone, so
rollbacks are idempotent). Expected failures raise one ``ActivityFailed`` line: missing permission
(403), absent object (404), refused eviction (429), allowlist refusal.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.platforms.kubernetes import K8sError, clients
from chaoslib_infer.platforms.kubernetes import network as k8s_network
from chaoslib_infer.platforms.kubernetes import nodes as k8s_nodes
from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
from chaoslib_infer.platforms.kubernetes import quota as k8s_quota
from chaoslib_infer.platforms.kubernetes.target import K8sTarget, load_target

__all__ = [
    "k8s_cut_quota",
    "k8s_drain_model_node",
    "k8s_network_jitter",
    "k8s_remove_network_jitter",
    "k8s_restore_quota",
    "k8s_simultaneous_restarts",
    "k8s_uncordon_node",
]

ENV_TARGET = "CHAOS_INFER_K8S_TARGET"


class _Ctx:
    def __init__(self, target: K8sTarget) -> None:
        from kubernetes import client

        self.target = target
        api = clients(target.kubeconfig, target.context)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)


def _ctx(target_file: str | None, configuration: dict[str, Any] | None) -> _Ctx:
    path = (
        target_file or (configuration or {}).get("infer_k8s_target") or os.environ.get(ENV_TARGET)
    )
    if not path:
        raise ActivityFailed(
            f"no Kubernetes target: pass target_file, set infer_k8s_target or ${ENV_TARGET}"
        )
    try:
        return _Ctx(load_target(str(path)))
    except InferChaosError as exc:
        raise ActivityFailed(str(exc)) from None


def _state_path(configuration: dict[str, Any] | None, kind: str) -> Path:
    folder = settings.run_dir(configuration) / "k8s-state"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}.json"


def _save_state(configuration: dict[str, Any] | None, kind: str, state: dict[str, Any]) -> None:
    path = _state_path(configuration, kind)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, path)


def _load_state(configuration: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    path = _state_path(configuration, kind)
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _log_fault(configuration: dict[str, Any] | None, entry: dict[str, Any]) -> None:
    with settings.faults_path(configuration).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    try:
        before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
        chosen = k8s_pods.select_pods(before, count, pods)
        known = {str(p["metadata"].get("uid")) for p in before}
        fault_at = time.time()
        _log_fault(
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
    _log_fault(configuration, {"kind": "k8s-recovery", "fault_at": fault_at, **recovery})
    if recovery["unrecovered"]:
        raise ActivityFailed(
            f"{len(recovery['unrecovered'])} deleted pod(s) without a Ready replacement after "
            f"{recovery_timeout_s:g} s: {', '.join(recovery['unrecovered'])}"
        )
    return result


def k8s_cut_quota(
    gpus: int | None = None,
    replicas: int | None = None,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lower the target's ResourceQuota ``requests.nvidia.com/gpu`` and/or its Deployment's replicas.

    Both objects (target ``quota:`` and ``deployment:``) are read and saved raw to
    ``k8s-state/quota-cut.json`` *before* the cut; :func:`k8s_restore_quota` puts them back.

    Args:
        gpus: new GPU hard limit (None: quota untouched).
        replicas: new replica count (None: Deployment untouched).
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "k8s-quota-cut", "fault_at", "quota": {"name", "before", "after"} | None,
        "deployment": {"name", "before", "after"} | None}``.

    Raises:
        ActivityFailed: nothing to cut, a cut already in place (restore it first), an object absent
            (404) or not writable (403).
    """
    if gpus is None and replicas is None:
        raise ActivityFailed("k8s_cut_quota: give gpus, replicas, or both")
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    if _load_state(configuration, "quota-cut") is not None:
        raise ActivityFailed(
            "a quota cut is already in place in this run; roll it back first (k8s_restore_quota)"
        )
    try:
        saved = k8s_quota.snapshot(
            ctx.core,
            ctx.apps,
            t.namespace,
            t.quota if gpus is not None else None,
            t.deployment if replicas is not None else None,
        )
        _save_state(configuration, "quota-cut", saved)
        fault_at = time.time()
        done = k8s_quota.cut(ctx.core, ctx.apps, saved, gpus, replicas)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    entry = {"kind": "k8s-quota-cut", "fault_at": fault_at, "namespace": t.namespace, **done}
    _log_fault(configuration, entry)
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
    saved = _load_state(configuration, "quota-cut")
    if saved is None:
        return []
    ctx = _ctx(target_file, configuration)
    try:
        done = k8s_quota.restore(ctx.core, ctx.apps, saved)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _state_path(configuration, "quota-cut").unlink()
    _log_fault(configuration, {"kind": "k8s-quota-cut", "phase": "cleared", "at": time.time()})
    return done


def k8s_drain_model_node(
    pod: str | None = None,
    deadline_s: float = 60.0,
    retry_s: float = 2.0,
    max_attempts: int = 10,
    recovery_timeout_s: float = 120.0,
    poll_s: float = 0.25,
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

    Returns:
        ``{"kind": "k8s-node-loss", "fault_at", "node", "drain": {...}, "recovery": {...}}``.

    Raises:
        ActivityFailed: evictions refused by a PodDisruptionBudget (names the pods and budget),
            missing permission (403), absent pod/node (404). The node stays cordoned until the
            rollback runs.
    """
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    try:
        before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
        chosen = k8s_pods.select_pods(before, 1, [pod] if pod else None)[0]
        node = k8s_nodes.node_of_pod(ctx.core, t.namespace, chosen["metadata"]["name"])
        was = k8s_nodes.is_unschedulable(ctx.core, node)
        _save_state(configuration, "node-loss", {"node": node, "was_unschedulable": was})
        fault_at = time.time()
        _log_fault(
            configuration,
            {
                "kind": "k8s-node-loss",
                "fault_at": fault_at,
                "node": node,
                "pod": chosen["metadata"]["name"],
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
            else {
                "pods": [],
                "recovered": 0,
                "unrecovered": [],
                "max_total_recovery_s": None,
                "polls": 0,
            }
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
    _log_fault(
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
    state = _load_state(configuration, "node-loss")
    if state is None:
        return "no node cordoned by this run"
    ctx = _ctx(target_file, configuration)
    try:
        line = k8s_nodes.uncordon(ctx.core, state["node"], bool(state.get("was_unschedulable")))
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _state_path(configuration, "node-loss").unlink()
    _log_fault(
        configuration,
        {"kind": "k8s-node-loss", "phase": "cleared", "at": time.time(), "node": state["node"]},
    )
    return line


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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    if _load_state(configuration, "network-jitter") is not None:
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
        _save_state(
            configuration,
            "network-jitter",
            {"namespace": t.namespace, "pod": pod_name, "container": name, "image": image},
        )
        fault_at = time.time()
        _log_fault(
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
            _state_path(configuration, "network-jitter").unlink(missing_ok=True)
        raise ActivityFailed(str(exc)) from None
    if done["exit_code"] != 0:  # tc added no qdisc: nothing to roll back
        _state_path(configuration, "network-jitter").unlink(missing_ok=True)
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
    state = _load_state(configuration, "network-jitter")
    if state is None:
        return "no network jitter injected by this run"
    ctx = _ctx(target_file, configuration)
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
            _state_path(configuration, "network-jitter").unlink()
            return f"pod {ns}/{pod_name} is gone; its network namespace (and qdisc) went with it"
        raise ActivityFailed(str(exc)) from None
    if done["exit_code"] != 0 and "No such file" not in (done["message"] or ""):
        raise ActivityFailed(
            f"tc qdisc del in pod {ns}/{pod_name} exited {done['exit_code']}: "
            f"{done['message'] or done['reason']}"
        )
    _state_path(configuration, "network-jitter").unlink()
    _log_fault(
        configuration,
        {"kind": "k8s-network-jitter", "phase": "cleared", "at": time.time(), "pod": pod_name},
    )
    return f"netem qdisc removed from pod {ns}/{pod_name} (ephemeral container {name})"
