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

import fnmatch
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.platforms.kubernetes import K8sError, clients
from chaoslib_infer.platforms.kubernetes import freeze as k8s_freeze
from chaoslib_infer.platforms.kubernetes import network as k8s_network
from chaoslib_infer.platforms.kubernetes import nodes as k8s_nodes
from chaoslib_infer.platforms.kubernetes import oom as k8s_oom
from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
from chaoslib_infer.platforms.kubernetes import policy as k8s_policy
from chaoslib_infer.platforms.kubernetes import quota as k8s_quota
from chaoslib_infer.platforms.kubernetes.target import K8sTarget, load_target
from chaoslib_infer.safety.redact import private_dir
from chaoslib_infer.safety.signals import held_interrupts

__all__ = [
    "k8s_cut_quota",
    "k8s_drain_model_node",
    "k8s_network_jitter",
    "k8s_remove_network_jitter",
    "k8s_restore_quota",
    "k8s_simultaneous_restarts",
    "k8s_uncordon_node",
    # issue 4: the missing fault actions (oom-kill, upstream-timeout, node-loss variants)
    "k8s_block_pod_ingress",
    "k8s_delete_model_node",
    "k8s_freeze_model_server",
    "k8s_oom_kill",
    "k8s_remove_node_taint",
    "k8s_restore_node",
    "k8s_restore_pod_ingress",
    "k8s_stop_memory_hog",
    "k8s_taint_model_node",
    "k8s_thaw_model_server",
]

ENV_TARGET = "CHAOS_INFER_K8S_TARGET"

_T = TypeVar("_T")


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
        return _Ctx(load_target(str(path), configuration=configuration))
    except InferChaosError as exc:
        raise ActivityFailed(str(exc)) from None


def _refuse_bystanders(ctx: Any, node: str, allow_bystanders: bool, configuration: Any) -> None:
    """Refuse a node-level fault on a node shared with pods outside the allowed namespaces.

    Allowed: the target file's ``allow.namespaces`` and the operator's (both must match).
    ``allow_bystanders=True`` is the operator's explicit opt-in. Runs before any change.

    Raises:
        ActivityFailed: one line naming the node and the first bystanders.
    """
    if allow_bystanders:
        return
    from chaoslib_infer.safety.allowlist import operator_k8s_allow

    _ops, op_ns = operator_k8s_allow(configuration)
    t = ctx.target

    def allowed(ns: str) -> bool:
        return any(fnmatch.fnmatchcase(ns, p) for p in t.allow_namespaces) and any(
            fnmatch.fnmatchcase(ns, p) for p in op_ns
        )

    others = k8s_nodes.bystanders(ctx.core, node, allowed)
    if others:
        shown = ", ".join(others[:5]) + (f" (+{len(others) - 5} more)" if len(others) > 5 else "")
        raise ActivityFailed(
            f"node {node} also runs {len(others)} pod(s) outside the allowed namespaces: {shown}; "
            "refusing a node-level fault (nothing changed); pass allow_bystanders: true to accept "
            "the blast radius"
        )


def _state_path(configuration: dict[str, Any] | None, kind: str) -> Path:
    folder = private_dir(settings.run_dir(configuration) / "k8s-state")
    return folder / f"{kind}.json"


def _target_record(target: K8sTarget) -> dict[str, Any]:
    """Where a saved fault was injected, for a rollback replayed without the drill
    (``chaos-infer rollback --run-dir``): the target file (absolute), the context resolved now
    (as the allowlist saw it) and the namespace."""
    from chaoslib_infer.platforms.kubernetes.target import _resolve_context

    return {
        "file": str(Path(target.source).expanduser().resolve()),
        "context": target.context or _resolve_context(target.kubeconfig) or "in-cluster",
        "namespace": target.namespace,
    }


def _save_state(
    configuration: dict[str, Any] | None,
    kind: str,
    state: dict[str, Any],
    target: K8sTarget | None = None,
) -> None:
    if target is not None:  # kept by later saves of the same dict
        state.setdefault("k8s_target", _target_record(target))
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


