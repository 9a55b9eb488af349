"""deploy/rbac.yaml covers every API call the Kubernetes actions make (and nothing is left unused)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_k8s import ALL_REQUESTS, FakeK8s, Request, make_cluster, write_target

from chaoslib_infer.activities import k8s

RBAC = Path(__file__).resolve().parent.parent / "deploy" / "rbac.yaml"
_NS = re.compile(r"/namespaces/([^/]+)/")


def _rules() -> tuple[list[tuple[str | None, dict[str, Any]]], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} <= kinds
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    roles: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        if d["kind"] in ("Role", "ClusterRole"):
            roles[(d["kind"], d["metadata"]["name"])] = d["rules"]
    bound: list[tuple[str | None, dict[str, Any]]] = []
    for d in docs:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        assert {
            "kind": "ServiceAccount",
            "name": sa["metadata"]["name"],
            "namespace": sa["metadata"]["namespace"],
        } in d["subjects"]
        scope = d["metadata"].get("namespace") if d["kind"] == "RoleBinding" else None
        for rule in roles[(d["roleRef"]["kind"], d["roleRef"]["name"])]:
            bound.append((scope, rule))
    return bound, sa


def covered(req: Request, bound: list[tuple[str | None, dict[str, Any]]]) -> bool:
    m = _NS.search(req.path)
    ns = m.group(1) if m else None
    for scope, rule in bound:
        if scope is not None and scope != ns:
            continue
        if (
            req.group in rule["apiGroups"]
            and req.resource in rule["resources"]
            and req.verb in rule["verbs"]
        ):
            return True
    return False


def _exercise(tmp_path: Path) -> list[Request]:
    """Every action and rollback once, on their success paths."""
    with FakeK8s(schedule_delay_s=0.05, ready_delay_s=0.05) as fake:
        make_cluster(fake, pdb_min_available=2)
        kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = str(write_target(tmp_path / "t.yaml", kc))
        cfg = {"infer_run_dir": str(tmp_path / "run")}
        k8s.k8s_simultaneous_restarts(count=1, poll_s=0.02, target_file=target, configuration=cfg)
        k8s.k8s_cut_quota(gpus=1, replicas=2, target_file=target, configuration=cfg)
        k8s.k8s_restore_quota(target_file=target, configuration=cfg)
        k8s.k8s_drain_model_node(poll_s=0.02, target_file=target, configuration=cfg)
        k8s.k8s_uncordon_node(target_file=target, configuration=cfg)
        k8s.k8s_network_jitter(target_file=target, configuration=cfg)
        k8s.k8s_remove_network_jitter(target_file=target, configuration=cfg)
        return list(fake.requests)


def test_rbac_covers_every_call_and_lists_nothing_unused(tmp_path: Path) -> None:
    bound, _ = _rules()
    seen = _exercise(tmp_path) + [r for r in ALL_REQUESTS if r.verb]
    assert len(seen) > 20
    missing = sorted({(r.verb, r.group, r.resource, r.path) for r in seen if not covered(r, bound)})
    assert missing == []
    used = {(r.group, r.resource, r.verb) for r in seen}
    listed = {
        (g, res, v)
        for _, rule in bound
        for g in rule["apiGroups"]
        for res in rule["resources"]
        for v in rule["verbs"]
    }
    assert listed - used == set()  # least privilege: no verb the actions never use


def test_coverage_check_can_fail() -> None:
    bound, _ = _rules()
    assert not covered(
        Request(
            "DELETE",
            "/api/v1/nodes/gpu-a",
            {},
            None,
            None,
            verb="delete",
            group="",
            resource="nodes",
        ),
        bound,
    )
    assert not covered(
        Request(
            "DELETE",
            "/api/v1/namespaces/kube-system/pods/x",
            {},
            None,
            None,
            verb="delete",
            group="",
            resource="pods",
        ),
        bound,
    )
    with pytest.raises(AssertionError):
        assert covered(
            Request(
                "PATCH",
                "/api/v1/namespaces/llm/pods/x",
                {},
                None,
                None,
                verb="patch",
                group="",
                resource="pods",
            ),
            bound,
        )
