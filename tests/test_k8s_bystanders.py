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


# ---- the command line's preflight: refused before anything starts ---------------------------
def _first_ready_node(fake: FakeK8s) -> str:
    """The node of the pod a node-level action picks by default (the first Ready target pod)."""
    first = sorted(p["metadata"]["name"] for p in fake.pods("llm", "app=vllm"))[0]
    return str(fake.get("", "pods", first, "llm")["spec"]["nodeName"])


def _plan(
    tmp_path: Path, drill_vars: dict[str, Any] | None = None, experiment: Path | None = None
) -> Path:
    import yaml

    root = Path(__file__).resolve().parent.parent
    exp = experiment or root / "experiments/k8s/node-loss.yaml"
    drill = {"name": "node-loss", "experiment": str(exp)}
    if drill_vars:
        drill["vars"] = drill_vars
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "n", "platform": "kubernetes", "drills": [drill]}))
    return plan


@pytest.mark.parametrize("command", ["gameday", "drill"])
def test_cli_preflight_refuses_a_shared_node_with_one_line_before_anything_starts(
    tmp_path: Path, fake: FakeK8s, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from chaoslib_infer.cli import main

    target, _cfg, _victim = _setup(tmp_path, fake)
    node = _first_ready_node(fake)
    _bystander(fake, "team-b", "their-app-0", node=node)
    out = tmp_path / "out"
    plan = _plan(tmp_path)
    if command == "gameday":
        args = ["gameday", str(plan), "--target", target, "--out", str(out)]
    else:
        monkeypatch.setenv("CHAOS_INFER_K8S_PLAN", str(plan))
        args = ["drill", "run", "node-loss", "--target", target, "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.splitlines()
    assert line.startswith("chaos-infer: error: ") and "Traceback" not in r.output
    assert "drill node-loss (k8s_drain_model_node)" in line and "no drill started" in line
    assert (
        f"node {node} also runs 1 pod(s) outside the allowed namespaces: team-b/their-app-0" in line
    )
    assert "allow_bystanders" in line
    assert not out.exists()  # no folder, no load, no lab
    assert _writes(fake) == []  # nothing changed on the cluster
    reads = [r.path.split("?")[0] for r in fake.calls("GET")]
    assert reads.count("/api/v1/pods") == 1  # one list of the node's pods, cluster-wide


def test_preflight_follows_the_drill_opt_in_and_the_daemonset_exception(
    tmp_path: Path, fake: FakeK8s
) -> None:
    from chaoslib_infer.errors import ConfigError
    from chaoslib_infer.k8s_preflight import check_plan, node_fault_calls
    from chaoslib_infer.plan import load_plan
    from chaoslib_infer.platforms.kubernetes.target import load_target

    target_file, _cfg, _victim = _setup(tmp_path, fake)
    target = load_target(target_file)
    node = _first_ready_node(fake)
    _bystander(fake, "team-b", "agent-0", node=node, daemonset=True)
    assert check_plan(load_plan(_plan(tmp_path)), target) == 1  # checked: a DaemonSet pod only
    _bystander(fake, "team-b", "their-app-0", node=node)
    with pytest.raises(ConfigError, match="team-b/their-app-0"):
        check_plan(load_plan(_plan(tmp_path)), target)
    opted = load_plan(_plan(tmp_path, {"allow_bystanders": True}))  # the operator's opt-in
    assert node_fault_calls(opted)[0][2]["allow_bystanders"] is True
    n = len(fake.requests)
    assert check_plan(opted, target) == 0 and len(fake.requests) == n  # not asked: no API call
    plain = load_plan(Path(__file__).resolve().parent.parent / "drills" / "gameday-k8s.yaml")
    assert [c[:2] for c in node_fault_calls(plain)] == [("node-loss", "k8s_drain_model_node")]
    # the opt-in variants, chosen by naming their experiment in the plan, are checked the same
    variants = Path(__file__).resolve().parent.parent / "experiments/k8s/variants"
    for name, func in (("taint", "k8s_taint_model_node"), ("delete", "k8s_delete_model_node")):
        chosen = load_plan(_plan(tmp_path, experiment=variants / f"node-loss-{name}.yaml"))
        assert [c[:2] for c in node_fault_calls(chosen)] == [("node-loss", func)]
        with pytest.raises(ConfigError, match=rf"\({func}\).*team-b/their-app-0"):
            check_plan(chosen, target)
    assert _writes(fake) == []


def test_preflight_sees_a_node_fault_named_by_its_room(tmp_path: Path, fake: FakeK8s) -> None:
    """The shipped experiment names node-loss's room (``chaoslib_infer.drills.node_loss.k8s``);
    an older one names the ``activities.k8s`` alias: the bystander preflight refuses both."""

    from chaoslib_infer.errors import ConfigError
    from chaoslib_infer.k8s_preflight import check_plan, node_fault_calls
    from chaoslib_infer.plan import load_plan
    from chaoslib_infer.platforms.kubernetes.target import load_target

    root = Path(__file__).resolve().parent.parent
    text = (root / "experiments/k8s/node-loss.yaml").read_text()
    assert "module: chaoslib_infer.drills.node_loss.k8s\n" in text
    exp = tmp_path / "node-loss.yaml"
    exp.write_text(
        text.replace(
            "module: chaoslib_infer.drills.node_loss.k8s\n",
            "module: chaoslib_infer.activities.k8s\n",
        )
    )
    plan = _plan(tmp_path, experiment=exp)
    assert [c[:2] for c in node_fault_calls(load_plan(plan))] == [
        ("node-loss", "k8s_drain_model_node")
    ]
    target_file, _cfg, _victim = _setup(tmp_path, fake)
    _bystander(fake, "team-b", "their-app-0", node=_first_ready_node(fake))
    with pytest.raises(ConfigError, match="team-b/their-app-0"):
        check_plan(load_plan(plan), load_target(target_file))
    assert _writes(fake) == []
