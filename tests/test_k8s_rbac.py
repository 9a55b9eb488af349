"""deploy/rbac.yaml covers every API call the Kubernetes actions make but node-level faults (and
nothing is left unused); the opt-in deploy/rbac-node-loss.yaml and deploy/rbac-node-delete.yaml
cover exactly the node-level calls, ``create`` on nodes only in the delete variant's file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_k8s import ALL_REQUESTS, OPEN_FAKES, FakeK8s, Request, make_cluster, write_target
from labutil import put_hpa

from chaoslib_infer.activities import k8s

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RBAC = DEPLOY / "rbac.yaml"
NODE_LOSS = DEPLOY / "rbac-node-loss.yaml"
NODE_DELETE = DEPLOY / "rbac-node-delete.yaml"
_NS = re.compile(r"/namespaces/([^/]+)/")


def _rules(*extra: Path) -> tuple[list[tuple[str | None, dict[str, Any]]], dict[str, Any]]:
    docs = [d for f in (RBAC, *extra) for d in yaml.safe_load_all(f.read_text()) if d]
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


def _exercise(tmp_path: Path) -> tuple[list[Request], list[Request]]:
    """Every action and rollback once, on their success paths: ``(all requests, those of the
    default node-loss: drain and uncordon, on a node of its own and, opted in, on a shared one)``."""
    with FakeK8s(schedule_delay_s=0.05, ready_delay_s=0.05) as fake:
        make_cluster(fake, pdb_min_available=2)
        kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = str(write_target(tmp_path / "t.yaml", kc))
        cfg = {"infer_run_dir": str(tmp_path / "run")}
        k8s.k8s_simultaneous_restarts(count=1, poll_s=0.02, target_file=target, configuration=cfg)
        k8s.k8s_cut_quota(gpus=1, replicas=2, target_file=target, configuration=cfg)
        k8s.k8s_restore_quota(target_file=target, configuration=cfg)
        n0 = len(fake.requests)
        k8s.k8s_drain_model_node(poll_s=0.02, target_file=target, configuration=cfg)
        k8s.k8s_uncordon_node(target_file=target, configuration=cfg)
        _exercise_bystander_drain(fake, target, cfg)
        drain = list(fake.requests[n0:])
        k8s.k8s_network_jitter(target_file=target, configuration=cfg)
        k8s.k8s_remove_network_jitter(target_file=target, configuration=cfg)
        _exercise_load_workers(fake, target, tmp_path)
        _exercise_faults(fake, target, cfg)
        _exercise_observation(fake, kc, tmp_path, cfg)
        return list(fake.requests), drain


def _exercise_bystander_drain(fake: FakeK8s, target: str, cfg: dict[str, Any]) -> None:
    """node-loss on a node shared with another team: refused, then drained with the opt-in."""
    import copy

    from chaoslib.exceptions import ActivityFailed
    from fake_k8s import _model_pod

    node = next(p for p in fake.pods("llm", "app=vllm") if p["spec"].get("nodeName"))
    pod = copy.deepcopy(
        _model_pod("their-app-0", node["spec"]["nodeName"], "other-5d6f7", ns="team-b")
    )
    pod["metadata"]["labels"] = {"app": "other"}
    pod["metadata"]["ownerReferences"] = []  # a bare pod: evicted, not recreated
    fake.put("", "pods", pod)
    victim = node["metadata"]["name"]
    with pytest.raises(ActivityFailed, match="team-b/their-app-0"):
        k8s.k8s_drain_model_node(pod=victim, poll_s=0.02, target_file=target, configuration=cfg)
    k8s.k8s_drain_model_node(pod=victim, poll_s=0.02, allow_bystanders=True, target_file=target,
                             configuration=cfg)  # fmt: skip
    k8s.k8s_uncordon_node(target_file=target, configuration=cfg)


def _node_level(req: Request) -> str | None:
    """Which opt-in file a request needs: "delete" (nodes create/delete), "loss" (other node
    writes, evictions, cluster-wide pod reads), None (the default RBAC)."""
    if req.resource == "nodes" and req.verb in ("create", "delete"):
        return "delete"
    if req.resource == "nodes" and req.verb != "get":
        return "loss"
    if req.resource == "pods/eviction":
        return "loss"
    if req.resource == "pods" and "/namespaces/" not in req.path:
        return "loss"
    if req.resource == "pods" and req.verb == "get" and "/namespaces/team-b/" in req.path:
        return "loss"  # an evicted bystander, waited for (allow_bystanders)
    return None


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
    put_hpa(fake, {"scaleTargetRef": {"kind": "Deployment", "name": "vllm"}, "maxReplicas": 5})
    k8s.k8s_cut_quota(hpa_max_replicas=2, target_file=target, configuration=cfg)
    k8s.k8s_restore_quota(target_file=target, configuration=cfg)


def _exercise_load_workers(fake: FakeK8s, target: str, tmp_path: Path) -> None:
    """`chaos-infer load soak --workers 2`: Indexed Job, its pods' logs, delete (canned workers)."""
    import json

    from chaoslib_infer.load.soak import StreamStats
    from chaoslib_infer.load.workers import MARKER, encode_stats
    from chaoslib_infer.platforms.kubernetes.load_job import run_k8s
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


