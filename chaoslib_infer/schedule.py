"""Scheduled game days: ``chaos-infer schedule`` writes the Kubernetes objects of a recurring game day.

``build_schedule`` returns, in ``kubectl apply`` order:

1. the ``ServiceAccount``, ``Role``/``RoleBinding`` (target namespace) and, when a drill of the
   plan touches nodes, the node-loss ``ClusterRole``/``ClusterRoleBinding``, all taken from
   ``deploy/rbac.yaml`` (the single source of truth; ``tests/test_k8s_rbac.py`` checks it covers
   every API call) with its namespaces replaced by the target's and the runner's. The load
   workers' Role is left out: a game day does not start workers;
2. a ``ConfigMap`` holding ``plan.yaml`` (the plan, each drill's experiment renamed to its key),
   ``target.yaml`` (the target file without its ``kubeconfig``: in the pod the service account is
   used; the context the allowlist accepted is written in) and one ``<drill>.yaml`` per experiment;
3. a ``batch/v1`` ``CronJob`` (``concurrencyPolicy: Forbid``, ``activeDeadlineSeconds``) whose
   pod runs ``chaos-infer gameday /config/plan.yaml --target /config/target.yaml --out
   /evidence/gameday-<UTC time>`` from the project's image (``Dockerfile``), as the
   ServiceAccount, non-root. ``/evidence`` is a PersistentVolumeClaim when one is named, else an
   ``emptyDir`` (the evidence then lives only as long as the pod; the log has the verdict).
   Each run is appended to the history store (issue 32, :mod:`chaoslib_infer.history`) named by
   ``$CHAOS_INFER_HISTORY``: the team's PostgreSQL URL from a Secret (``history_secret``, key
   ``url``), else ``/evidence/history.sqlite`` on the PersistentVolumeClaim, else none (an
   ``emptyDir`` would forget it with the pod).

Nothing is sent to a cluster: the output is YAML to apply (``kubectl apply -f``).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import ConfigError

__all__ = [
    "CONFIG_DIR",
    "NODE_DELETE_FUNCS",
    "NODE_FUNCS",
    "ScheduleSpec",
    "build_schedule",
    "dump_documents",
    "rbac_path",
    "validate_cron",
]

#: Where the ConfigMap is mounted in the game-day pod.
CONFIG_DIR = "/config"
#: Actions that touch Node objects: a plan using one gets the node-loss ClusterRole.
NODE_FUNCS = frozenset(
    {
        "k8s_drain_model_node",
        "k8s_uncordon_node",
        "k8s_taint_model_node",
        "k8s_remove_node_taint",
        "k8s_delete_model_node",
        "k8s_restore_node",
    }
)
#: The delete-Node variant's actions: a plan using one also gets ``rbac-node-delete.yaml``
#: (``create`` on nodes), which no other plan carries.
NODE_DELETE_FUNCS = frozenset({"k8s_delete_model_node", "k8s_restore_node"})
_NODE_ROLE = "chaos-infer-node-loss"
_WORKERS_ROLE = "chaos-infer-load-workers"
_RBAC_TARGET_NS = "llm"  # the placeholder target namespace in deploy/rbac.yaml
_RBAC_OWN_NS = "chaos-infer"
_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
_CM_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_CM_MAX = 1024 * 1024 - 4096  # a ConfigMap holds at most 1 MiB; keep room for metadata


def validate_cron(expr: str) -> str:
    """Check a CronJob schedule: five fields (minute hour day-of-month month day-of-week) or a
    macro (``@daily`` ...), as Kubernetes accepts them.

    Returns:
        The expression, whitespace-normalised.

    Raises:
        ConfigError: one line naming the expression and the expected form.
    """
    from croniter import croniter

    text = " ".join(expr.split())
    if text in _MACROS:
        return text
    fields = text.split(" ")
    if len(fields) != 5 or not croniter.is_valid(text):
        raise ConfigError(
            f"--cron {expr!r}: not a valid schedule; expected 5 fields 'minute hour "
            "day-of-month month day-of-week' (e.g. '0 3 * * 1': Mondays 03:00) or @daily/@weekly..."
        )
    return text


def rbac_path() -> Path:
    """``deploy/rbac.yaml``: ``$CHAOS_INFER_RBAC`` or the checkout's."""
    import os

    env = os.environ.get("CHAOS_INFER_RBAC")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "deploy" / "rbac.yaml"


