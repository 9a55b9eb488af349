"""Issue 13: a node-level fault is refused, before any change, on a node that also runs pods of
namespaces the drill may not touch (DaemonSet pods excepted), unless the operator opts in.

Against the HTTP-level fake API server (``tests/fake_k8s.py``); every request is recorded, so
"before any change" is checked as "no write request at all"."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed
from fake_k8s import FakeK8s, _model_pod, make_cluster, write_target

from chaoslib_infer.activities import k8s

POLL_S = 0.05
ACTIONS = {
    "drain": k8s.k8s_drain_model_node,
    "taint": k8s.k8s_taint_model_node,
    "delete": k8s.k8s_delete_model_node,
}


@pytest.fixture()
def fake():
    with FakeK8s(schedule_delay_s=0.1, ready_delay_s=0.1) as f:
        yield f


def _setup(tmp_path: Path, fake: FakeK8s) -> tuple[str, dict[str, Any], str]:
    make_cluster(fake)
    kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
    target = str(write_target(tmp_path / "target.yaml", kc))
    victim = sorted(
        p["metadata"]["name"] for p in fake.pods("llm") if p["spec"]["nodeName"] == "gpu-a"
    )[0]
    return target, {"infer_run_dir": str(tmp_path / "run")}, victim


def _bystander(
    fake: FakeK8s, ns: str, name: str, node: str = "gpu-a", daemonset: bool = False
) -> None:
    pod = copy.deepcopy(_model_pod(name, node, "other-5d6f7", ns=ns))
    pod["metadata"]["labels"] = {"app": "other"}
    if daemonset:
        pod["metadata"]["ownerReferences"][0].update(kind="DaemonSet", name="agent", uid="uid-ds")
    fake.put("", "pods", pod)


def _writes(fake: FakeK8s) -> list[str]:
    return [f"{r.method} {r.path}" for r in fake.calls() if r.method not in ("GET",)]


@pytest.mark.parametrize("variant", sorted(ACTIONS))
@pytest.mark.parametrize("ns", ["team-b", "kube-system", "llm-prod"])
def test_bystander_in_another_namespace_refuses_before_any_change(
    tmp_path: Path, fake: FakeK8s, variant: str, ns: str
) -> None:
    target, cfg, victim = _setup(tmp_path, fake)
    _bystander(fake, ns, "their-app-0")
    with pytest.raises(ActivityFailed) as err:
        ACTIONS[variant](pod=victim, poll_s=POLL_S, target_file=target, configuration=cfg)
    msg = str(err.value)
    assert "\n" not in msg and f"{ns}/their-app-0" in msg and "node gpu-a" in msg
    assert "allow_bystanders" in msg and "nothing changed" in msg
    assert _writes(fake) == []  # no cordon, taint, eviction or delete
    assert not (Path(cfg["infer_run_dir"]) / "k8s-state").exists() or not list(
        (Path(cfg["infer_run_dir"]) / "k8s-state").iterdir()
    )
    assert "unschedulable" not in fake.get("", "nodes", "gpu-a")["spec"]
    assert fake.get("", "pods", "their-app-0", ns) is not None


@pytest.mark.parametrize("variant", sorted(ACTIONS))
def test_daemonset_pods_and_other_nodes_do_not_refuse(
    tmp_path: Path, fake: FakeK8s, variant: str
) -> None:
    target, cfg, victim = _setup(tmp_path, fake)
    _bystander(fake, "team-b", "agent-gpu-a", daemonset=True)  # a DaemonSet pod: excepted
    _bystander(fake, "team-b", "their-app-0", node="gpu-b")  # another node: not hit
    out = ACTIONS[variant](pod=victim, poll_s=POLL_S, target_file=target, configuration=cfg)
    assert out["node"] == "gpu-a"
    assert _writes(fake)  # the fault was injected


def test_operator_opt_in_accepts_the_blast_radius(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, victim = _setup(tmp_path, fake)
    _bystander(fake, "team-b", "their-app-0")
    out = k8s.k8s_drain_model_node(
        pod=victim, poll_s=POLL_S, allow_bystanders=True, target_file=target, configuration=cfg
    )
    assert out["node"] == "gpu-a"
    evicted = {(e["namespace"], e["pod"]) for e in out["drain"]["evicted"]}
    assert ("team-b", "their-app-0") in evicted
    assert k8s.k8s_uncordon_node(target_file=target, configuration=cfg) == "node gpu-a uncordoned"


def test_allowed_namespace_must_be_the_operators_too(
    tmp_path: Path, fake: FakeK8s, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod of a namespace the target file allows but the operator does not is a bystander."""
    target, cfg, victim = _setup(tmp_path, fake)
    text = Path(target).read_text().replace("namespaces: [llm]", "namespaces: [llm, llm-batch]")
    text = (
        text.replace("- llm\n", "- llm\n  - llm-batch\n")
        if "namespaces: [llm" not in text
        else text
    )
    Path(target).write_text(text)
    _bystander(fake, "llm-batch", "batch-0")
    with pytest.raises(ActivityFailed, match="llm-batch/batch-0"):
        k8s.k8s_taint_model_node(pod=victim, poll_s=POLL_S, target_file=target, configuration=cfg)
    assert _writes(fake) == []
    cfg["infer_allow_namespaces"] = "llm-batch"  # the operator allows it: no longer a bystander
    out = k8s.k8s_taint_model_node(pod=victim, poll_s=POLL_S, target_file=target, configuration=cfg)
    assert out["node"] == "gpu-a"
    k8s.k8s_remove_node_taint(target_file=target, configuration=cfg)