def _undo(
    configuration: dict[str, Any] | None,
    target_file: str | None,
    kind: str,
    nothing: _T,
    undo: Callable[[_Ctx, dict[str, Any]], _T],
    log_keys: tuple[str, ...] = (),
    when_gone: Callable[[dict[str, Any]], _T] | None = None,
) -> _T:
    """The shape every rollback shares: read ``k8s-state/<kind>.json`` (none: return
    ``nothing``, idempotent), run ``undo(ctx, state)``, then remove the state and append the
    ``cleared`` line (kind ``k8s-<kind>`` plus the state's ``log_keys``) to the fault log.

    A 404 is handed to ``when_gone(state)`` when given (the object went away with the fault);
    any other :class:`K8sError` raises one ``ActivityFailed`` line and keeps the state, so
    ``chaos-infer rollback`` can retry.
    """
    state = _load_state(configuration, kind)
    if state is None:
        return nothing
    ctx = _ctx(target_file, configuration)
    try:
        result = undo(ctx, state)
    except K8sError as exc:
        if when_gone is None or exc.status != 404:
            raise ActivityFailed(str(exc)) from None
        result = when_gone(state)
    _state_path(configuration, kind).unlink(missing_ok=True)
    entry = {"kind": f"k8s-{kind}", "phase": "cleared", "at": time.time()}
    entry.update({k: state[k] for k in log_keys if k in state})
    _log_fault(configuration, entry)
    return result


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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    if _load_state(configuration, "quota-cut") is not None:
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
        _save_state(configuration, "quota-cut", saved, t)
        fault_at = time.time()
        done = k8s_quota.cut(ctx.core, ctx.apps, saved, gpus, replicas, hpa_max_replicas)
        done["hpa_skipped"] = saved.get("hpa_skipped")
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
    nothing: list[str] = []
    return _undo(
        configuration,
        target_file,
        "quota-cut",
        nothing,
        lambda ctx, saved: k8s_quota.restore(ctx.core, ctx.apps, saved),
    )


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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    try:
        before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
        chosen = k8s_pods.select_pods(before, 1, [pod] if pod else None)[0]
        node = k8s_nodes.node_of_pod(ctx.core, t.namespace, chosen["metadata"]["name"])
        _refuse_bystanders(ctx, node, allow_bystanders, configuration)
        was = k8s_nodes.is_unschedulable(ctx.core, node)
        _save_state(configuration, "node-loss", {"node": node, "was_unschedulable": was}, t)
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
    return _undo(
        configuration,
        target_file,
        "node-loss",
        "no node cordoned by this run",
        lambda ctx, st: k8s_nodes.uncordon(ctx.core, st["node"], bool(st.get("was_unschedulable"))),
        log_keys=("node",),
    )


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
            t,
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


# -- issue 4: oom-kill, upstream-timeout (freeze / ingress block), node-loss variants ----------


def _one_ready_pod(ctx: _Ctx, pod: str | None) -> dict[str, Any]:
    t = ctx.target
    return k8s_pods.select_pods(
        k8s_pods.list_pods(ctx.core, t.namespace, t.selector), 1, [pod] if pod else None
    )[0]


def _refuse_twice(configuration: dict[str, Any] | None, kind: str, rollback: str) -> None:
    if _load_state(configuration, kind) is not None:
        raise ActivityFailed(
            f"a {kind} fault is already in place in this run; roll it back first ({rollback})"
        )


