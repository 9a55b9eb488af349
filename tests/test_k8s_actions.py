"""Kubernetes actions against the HTTP-level fake API: exact requests, state after action and rollback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed
from fake_k8s import FakeK8s, make_cluster, write_target

from chaoslib_infer.activities import k8s
from chaoslib_infer.lab.netem import netem_add_args
from chaoslib_infer.platforms.kubernetes.network import ephemeral_netem_spec

SCHEDULE_S, READY_S, POLL_S = 0.2, 0.3, 0.05


def _setup(tmp_path: Path, fake: FakeK8s, **target: Any) -> tuple[str, dict[str, Any]]:
    kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
    path = write_target(tmp_path / "target.yaml", kc, **target)
    return str(path), {"infer_run_dir": str(tmp_path / "run")}


@pytest.fixture()
def fake():
    with FakeK8s(schedule_delay_s=SCHEDULE_S, ready_delay_s=READY_S) as f:
        yield f


def _faults(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    text = (Path(cfg["infer_run_dir"]) / "faults.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


# -- simultaneous restarts -------------------------------------------------------------------


def test_simultaneous_restarts_deletes_at_once_and_times_recovery(
    tmp_path: Path, fake: FakeK8s
) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    before = {p["metadata"]["name"] for p in fake.pods("llm")}
    out = k8s.k8s_simultaneous_restarts(
        count=2, poll_s=POLL_S, target_file=target, configuration=cfg
    )
    deletes = fake.calls("DELETE")
    chosen = sorted(before)[:2]
    assert sorted(r.path for r in deletes) == [f"/api/v1/namespaces/llm/pods/{n}" for n in chosen]
    assert all(r.query.get("gracePeriodSeconds") == "0" for r in deletes)
    times = [d["deleted_at"] for d in out["deleted"]]
    assert max(times) - min(times) < 0.05  # the same instant
    after = fake.pods("llm", "app=vllm")
    assert len(after) == 3 and not set(chosen) & {p["metadata"]["name"] for p in after}
    rec = out["recovery"]
    assert rec["recovered"] == 2 and rec["unrecovered"] == []
    for row in rec["pods"]:
        assert row["replacement"] not in before
        assert SCHEDULE_S - 0.01 <= row["rescheduling_s"] <= SCHEDULE_S + 0.25
        assert READY_S - 0.06 <= row["readiness_s"] <= READY_S + 0.25
        assert row["total_recovery_s"] == pytest.approx(
            row["rescheduling_s"] + row["readiness_s"], abs=0.002
        )
    assert len({r["replacement"] for r in rec["pods"]}) == 2
    kinds = [f["kind"] for f in _faults(cfg)]
    assert kinds == ["k8s-simultaneous-restarts", "k8s-recovery"]


def test_restarts_forbidden_and_too_few_pods(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    with pytest.raises(
        ActivityFailed, match="asked for 4 pod.s. but only 3 of 3 target pods are Ready"
    ):
        k8s.k8s_simultaneous_restarts(count=4, target_file=target, configuration=cfg)
    assert fake.calls("DELETE") == []
    fake.forbid("delete", "pods")
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_simultaneous_restarts(count=1, target_file=target, configuration=cfg)
    assert "delete pod llm/" in str(err.value) and "permission denied" in str(err.value)
    assert 'cannot delete resource "pods"' in str(err.value) and "\n" not in str(err.value)
    assert len(fake.pods("llm")) == 3


# -- quota cut -------------------------------------------------------------------------------


def _strip_rv(obj: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("resourceVersion")
    return obj


def test_quota_cut_and_byte_for_byte_restore(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    q0 = fake.get("", "resourcequotas", "gpu-quota", "llm")
    d0 = fake.get("apps", "deployments", "vllm", "llm")
    out = k8s.k8s_cut_quota(gpus=1, replicas=1, target_file=target, configuration=cfg)
    assert out["quota"] == {"name": "gpu-quota", "before": "4", "after": "1"}
    assert out["deployment"] == {"name": "vllm", "before": 3, "after": 1}
    patches = fake.calls("PATCH")
    assert [(r.path, r.content_type, r.body) for r in patches] == [
        (
            "/api/v1/namespaces/llm/resourcequotas/gpu-quota",
            "application/merge-patch+json",
            {"spec": {"hard": {"requests.nvidia.com/gpu": "1"}}},
        ),
        (
            "/apis/apps/v1/namespaces/llm/deployments/vllm",
            "application/merge-patch+json",
            {"spec": {"replicas": 1}},
        ),
    ]
    # saved before the cut, exactly as the server sent it
    saved = json.loads((Path(cfg["infer_run_dir"]) / "k8s-state" / "quota-cut.json").read_text())
    assert json.loads(saved["quota"]["raw"]) == q0 and json.loads(saved["deployment"]["raw"]) == d0
    q1 = fake.get("", "resourcequotas", "gpu-quota", "llm")
    assert q1["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "1",
        "limits.nvidia.com/gpu": "4",
        "pods": "20",
    }
    assert fake.get("apps", "deployments", "vllm", "llm")["spec"]["replicas"] == 1
    # a controller touches the status meanwhile; restore must not care
    with fake.lock:
        fake.objects[("", "resourcequotas")][("llm", "gpu-quota")]["status"]["used"] = {
            "requests.nvidia.com/gpu": "1"
        }
    lines = k8s.k8s_restore_quota(target_file=target, configuration=cfg)
    assert lines == ["resourcequota llm/gpu-quota restored", "deployment llm/vllm restored"]
    puts = fake.calls("PUT")
    assert [r.path for r in puts] == [
        "/api/v1/namespaces/llm/resourcequotas/gpu-quota",
        "/apis/apps/v1/namespaces/llm/deployments/vllm",
    ]
    assert puts[0].body == _strip_rv(q0) and puts[1].body == _strip_rv(d0)
    q2 = fake.get("", "resourcequotas", "gpu-quota", "llm")
    d2 = fake.get("apps", "deployments", "vllm", "llm")
    q2.pop("status"), q0.pop("status")
    assert _strip_rv(q2) == _strip_rv(q0) and _strip_rv(d2) == _strip_rv(d0)
    n = len(fake.requests)
    assert k8s.k8s_restore_quota(target_file=target, configuration=cfg) == []  # idempotent
    assert len(fake.requests) == n


def test_quota_cut_absent_object_and_forbidden(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake, quota="no-such-quota")
    with pytest.raises(
        ActivityFailed,
        match=r'get resourcequota llm/no-such-quota: not found: resourcequotas "no-such-quota" not found',
    ):
        k8s.k8s_cut_quota(gpus=1, target_file=target, configuration=cfg)
    assert fake.calls("PATCH") == []
    assert k8s.k8s_restore_quota(target_file=target, configuration=cfg) == []
    target, cfg = _setup(tmp_path, fake)
    fake.forbid("patch", "deployments")
    with pytest.raises(ActivityFailed, match="patch deployment llm/vllm: permission denied"):
        k8s.k8s_cut_quota(gpus=2, replicas=1, target_file=target, configuration=cfg)
    # the quota was cut before the refusal: the rollback restores it
    assert (
        fake.get("", "resourcequotas", "gpu-quota", "llm")["spec"]["hard"][
            "requests.nvidia.com/gpu"
        ]
        == "2"
    )
    k8s.k8s_restore_quota(target_file=target, configuration=cfg)
    assert (
        fake.get("", "resourcequotas", "gpu-quota", "llm")["spec"]["hard"][
            "requests.nvidia.com/gpu"
        ]
        == "4"
    )


# -- node loss -------------------------------------------------------------------------------


def test_drain_evicts_model_pod_skips_daemonset_and_uncordons(
    tmp_path: Path, fake: FakeK8s
) -> None:
    make_cluster(fake, pdb_min_available=2)
    target, cfg = _setup(tmp_path, fake)
    victim = sorted(
        p["metadata"]["name"] for p in fake.pods("llm") if p["spec"]["nodeName"] == "gpu-a"
    )[0]
    out = k8s.k8s_drain_model_node(pod=victim, poll_s=POLL_S, target_file=target, configuration=cfg)
    assert out["node"] == "gpu-a"
    cordon = fake.calls("PATCH", "/api/v1/nodes/gpu-a")
    assert [(r.content_type, r.body) for r in cordon] == [
        ("application/strategic-merge-patch+json", {"spec": {"unschedulable": True}})
    ]
    lists = fake.calls("GET", "/api/v1/pods")
    # the bystander check (issue 13), then the drain itself
    assert [r.query for r in lists] == [{"fieldSelector": "spec.nodeName=gpu-a"}] * 2
    evictions = fake.calls("POST")
    assert [(r.path, r.body) for r in evictions] == [
        (
            f"/api/v1/namespaces/llm/pods/{victim}/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": victim, "namespace": "llm"},
            },
        )
    ]
    assert {(s["pod"], s["reason"]) for s in out["drain"]["skipped"]} == {
        ("node-exporter-gpu-a", "DaemonSet")
    }
    assert fake.get("", "pods", "node-exporter-gpu-a", "monitoring") is not None
    assert fake.get("", "nodes", "gpu-a")["spec"]["unschedulable"] is True
    row = out["recovery"]["pods"][0]
    assert row["pod"] == victim and row["recovered"] and row["node_after"] != "gpu-a"
    assert SCHEDULE_S - 0.01 <= row["rescheduling_s"] <= SCHEDULE_S + 0.25
    assert fake.get("", "pods", row["replacement"], "llm")["spec"]["nodeName"] != "gpu-a"
    assert k8s.k8s_uncordon_node(target_file=target, configuration=cfg) == "node gpu-a uncordoned"
    assert fake.calls("PATCH", "/api/v1/nodes/gpu-a")[-1].body == {"spec": {"unschedulable": None}}
    assert "unschedulable" not in fake.get("", "nodes", "gpu-a")["spec"]
    assert (
        k8s.k8s_uncordon_node(target_file=target, configuration=cfg)
        == "no node cordoned by this run"
    )


def test_drain_pdb_429_reported_after_bounded_retries(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake, pdb_min_available=3)
    target, cfg = _setup(tmp_path, fake)
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_drain_model_node(
            retry_s=0.1, max_attempts=3, deadline_s=5, target_file=target, configuration=cfg
        )
    msg = str(err.value)
    assert "\n" not in msg and "refused eviction after 3 attempt(s)" in msg
    assert "The disruption budget vllm-pdb needs 3 healthy pods and has 3 currently" in msg
    posts = fake.calls("POST")
    assert len(posts) == 3 and all(r.status == 429 and r.path.endswith("/eviction") for r in posts)
    assert len(fake.pods("llm")) == 3
    node = json.loads((Path(cfg["infer_run_dir"]) / "k8s-state" / "node-loss.json").read_text())[
        "node"
    ]
    assert fake.get("", "nodes", node)["spec"]["unschedulable"] is True
    k8s.k8s_uncordon_node(target_file=target, configuration=cfg)
    assert "unschedulable" not in fake.get("", "nodes", node)["spec"]


def test_drain_deadline_bounds_retries(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake, pdb_min_available=3)
    target, cfg = _setup(tmp_path, fake)
    with pytest.raises(ActivityFailed, match="refused eviction after 2 attempt"):
        k8s.k8s_drain_model_node(
            retry_s=0.3, max_attempts=100, deadline_s=0.5, target_file=target, configuration=cfg
        )
    assert len(fake.calls("POST")) == 2
    k8s.k8s_uncordon_node(target_file=target, configuration=cfg)


def test_drain_keeps_a_node_cordoned_before_and_reports_403(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    victim = sorted(
        p["metadata"]["name"] for p in fake.pods("llm") if p["spec"]["nodeName"] == "gpu-b"
    )[0]
    with fake.lock:
        fake.objects[("", "nodes")][("", "gpu-b")]["spec"]["unschedulable"] = True
    fake.forbid("create", "pods/eviction")
    with pytest.raises(ActivityFailed, match=f"evict pod llm/{victim}: permission denied"):
        k8s.k8s_drain_model_node(pod=victim, target_file=target, configuration=cfg)
    line = k8s.k8s_uncordon_node(target_file=target, configuration=cfg)
    assert line == "node gpu-b was unschedulable before the drill; left cordoned"
    assert fake.get("", "nodes", "gpu-b")["spec"]["unschedulable"] is True
    with pytest.raises(ActivityFailed, match="pod.s. ghost not found"):
        k8s.k8s_drain_model_node(pod="ghost", target_file=target, configuration=cfg)


# -- network jitter --------------------------------------------------------------------------


def test_ephemeral_spec_uses_the_tc_builder() -> None:
    spec = ephemeral_netem_spec("c1", 100, 20, 1.5, image="img:1")
    assert spec["command"] == [
        "tc",
        "qdisc",
        "add",
        "dev",
        "eth0",
        "root",
        "netem",
        "delay",
        "100ms",
        "20ms",
        "distribution",
        "normal",
        "loss",
        "1.5%",
    ]
    assert spec["securityContext"]["capabilities"] == {"add": ["NET_ADMIN"]}
    assert ephemeral_netem_spec("c2", 0, 0, remove=True)["command"] == [
        "tc",
        "qdisc",
        "del",
        "dev",
        "eth0",
        "root",
    ]
    with pytest.raises(ValueError):
        ephemeral_netem_spec("c3", -1, 0)


def test_network_jitter_ephemeral_container_and_rollback(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    out = k8s.k8s_network_jitter(
        delay_ms=100, jitter_ms=20, loss_pct=1, target_file=target, configuration=cfg
    )
    pod = out["pod"]
    patch = fake.calls("PATCH")
    assert len(patch) == 1
    assert patch[0].path == f"/api/v1/namespaces/llm/pods/{pod}/ephemeralcontainers"
    assert patch[0].content_type == "application/strategic-merge-patch+json"
    sent = patch[0].body["spec"]["ephemeralContainers"]
    assert len(sent) == 1 and sent[0]["command"] == netem_add_args("eth0", 100, 20, 1)
    assert sent[0]["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    assert [c["name"] for c in fake.get("", "pods", pod, "llm")["spec"]["ephemeralContainers"]] == [
        out["container"]
    ]
    assert fake.get("", "pods", pod, "llm")["spec"]["containers"][0]["name"] == "vllm"  # untouched
    line = k8s.k8s_remove_network_jitter(target_file=target, configuration=cfg)
    assert line.startswith(f"netem qdisc removed from pod llm/{pod}")
    undo = fake.calls("PATCH")[-1].body["spec"]["ephemeralContainers"][0]
    assert undo["name"] == out["container"] + "-undo"
    assert undo["command"] == ["tc", "qdisc", "del", "dev", "eth0", "root"]
    names = [c["name"] for c in fake.get("", "pods", pod, "llm")["spec"]["ephemeralContainers"]]
    assert names == [out["container"], out["container"] + "-undo"]  # cannot be removed: both stay
    assert (
        k8s.k8s_remove_network_jitter(target_file=target, configuration=cfg)
        == "no network jitter injected by this run"
    )


def test_network_jitter_pod_security_tc_failure_and_absent_pod(
    tmp_path: Path, fake: FakeK8s
) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    fake.pod_security = "baseline"
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_network_jitter(target_file=target, configuration=cfg)
    assert "Pod Security admission refuses NET_ADMIN" in str(err.value) and "Chaos Mesh" in str(
        err.value
    )
    assert "\n" not in str(err.value)
    assert "ephemeralContainers" not in fake.pods("llm")[0]["spec"]
    assert (
        k8s.k8s_remove_network_jitter(target_file=target, configuration=cfg)
        == "no network jitter injected by this run"
    )
    fake.pod_security = "privileged"
    fake.ephemeral_result = (2, "Error: Specified qdisc kind is unknown.")
    with pytest.raises(ActivityFailed, match="exited 2: Error: Specified qdisc kind is unknown."):
        k8s.k8s_network_jitter(target_file=target, configuration=cfg)
    assert (
        k8s.k8s_remove_network_jitter(target_file=target, configuration=cfg)
        == "no network jitter injected by this run"
    )
    with pytest.raises(ActivityFailed, match="pod.s. ghost not found"):
        k8s.k8s_network_jitter(pod="ghost", target_file=target, configuration=cfg)
