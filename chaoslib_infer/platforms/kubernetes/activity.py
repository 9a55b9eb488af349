"""What every room's Kubernetes actions share: the target's clients, the saved fault state, the log.

Used by ``chaoslib_infer/drills/<drill>/k8s.py`` and :mod:`chaoslib_infer.activities.k8s_observe`.
The target is resolved from ``target_file``, else the configuration's ``infer_k8s_target``, else
``$CHAOS_INFER_K8S_TARGET``. A fault's rollback data is written to
``<infer_run_dir>/k8s-state/<kind>.json`` *before* injection (:func:`save_state`), read back by
its rollback (:func:`undo_saved`) and by
``chaos-infer rollback`` (:mod:`chaoslib_infer.k8s_replay`).
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
from chaoslib_infer.platforms.kubernetes import nodes as k8s_nodes
from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
from chaoslib_infer.platforms.kubernetes.target import K8sTarget, load_target
from chaoslib_infer.safety.redact import private_dir

__all__ = [
    "ENV_TARGET",
    "K8sContext",
    "k8s_context",
    "load_state",
    "log_fault",
    "networking_api",
    "one_ready_pod",
    "refuse_bystanders",
    "refuse_twice",
    "save_state",
    "state_path",
    "target_record",
    "undo_saved",
]

ENV_TARGET = "CHAOS_INFER_K8S_TARGET"

_T = TypeVar("_T")


class K8sContext:
    """The API clients of one Kubernetes target: ``target``, ``core`` (CoreV1Api), ``apps``
    (AppsV1Api)."""

    def __init__(self, target: K8sTarget) -> None:
        from kubernetes import client

        self.target = target
        api = clients(target.kubeconfig, target.context)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)


def k8s_context(target_file: str | None, configuration: dict[str, Any] | None) -> K8sContext:
    """The clients of the target named by ``target_file``, else the configuration's
    ``infer_k8s_target``, else ``$CHAOS_INFER_K8S_TARGET`` (checked against the allowlists).

    Raises:
        ActivityFailed: no target named, or the target file is refused or unreadable.
    """
    path = (
        target_file or (configuration or {}).get("infer_k8s_target") or os.environ.get(ENV_TARGET)
    )
    if not path:
        raise ActivityFailed(
            f"no Kubernetes target: pass target_file, set infer_k8s_target or ${ENV_TARGET}"
        )
    try:
        return K8sContext(load_target(str(path), configuration=configuration))
    except InferChaosError as exc:
        raise ActivityFailed(str(exc)) from None


def refuse_bystanders(ctx: Any, node: str, allow_bystanders: bool, configuration: Any) -> None:
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


def state_path(configuration: dict[str, Any] | None, kind: str) -> Path:
    """``<infer_run_dir>/k8s-state/<kind>.json`` (the folder created private)."""
    folder = private_dir(settings.run_dir(configuration) / "k8s-state")
    return folder / f"{kind}.json"


def target_record(target: K8sTarget) -> dict[str, Any]:
    """Where a saved fault was injected, for a rollback replayed without the drill
    (``chaos-infer rollback --run-dir``): the target file (absolute), the context resolved now
    (as the allowlist saw it) and the namespace."""
    from chaoslib_infer.platforms.kubernetes.target import effective_context

    return {
        "file": str(Path(target.source).expanduser().resolve()),
        "context": effective_context(target),
        "namespace": target.namespace,
    }


def save_state(
    configuration: dict[str, Any] | None,
    kind: str,
    state: dict[str, Any],
    target: K8sTarget | None = None,
) -> None:
    """Write ``state`` (the fault's rollback data) to :func:`state_path` atomically, with where
    the fault is injected (``k8s_target``, :func:`target_record`) when ``target`` is given."""
    if target is not None:  # kept by later saves of the same dict
        state.setdefault("k8s_target", target_record(target))
    path = state_path(configuration, kind)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, path)


def load_state(configuration: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The saved rollback data of ``kind`` in this run, or None (nothing in place)."""
    path = state_path(configuration, kind)
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def log_fault(configuration: dict[str, Any] | None, entry: dict[str, Any]) -> None:
    """Append ``entry`` (one JSON line) to the fault log (``<infer_run_dir>/faults.jsonl``)."""
    with settings.faults_path(configuration).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def undo_saved(
    configuration: dict[str, Any] | None,
    target_file: str | None,
    kind: str,
    nothing: _T,
    undo: Callable[[K8sContext, dict[str, Any]], _T],
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
    state = load_state(configuration, kind)
    if state is None:
        return nothing
    ctx = k8s_context(target_file, configuration)
    try:
        result = undo(ctx, state)
    except K8sError as exc:
        if when_gone is None or exc.status != 404:
            raise ActivityFailed(str(exc)) from None
        result = when_gone(state)
    state_path(configuration, kind).unlink(missing_ok=True)
    entry = {"kind": f"k8s-{kind}", "phase": "cleared", "at": time.time()}
    entry.update({k: state[k] for k in log_keys if k in state})
    log_fault(configuration, entry)
    return result


# -- issue 4: oom-kill, upstream-timeout (freeze / ingress block), node-loss variants ----------


def one_ready_pod(ctx: K8sContext, pod: str | None) -> dict[str, Any]:
    """The target pod ``pod``, or one Ready target pod
    (:func:`chaoslib_infer.platforms.kubernetes.pods.select_pods`).

    Raises:
        K8sError: no such pod, or none Ready.
    """
    t = ctx.target
    return k8s_pods.select_pods(
        k8s_pods.list_pods(ctx.core, t.namespace, t.selector), 1, [pod] if pod else None
    )[0]


def refuse_twice(configuration: dict[str, Any] | None, kind: str, rollback: str) -> None:
    """Refuse a second ``kind`` fault while one is saved in this run.

    Raises:
        ActivityFailed: one is in place (roll it back first with ``rollback``).
    """
    if load_state(configuration, kind) is not None:
        raise ActivityFailed(
            f"a {kind} fault is already in place in this run; roll it back first ({rollback})"
        )


def networking_api(ctx: K8sContext) -> Any:
    """A NetworkingV1Api on the target's API client (NetworkPolicies)."""
    from kubernetes import client

    return client.NetworkingV1Api(ctx.core.api_client)
