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
            and all(v in rule["verbs"] for v in (req.verb, *req.also_verbs))
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
        _exercise_load_workers(fake, target, tmp_path)
        _exercise_faults(fake, target, cfg)
        _exercise_observation(fake, kc, tmp_path, cfg)
        return list(fake.requests)


def _exercise_observation(fake: FakeK8s, kc: Path, tmp_path: Path, cfg: dict[str, Any]) -> None:
    """Observation (activities/k8s_observe.py): sampler, probes, scale-out wait (HPA found by its
    scaleTargetRef: list, then get)."""
    import time

    from chaoslib.exceptions import ActivityFailed

    from chaoslib_infer.activities import k8s_observe

    target = str(write_target(tmp_path / "obs.yaml", kc, service="vllm"))
    k8s_observe.k8s_start_observation(interval_s=0.05, target_file=target, configuration=cfg)
    time.sleep(0.12)
    k8s_observe.k8s_stop_observation(configuration=cfg)
    k8s_observe.k8s_ready_endpoints(target_file=target, configuration=cfg)
    k8s_observe.k8s_restart_counts(target_file=target, configuration=cfg)
    k8s_observe.k8s_oomkilled_pods(target_file=target, configuration=cfg)
    with pytest.raises(ActivityFailed, match="no scale-out within"):
        k8s_observe.k8s_wait_scale_out(
            timeout_s=0.1, poll_s=0.02, target_file=target, configuration=cfg
        )


def _exercise_faults(fake: FakeK8s, target: str, cfg: dict[str, Any]) -> None:
    """Issue 4's fault actions and rollbacks (exec answered by a scripted container)."""
    from k8s_sim import SimContainer, kubelet_restart

    from chaoslib_infer.platforms.kubernetes.pods import is_ready

    pod = sorted(p["metadata"]["name"] for p in fake.pods("llm", "app=vllm") if is_ready(p))[0]
    fake.exec_handler = SimContainer(
        pod, on_hog=lambda mb: kubelet_restart(fake, "llm", pod, down_s=0.02, ready_s=0.02)
    )
    k8s.k8s_oom_kill(pod=pod, poll_s=0.02, timeout_s=5, target_file=target, configuration=cfg)
    k8s.k8s_stop_memory_hog(target_file=target, configuration=cfg)
    k8s.k8s_freeze_model_server(pod=pod, target_file=target, configuration=cfg)
    k8s.k8s_thaw_model_server(target_file=target, configuration=cfg)
    k8s.k8s_block_pod_ingress(target_file=target, configuration=cfg)
    k8s.k8s_restore_pod_ingress(target_file=target, configuration=cfg)
    k8s.k8s_taint_model_node(poll_s=0.02, target_file=target, configuration=cfg)
    k8s.k8s_remove_node_taint(target_file=target, configuration=cfg)
    k8s.k8s_delete_model_node(poll_s=0.02, target_file=target, configuration=cfg)
    k8s.k8s_restore_node(target_file=target, configuration=cfg)
    fake.put(
        "autoscaling",
        "horizontalpodautoscalers",
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "vllm", "namespace": "llm"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "vllm"}, "maxReplicas": 5},
        },
    )
    k8s.k8s_cut_quota(hpa_max_replicas=2, target_file=target, configuration=cfg)
    k8s.k8s_restore_quota(target_file=target, configuration=cfg)


def _exercise_load_workers(fake: FakeK8s, target: str, tmp_path: Path) -> None:
    """`chaos-infer load soak --workers 2`: Indexed Job, its pods' logs, delete (canned workers)."""
    import json

    from chaoslib_infer.load.soak import StreamStats
    from chaoslib_infer.load.workers import MARKER, encode_stats, run_k8s
    from chaoslib_infer.platforms.kubernetes.target import load_target

    def canned(pod: dict[str, Any]) -> tuple[int, str]:
        k = int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        res = {"mode": "soak", "shard": k, "of": 2, "report": {"valid": True}}
        return 0, MARKER + json.dumps({**res, "stats": encode_stats(StreamStats())}) + "\n"

    fake.run_pod = canned
    run_k8s(
        load_target(target), "soak", {"url": "http://127.0.0.1:9", "duration_s": 1, "rate": 1},
        2, tmp_path / "workers", image="chaos-infer:test", poll_s=0.02, start_delay_s=0,
    )  # fmt: skip


def test_rbac_covers_every_call_and_lists_nothing_unused(tmp_path: Path) -> None:
    bound, _ = _rules()
    seen = _exercise(tmp_path) + [r for r in ALL_REQUESTS if r.verb]
    assert len(seen) > 20
    missing = sorted({(r.verb, r.group, r.resource, r.path) for r in seen if not covered(r, bound)})
    assert missing == []
    used = {(r.group, r.resource, v) for r in seen for v in (r.verb, *r.also_verbs)}
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
            "/api/v1/persistentvolumes/pv-1",
            {},
            None,
            None,
            verb="delete",
            group="",
            resource="persistentvolumes",
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
                "/api/v1/namespaces/llm/secrets/x",
                {},
                None,
                None,
                verb="patch",
                group="",
                resource="secrets",
            ),
            bound,
        )
    # a WebSocket exec is authorized twice (get, then create): both verbs must be granted
    exec_path = "/api/v1/namespaces/llm/pods/x/exec"
    ws = Request("GET", exec_path, {}, None, None, verb="get", resource="pods/exec")
    assert covered(Request(**{**ws.__dict__, "also_verbs": ("create",)}), bound)
    assert not covered(Request(**{**ws.__dict__, "also_verbs": ("deletecollection",)}), bound)