@dataclass(frozen=True)
class ScheduleSpec:
    """What ``chaos-infer schedule`` was asked for.

    Attributes:
        cron: the CronJob schedule (checked by :func:`validate_cron`).
        plan: a plan file with ``platform: kubernetes``.
        target: the Kubernetes target file (its allowlist is checked).
        image: the image with this package (``Dockerfile``).
        namespace: where the ServiceAccount, ConfigMap and CronJob live.
        name: the CronJob's and ConfigMap's name.
        deadline_s: ``activeDeadlineSeconds`` of each run (seconds).
        evidence_pvc: PersistentVolumeClaim mounted at ``/evidence`` (None: ``emptyDir``).
        api_key_secret: Secret whose key ``api-key`` becomes ``$CHAOS_INFER_API_KEY`` (or None).
        history_secret: Secret whose key ``url`` (``postgresql://USER:PASSWORD@HOST/DB``)
            becomes ``$CHAOS_INFER_HISTORY``, the team's history store (or None: the PVC's
            ``/evidence/history.sqlite``, else ``off``).
    """

    cron: str
    plan: Path
    target: Path
    image: str
    namespace: str = "chaos-infer"
    name: str = "chaos-infer-gameday"
    deadline_s: int = 3600
    evidence_pvc: str | None = None
    api_key_secret: str | None = None
    history_secret: str | None = None


def _functions(experiment: dict[str, Any]) -> set[str]:
    out = set()
    for section in ("method", "rollbacks"):
        for act in experiment.get(section) or []:
            func = ((act or {}).get("provider") or {}).get("func")
            if func:
                out.add(str(func))
    return out


def _rbac(
    target_ns: str, own_ns: str, with_nodes: bool, with_delete: bool = False
) -> list[dict[str, Any]]:
    """The default RBAC, plus the opt-in node-loss file (``rbac-node-loss.yaml`` beside it) for a
    plan whose drills touch nodes, and ``rbac-node-delete.yaml`` for one that deletes a Node."""
    path = rbac_path()
    paths = [path, path.with_name("rbac-node-loss.yaml")] if with_nodes else [path]
    if with_nodes and with_delete:
        paths.append(path.with_name("rbac-node-delete.yaml"))
    docs: list[dict[str, Any]] = []
    for one in paths:
        try:
            docs += [d for d in yaml.safe_load_all(one.read_text(encoding="utf-8")) if d]
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{one}: cannot read the RBAC manifests: {exc}") from None
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        meta = doc.setdefault("metadata", {})
        if meta.get("name") == _WORKERS_ROLE:
            continue
        if meta.get("name") == _NODE_ROLE and not with_nodes:
            continue
        if meta.get("namespace") == _RBAC_TARGET_NS:
            meta["namespace"] = target_ns
        elif meta.get("namespace") == _RBAC_OWN_NS:
            meta["namespace"] = own_ns
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = own_ns
        out.append(doc)
    return out


def _config_target(target_path: Path, plan_path: Path) -> tuple[str, Any]:
    from chaoslib_infer.platforms.kubernetes.target import effective_context, load_target

    # the operator's allowlist (environment, the plan's allow:): refused here, before anything is
    # written; a target file can only narrow it
    target = load_target(target_path, plan_path=plan_path)
    raw = yaml.safe_load(target_path.expanduser().read_text(encoding="utf-8"))
    raw.pop("kubeconfig", None)  # in the pod: the service account (in-cluster configuration)
    raw["context"] = effective_context(target)
    return yaml.safe_dump(raw, sort_keys=False), target


def _operator_allow(plan_path: Path) -> dict[str, list[str]]:
    """The allowlist the operator who schedules gives the scheduled game day: the plan's own
    ``allow:`` plus ``$CHAOS_INFER_ALLOW`` / ``_CONTEXTS`` / ``_NAMESPACES`` at schedule time, as
    the scheduled plan's ``allow: {urls, contexts, namespaces}`` (the pod has no operator
    environment; the target file in the ConfigMap can still only narrow it)."""
    from chaoslib_infer.safety.allowlist import ENV_VAR, operator_k8s_allow, plan_allow

    contexts, namespaces = operator_k8s_allow(plan_path=plan_path)
    urls = [*plan_allow(plan_path), *(x for x in os.environ.get(ENV_VAR, "").split(",") if x)]
    return {
        "urls": list(dict.fromkeys(u.strip() for u in urls if u.strip())),
        "contexts": list(contexts),
        "namespaces": list(namespaces),
    }


def _history_env(spec: ScheduleSpec) -> dict[str, Any]:
    """``$CHAOS_INFER_HISTORY`` of the CronJob's pod: the team's store from the Secret, else an
    SQLite file on the evidence claim, else ``off`` (an ``emptyDir`` dies with the pod)."""
    name = "CHAOS_INFER_HISTORY"
    if spec.history_secret:
        return {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": spec.history_secret, "key": "url"}},
        }
    return {"name": name, "value": "/evidence/history.sqlite" if spec.evidence_pvc else "off"}