def _networking(ctx: _Ctx) -> Any:
    from kubernetes import client

    return client.NetworkingV1Api(ctx.core.api_client)


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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    _refuse_twice(configuration, "oom-kill", "k8s_stop_memory_hog")
    try:
        chosen = _one_ready_pod(ctx, pod)
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
        _save_state(configuration, "oom-kill", state, t)
        fault_at = time.time()
        _log_fault(
            configuration,
            {
                "kind": "k8s-oom-kill",
                "fault_at": fault_at,
                "pod": name,
                "container": t.container,
                "hog_mb": mb,
                "memory_limit_bytes": limit,
            },
        )
        with held_interrupts():  # the hog is recorded before a Ctrl-C can reach the rollback
            try:
                hog = k8s_oom.start_hog(
                    ctx.core, t.namespace, name, t.container, mb, timeout_s + 30
                )
            except K8sError:
                _state_path(configuration, "oom-kill").unlink(missing_ok=True)  # nothing started
                raise
            state["hog"] = hog
            _save_state(configuration, "oom-kill", state)
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
        "kind": "k8s-oom-kill",
        "fault_at": fault_at,
        "pod": name,
        "container": t.container,
        "hog_mb": mb,
        "memory_limit_bytes": limit,
        "hog": hog,
        "restart_count_before": before,
        **{k: v for k, v in fig.items() if k not in ("died", "polls")},
        "warmup_ttft_s": None,
        "warmup_omitted": _WARMUP_OMITTED,
    }
    _log_fault(configuration, {**result, "kind": "k8s-oom-recovery"})
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
    state = _load_state(configuration, "oom-kill")
    if state is None:
        return "no memory hog started by this run"
    if not state.get("hog"):
        _state_path(configuration, "oom-kill").unlink(missing_ok=True)
        return "no memory hog started by this run"
    ctx = _ctx(target_file, configuration)
    try:
        line = k8s_oom.stop_hog(ctx.core, state)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _state_path(configuration, "oom-kill").unlink(missing_ok=True)
    _log_fault(
        configuration,
        {"kind": "k8s-oom-kill", "phase": "cleared", "at": time.time(), "pod": state["pod"]},
    )
    return line


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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    _refuse_twice(configuration, "upstream-freeze", "k8s_thaw_model_server")
    try:
        chosen = _one_ready_pod(ctx, pod)
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
        _save_state(configuration, "upstream-freeze", saved, t)
        fault_at = time.time()
        _log_fault(
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
            ctx.core, saved, ttl_s, lambda s: _save_state(configuration, "upstream-freeze", s)
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
    return _undo(
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

    ctx = _ctx(target_file, configuration)
    t = ctx.target
    _refuse_twice(configuration, "upstream-ingress", "k8s_restore_pod_ingress")
    token = uuid.uuid4().hex[:12]
    try:
        chosen = _one_ready_pod(ctx, pod)
        name = chosen["metadata"]["name"]
        saved = {
            "namespace": t.namespace,
            "pod": name,
            "policy": f"chaos-infer-block-{token}",
            "token": token,
            "labels": dict(chosen["metadata"].get("labels") or {}),
        }
        _save_state(configuration, "upstream-ingress", saved, t)
        fault_at = time.time()
        _log_fault(
            configuration,
            {
                "kind": "k8s-upstream-ingress-block",
                "fault_at": fault_at,
                "pod": name,
                "policy": saved["policy"],
            },
        )
        done = k8s_policy.block(ctx.core, _networking(ctx), t.namespace, name, token, saved)
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
    state = _load_state(configuration, "upstream-ingress")
    if state is None:
        return []
    ctx = _ctx(target_file, configuration)
    try:
        lines = k8s_policy.unblock(ctx.core, _networking(ctx), state)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _state_path(configuration, "upstream-ingress").unlink(missing_ok=True)
    _log_fault(
        configuration,
        {"kind": "k8s-upstream-ingress-block", "phase": "cleared", "at": time.time()},
    )
    return lines


def _node_pods_recovery(
    ctx: _Ctx,
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
        return {
            "pods": [],
            "recovered": 0,
            "unrecovered": [],
            "max_total_recovery_s": None,
            "polls": 0,
        }
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
        recovery_timeout_s, poll_s: the recovery probe's bound and interval, seconds.
        target_file: the target YAML. configuration: Chaos Toolkit configuration.
        allow_bystanders: the operator accepts pods of other namespaces on the node (default:
            refused before any change when the node runs one; DaemonSet pods excepted).

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
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    _refuse_twice(configuration, "node-taint", "k8s_remove_node_taint")
    try:
        before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
        chosen = k8s_pods.select_pods(before, 1, [pod] if pod else None)[0]
        node = k8s_nodes.node_of_pod(ctx.core, t.namespace, chosen["metadata"]["name"])
        _refuse_bystanders(ctx, node, allow_bystanders, configuration)
        _save_state(configuration, "node-taint", {"node": node, "key": key, "effect": effect}, t)
        fault_at = time.time()
        _log_fault(
            configuration,
            {
                "kind": "k8s-node-taint",
                "fault_at": fault_at,
                "node": node,
                "key": key,
                "effect": effect,
            },
        )
        try:
            done = k8s_nodes.taint(ctx.core, node, key, effect)
        except K8sError:
            _state_path(configuration, "node-taint").unlink(missing_ok=True)  # not tainted
            raise
        recovery = (
            _node_pods_recovery(ctx, before, node, fault_at, recovery_timeout_s, poll_s)
            if effect == "NoExecute"
            else _node_pods_recovery(ctx, [], node, fault_at, 0, poll_s)
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    result = {"kind": "k8s-node-taint", "fault_at": fault_at, **done, "recovery": recovery}
    _log_fault(
        configuration, {"kind": "k8s-recovery", "fault_at": fault_at, "node": node, **recovery}
    )
    if recovery["unrecovered"]:
        raise ActivityFailed(
            f"{len(recovery['unrecovered'])} target pod(s) of tainted node {node} without a Ready "
            f"replacement after {recovery_timeout_s:g} s (a pod that tolerates {key}:{effect} "
            f"stays): {', '.join(recovery['unrecovered'])}"
        )
    return result


def k8s_remove_node_taint(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> str:
    """Rollback of :func:`k8s_taint_model_node`: remove that taint, leave any other (idempotent).

    Returns:
        One line; ``"no node tainted by this run"`` when nothing is recorded.

    Raises:
        ActivityFailed: 403, or 409 (the node changed during the PATCH).
    """
    return _undo(
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
        recovery_timeout_s, poll_s: the recovery probe's bound and interval, seconds.
        target_file: the target YAML. configuration: Chaos Toolkit configuration.
        allow_bystanders: the operator accepts pods of other namespaces on the node (default:
            refused before any change when the node runs one; DaemonSet pods excepted).

    Returns:
        ``{"kind": "k8s-node-delete", "fault_at", "node", "recovery"}``.

    Raises:
        ActivityFailed: 403 (nodes delete), 404, or target pods without a Ready replacement
            within ``recovery_timeout_s``.
    """
    ctx = _ctx(target_file, configuration)
    t = ctx.target
    _refuse_twice(configuration, "node-delete", "k8s_restore_node")
    try:
        before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
        chosen = k8s_pods.select_pods(before, 1, [pod] if pod else None)[0]
        node = k8s_nodes.node_of_pod(ctx.core, t.namespace, chosen["metadata"]["name"])
        _refuse_bystanders(ctx, node, allow_bystanders, configuration)
        raw = k8s_nodes.snapshot_node(ctx.core, node)
        _save_state(configuration, "node-delete", {"node": node, "raw": raw}, t)
        fault_at = time.time()
        _log_fault(configuration, {"kind": "k8s-node-delete", "fault_at": fault_at, "node": node})
        try:
            k8s_nodes.delete_node(ctx.core, node)
        except K8sError:
            _state_path(configuration, "node-delete").unlink(missing_ok=True)  # not deleted
            raise
        recovery = _node_pods_recovery(ctx, before, node, fault_at, recovery_timeout_s, poll_s)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    _log_fault(
        configuration, {"kind": "k8s-recovery", "fault_at": fault_at, "node": node, **recovery}
    )
    if recovery["unrecovered"]:
        raise ActivityFailed(
            f"{len(recovery['unrecovered'])} target pod(s) of deleted node {node} without a Ready "
            f"replacement after {recovery_timeout_s:g} s: {', '.join(recovery['unrecovered'])}"
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
    return _undo(
        configuration,
        target_file,
        "node-delete",
        "no node deleted by this run",
        lambda ctx, st: k8s_nodes.recreate_node(ctx.core, st["raw"]),
        log_keys=("node",),
    )
