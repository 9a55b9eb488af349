"""Refuse a node-level fault on a shared node before a Kubernetes run starts anything.

Every node-level action (``k8s_drain_model_node``, ``k8s_taint_model_node``,
``k8s_delete_model_node``) lists the pods of the node it picked and refuses, before any change,
when one belongs to a namespace outside the allowlists (DaemonSet, mirror and finished pods
excepted; ``allow_bystanders: true`` opts in). Inside a drill that refusal reads as a failed
action, after the load has started and the baseline was measured. :func:`check_plan` asks the
same question of the cluster before anything starts, so ``chaos-infer gameday --target FILE`` and
``drill run`` end with one line and exit 2 instead.

For each node-level action of the plan's experiments it resolves the node the action would pick
*now* (its ``pod`` argument, else the first Ready target pod: the action's own choice), lists the
pods on that node and applies the action's own rule (:func:`chaoslib_infer.activities.
k8s_common.refuse_bystanders`). Three read requests per node-level drill (list the target pods, get the
pod, list the node's pods), none when the plan has no node-level drill. A read the credentials
do not allow (``deploy/rbac-node-loss.yaml`` not applied) or any other API error is left to the
action (it fails its drill with one line then); only a positive finding refuses the run. The
action still checks again before its change: the cluster can move between the preflight and the
drill.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from chaoslib_infer.drills import is_k8s_actions_module
from chaoslib_infer.errors import ConfigError

__all__ = ["NODE_FAULTS", "check_plan", "node_fault_calls"]

#: the node-level fault actions (node-loss's room, :mod:`chaoslib_infer.drills.node_loss.k8s`)
NODE_FAULTS = ("k8s_drain_model_node", "k8s_taint_model_node", "k8s_delete_model_node")


_VAR = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def _resolve(value: Any, drill_vars: dict[str, Any], config: dict[str, Any]) -> Any:
    """A ``${name}`` argument from the plan's vars, else the experiment's configuration."""
    if not isinstance(value, str):
        return value
    m = _VAR.match(value.strip())
    if not m:
        return value
    name = m.group(1)
    if name in drill_vars:
        return drill_vars[name]
    raw = config.get(name)
    if isinstance(raw, dict):
        return raw.get("default")
    return raw


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def node_fault_calls(plan: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """The node-level fault actions in the method of each drill of ``plan``.

    Args:
        plan: a :class:`chaoslib_infer.plan.Plan` (its drills' experiment files and vars).

    Returns:
        ``[(drill name, action function, {"pod": ..., "allow_bystanders": ...})]`` with
        ``${var}`` arguments resolved from the drill's vars and the experiment's configuration.
    """
    import yaml

    calls: list[tuple[str, str, dict[str, Any]]] = []
    for spec in plan.drills:
        try:
            exp = yaml.safe_load(Path(spec.experiment).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue  # validate_plan has refused it already
        config = exp.get("configuration") or {}
        for act in exp.get("method") or []:
            provider = (act or {}).get("provider") or {}
            func = provider.get("func")
            if not is_k8s_actions_module(provider.get("module")) or func not in NODE_FAULTS:
                continue
            args = provider.get("arguments") or {}
            resolved = {k: _resolve(v, dict(spec.vars or {}), config) for k, v in args.items()}
            calls.append(
                (
                    spec.name,
                    str(func),
                    {
                        "pod": resolved.get("pod") or None,
                        "allow_bystanders": _truthy(resolved.get("allow_bystanders", False)),
                    },
                )
            )
    return calls


def check_plan(plan: Any, target: Any, configuration: dict[str, Any] | None = None) -> int:
    """Refuse the run when a node-level drill of ``plan`` would hit pods of other namespaces.

    Args:
        plan: the plan about to run.
        target: its :class:`~chaoslib_infer.platforms.kubernetes.target.K8sTarget` (allowlist
            already checked).
        configuration: the operator's allowlist as the game day hands it to the experiments
            (``infer_allow_namespaces``...); None: ``$CHAOS_INFER_ALLOW_NAMESPACES`` and the
            plan's ``allow:``.

    Returns:
        How many node-level drills were checked (0: none in the plan, no API call).

    Raises:
        ConfigError: one line naming the drill, the node and the first bystanders; nothing has
            started.
    """
    calls = [c for c in node_fault_calls(plan) if not c[2]["allow_bystanders"]]
    if not calls:
        return 0
    from chaoslib.exceptions import ActivityFailed

    from chaoslib_infer.errors import InferChaosError
    from chaoslib_infer.platforms.kubernetes import K8sError
    from chaoslib_infer.platforms.kubernetes import nodes as k8s_nodes
    from chaoslib_infer.platforms.kubernetes import pods as k8s_pods
    from chaoslib_infer.platforms.kubernetes.activity import K8sContext, refuse_bystanders
    from chaoslib_infer.safety import allowlist

    if configuration is None:
        contexts, namespaces = allowlist.operator_k8s_allow(plan_path=plan.path)
        configuration = {
            allowlist.CONFIG_CONTEXTS: ",".join(contexts),
            allowlist.CONFIG_NAMESPACES: ",".join(namespaces),
        }
    try:
        ctx = K8sContext(target)
    except (InferChaosError, K8sError, OSError, ValueError):
        return 0  # the preflight's own API check reports an unusable kubeconfig
    for drill, func, args in calls:
        t = ctx.target
        try:
            before = k8s_pods.list_pods(ctx.core, t.namespace, t.selector)
            chosen = k8s_pods.select_pods(before, 1, [args["pod"]] if args["pod"] else None)
            name = chosen[0]["metadata"]["name"]
            node = k8s_nodes.node_of_pod(ctx.core, t.namespace, name)
        except (K8sError, IndexError, KeyError):
            continue  # no Ready pod, a 403...: the action says so in its drill
        try:
            refuse_bystanders(ctx, node, False, configuration)
        except ActivityFailed as exc:
            raise ConfigError(
                f"{target.source}: drill {drill} ({func}): {exc}; no drill started"
            ) from None
        except K8sError:
            continue
    return len(calls)