def build_schedule(spec: ScheduleSpec) -> list[dict[str, Any]]:
    """The Kubernetes objects of a scheduled game day (see the module docstring).

    Returns:
        ServiceAccount, Role, RoleBinding, [ClusterRole, ClusterRoleBinding], ConfigMap, CronJob
        (plain dicts, ``kubectl apply`` order).

    Raises:
        ConfigError: a bad cron expression, a plan that is not for Kubernetes (or malformed), a
            target refused by its allowlist, a bad name, or a ConfigMap over 1 MiB.
    """
    from chaoslib_infer.plan import load_plan

    cron = validate_cron(spec.cron)
    for what, value in (("--namespace", spec.namespace), ("--name", spec.name)):
        if not _DNS_LABEL.match(value):
            raise ConfigError(f"{what} {value!r}: expected a DNS label (a-z, 0-9, '-')")
    if spec.deadline_s < 60:
        raise ConfigError(f"--deadline-s {spec.deadline_s}: a game day needs at least 60 s")
    plan = load_plan(spec.plan)
    if plan.platform != "kubernetes":
        raise ConfigError(
            f"{spec.plan}: a scheduled game day runs on the cluster: the plan needs "
            "platform: kubernetes (e.g. drills/gameday-k8s.yaml)"
        )
    target_text, target = _config_target(spec.target, spec.plan)
    raw_plan = yaml.safe_load(spec.plan.read_text(encoding="utf-8"))
    raw_plan.pop("target", None)
    raw_plan["allow"] = _operator_allow(spec.plan)
    data: dict[str, str] = {"target.yaml": target_text}
    funcs: set[str] = set()
    for drill, item in zip(plan.drills, raw_plan["drills"], strict=True):
        key = f"{drill.name}.yaml"
        if not _CM_KEY.match(key) or key in ("plan.yaml", "target.yaml"):
            raise ConfigError(f"{spec.plan}: drill name {drill.name!r} cannot be a ConfigMap key")
        text = drill.experiment.read_text(encoding="utf-8")
        funcs |= _functions(yaml.safe_load(text) or {})
        data[key] = text
        item["experiment"] = key  # relative to /config/plan.yaml
    data["plan.yaml"] = (
        f"# {spec.plan.name}, scheduled by chaos-infer schedule; experiments beside it\n"
        + yaml.safe_dump(raw_plan, sort_keys=False)
    )
    size = sum(len(k) + len(v.encode("utf-8")) for k, v in data.items())
    if size > _CM_MAX:
        raise ConfigError(
            f"plan, target and experiments are {size} bytes: over a ConfigMap's 1 MiB"
        )
    labels = {"app.kubernetes.io/name": "chaos-infer", "app.kubernetes.io/component": "gameday"}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "data": {
            k: data[k]
            for k in ["plan.yaml", "target.yaml", *sorted(set(data) - {"plan.yaml", "target.yaml"})]
        },
    }
    run = (
        f"exec chaos-infer gameday {CONFIG_DIR}/plan.yaml --target {CONFIG_DIR}/target.yaml "
        '--out "/evidence/gameday-$(date -u +%Y%m%dT%H%M%SZ)"'
    )
    container: dict[str, Any] = {
        "name": "gameday",
        "image": spec.image,
        "command": ["/bin/sh", "-c", run],
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "evidence", "mountPath": "/evidence"},
        ],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    env: list[dict[str, Any]] = []
    if spec.api_key_secret:
        env.append(
            {
                "name": "CHAOS_INFER_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": spec.api_key_secret, "key": "api-key"}},
            }
        )
    env.append(_history_env(spec))
    container["env"] = env
    evidence: dict[str, Any] = (
        {"name": "evidence", "persistentVolumeClaim": {"claimName": spec.evidence_pvc}}
        if spec.evidence_pvc
        else {"name": "evidence", "emptyDir": {}}
    )
    cron_job = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "schedule": cron,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    "backoffLimit": 0,  # a failed game day is evidence, not something to retry
                    "activeDeadlineSeconds": spec.deadline_s,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "serviceAccountName": "chaos-infer",
                            "restartPolicy": "Never",
                            "securityContext": {
                                "runAsNonRoot": True,
                                "runAsUser": 10001,
                                "fsGroup": 10001,
                            },
                            "containers": [container],
                            "volumes": [
                                {"name": "config", "configMap": {"name": spec.name}},
                                evidence,
                            ],
                        },
                    },
                },
            },
        },
    }
    with_nodes = bool(funcs & NODE_FUNCS)
    with_delete = bool(funcs & NODE_DELETE_FUNCS)
    return [*_rbac(target.namespace, spec.namespace, with_nodes, with_delete), config_map, cron_job]


def dump_documents(docs: list[dict[str, Any]], header: str = "") -> str:
    """Multi-document YAML (``---`` between documents), with an optional comment header."""
    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + yaml.safe_dump_all(docs, sort_keys=False, width=100)