def _group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker else None


def _listed(bound: list[tuple[str | None, dict[str, Any]]]) -> set[tuple[str, str, str]]:
    return {
        (g, res, v)
        for _, rule in bound
        for g in rule["apiGroups"]
        for res in rule["resources"]
        for v in rule["verbs"]
    }


def _used(reqs: list[Request]) -> set[tuple[str, str, str]]:
    return {(r.group, r.resource, v) for r in reqs for v in (r.verb, *r.also_verbs)}


@pytest.mark.k8s_rbac_last
def test_rbac_covers_every_call_and_lists_nothing_unused(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every request of this exercise and of the whole suite (ALL_REQUESTS): the default file
    covers all but the node-level ones, which the opt-in files cover; no file grants a verb
    nothing uses; only the delete variant's file grants create on nodes.

    tests/conftest.py runs this test last, so every other test's fake API server has closed and
    added its requests; run alone, the exercise below still drives every action and rollback."""
    mine, drain = _exercise(tmp_path)
    # no test of its xdist group (every fake-Kubernetes test, one worker) runs after this one
    # and every fake started so far has closed: ALL_REQUESTS is every request they sent (their
    # files' and this exercise's)
    items = request.session.items
    group = _group(request.node)
    assert [i for i in items[items.index(request.node) + 1 :] if _group(i) == group] == []
    assert OPEN_FAKES == set()
    seen = mine + [r for r in ALL_REQUESTS if r.verb]
    assert len(seen) > 20
    default = [r for r in seen if _node_level(r) is None]
    loss = [r for r in seen if _node_level(r) == "loss"]
    delete = [r for r in seen if _node_level(r) == "delete"]
    assert loss and delete
    base, _ = _rules()
    with_loss, _ = _rules(NODE_LOSS)
    with_delete, _ = _rules(NODE_LOSS, NODE_DELETE)
    for reqs, bound in ((default, base), (loss, with_loss), (delete, with_delete)):
        missing = sorted({(r.verb, r.resource, r.path) for r in reqs if not covered(r, bound)})
        assert missing == []
    # sufficient, and minimal: no node-level request passes with the default file alone ...
    assert [r.path for r in loss + delete if covered(r, base)] == []
    assert [r.path for r in delete if covered(r, with_loss)] == []  # create/delete: own file
    # ... and no file grants a verb its drills never use
    assert _listed(base) - _used(default) == set()
    assert _listed(with_loss) - _listed(base) - _used(loss) == set()
    assert _listed(with_delete) - _listed(with_loss) - _used(delete) == set()
    assert ("", "nodes", "create") not in _listed(with_loss)
    # the default node-loss (drain through the Eviction API) needs exactly rbac-node-loss.yaml:
    # all of it (cordon/uncordon, the node's pods cluster-wide, evictions, an evicted
    # bystander's get) and nothing of rbac-node-delete.yaml
    assert [(r.verb, r.path) for r in drain if not covered(r, with_loss)] == []
    assert {r.resource for r in drain if r.method == "POST"} == {"pods/eviction"}
    assert _listed(with_loss) - _listed(base) - _used(drain) == set()


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
