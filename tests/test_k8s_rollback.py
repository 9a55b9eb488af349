"""``chaos-infer rollback --run-dir``: undo the Kubernetes faults a killed drill left in place.

Against the HTTP-level fake API (tests/fake_k8s.py): faults are injected in-process with the real
actions, the runner's death is simulated by not running their rollbacks (or, in the last test, a
real ``chaos-infer drill run quota-cut`` is SIGKILLed mid-fault), then ``chaos-infer rollback``
runs as a subprocess with KUBECONFIG pointing at the fake. The cluster must be back to its
pre-fault state (exactly, where the action promises it), the saved states gone, and a second
replay a no-op that makes no API call.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from fake_k8s import FakeK8s, make_cluster, write_target

from chaoslib_infer.activities import k8s
from chaoslib_infer.cli import main
from chaoslib_infer.k8s_replay import ROLLBACKS, find_pending, replay
from chaoslib_infer.load.ceiling import sim_engine
from chaoslib_infer.platforms.kubernetes.policy import BLOCK_LABEL

ROOT = Path(__file__).resolve().parent.parent
NS = "llm"
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def _strip_rv(obj: dict[str, Any] | None) -> dict[str, Any]:
    assert obj is not None
    out = copy.deepcopy(obj)
    out["metadata"].pop("resourceVersion", None)
    return out


@pytest.fixture()
def cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FakeK8s, Path, dict[str, str]]]:
    """The fake API (3 model pods, HPA ``vllm``), a target file without ``kubeconfig`` (the
    client finds the fake through $KUBECONFIG, here and in the subprocesses), and that env."""
    with FakeK8s(schedule_delay_s=0.1, ready_delay_s=0.2) as fake:
        make_cluster(fake, hpa="vllm")
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("CHAOS_INFER_K8S_TARGET", raising=False)
        target = write_target(tmp_path / "k8s-target.yaml", kubeconfig, service="vllm")
        doc = yaml.safe_load(target.read_text())
        doc.pop("kubeconfig")
        target.write_text(yaml.safe_dump(doc))
        yield fake, target, dict(os.environ)


def _snapshot(fake: FakeK8s) -> dict[str, Any]:
    return {
        "quota": fake.get("", "resourcequotas", "gpu-quota", NS),
        "deployment": fake.get("apps", "deployments", "vllm", NS),
        "hpa": fake.get("autoscaling", "horizontalpodautoscalers", "vllm", NS),
        "nodes": {n["metadata"]["name"]: n for n in fake.list("", "nodes")},
        "labels": {p["metadata"]["name"]: p["metadata"]["labels"] for p in fake.pods(NS)},
        "netpols": fake.list("networking.k8s.io", "networkpolicies", NS),
    }


def _rollback(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "rollback", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )


def _pod_on(fake: FakeK8s, node: str) -> str:
    return next(
        p["metadata"]["name"] for p in fake.pods(NS, "app=vllm") if p["spec"]["nodeName"] == node
    )


def test_rollback_replays_three_faults_left_in_a_gameday_out_dir(
    tmp_path: Path, cluster: tuple[FakeK8s, Path, dict[str, str]]
) -> None:
    fake, target, env = cluster
    before = _snapshot(fake)
    out = tmp_path / "gameday-out"  # one run dir per drill, as a game day writes them
    cfg = {
        d: {"infer_run_dir": str(out / d)} for d in ("quota-cut", "node-loss", "upstream-timeout")
    }
    tainted, blocked = _pod_on(fake, "gpu-a"), _pod_on(fake, "gpu-b")
    k8s.k8s_cut_quota(
        gpus=1,
        replicas=1,
        hpa_max_replicas=1,
        target_file=str(target),
        configuration=cfg["quota-cut"],
    )
    k8s.k8s_taint_model_node(
        pod=tainted,
        recovery_timeout_s=10,
        poll_s=0.05,
        target_file=str(target),
        configuration=cfg["node-loss"],
    )
    k8s.k8s_block_pod_ingress(pod=blocked, target_file=str(target), configuration=cfg["upstream-timeout"])  # fmt: skip
    # the runner "dies" here: no rollback played. The faults are in place:
    assert (
        fake.get("", "resourcequotas", "gpu-quota", NS)["spec"]["hard"]["requests.nvidia.com/gpu"]
        == "1"
    )
    assert fake.get("apps", "deployments", "vllm", NS)["spec"]["replicas"] == 1
    assert (
        fake.get("autoscaling", "horizontalpodautoscalers", "vllm", NS)["spec"]["maxReplicas"] == 1
    )
    assert [t["key"] for t in fake.get("", "nodes", "gpu-a")["spec"]["taints"]] == [
        "chaos-infer.io/node-loss"
    ]
    assert BLOCK_LABEL in fake.get("", "pods", blocked, NS)["metadata"]["labels"]
    assert len(fake.list("networking.k8s.io", "networkpolicies", NS)) == 1  # fmt: skip
    states = sorted(str(p.relative_to(out)) for p in out.glob("*/k8s-state/*.json"))
    assert states == [
        "node-loss/k8s-state/node-taint.json",
        "quota-cut/k8s-state/quota-cut.json",
        "upstream-timeout/k8s-state/upstream-ingress.json",
    ]
    # the target is recorded with each saved state, so the replay needs no --target
    for path in out.glob("*/k8s-state/*.json"):
        assert json.loads(path.read_text())["k8s_target"] == {
            "file": str(target.resolve()),
            "context": "kind-lab",
            "namespace": NS,
        }

    # --dry-run: lists the three, touches nothing (no API call, files kept)
    n = len(fake.requests)
    dry = _rollback(env, "--run-dir", str(out), "--dry-run")
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    lines = dry.stdout.splitlines()
    assert [ln.split(": ")[2] for ln in lines[:3]] == [
        "upstream-ingress",
        "node-taint",
        "quota-cut",
    ]
    assert all(ln.startswith(f"would undo: {out.resolve()}/") for ln in lines[:3])
    assert "would run k8s_restore_pod_ingress" in lines[0] and "gpu-a tainted" in lines[1]
    assert (
        lines[3]
        == f"rollback: dry run: 3 Kubernetes fault(s) pending under {out.resolve()}; nothing was changed"
    )
    assert len(fake.requests) == n
    assert len(list(out.glob("*/k8s-state/*.json"))) == 3

    # the replay: one line per rollback, exit 0
    p = _rollback(env, "--run-dir", str(out))
    assert "Traceback" not in p.stdout + p.stderr
    assert p.returncode == 0 and p.stderr == "", p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 4 and all(ln.startswith("undone: ") for ln in lines[:3]), p.stdout
    assert f"k8s_restore_pod_ingress: networkpolicy {NS}/chaos-infer-block-" in lines[0]
    assert f"labels of pod {NS}/{blocked} restored" in lines[0]
    assert "taint chaos-infer.io/node-loss:NoExecute removed from node gpu-a" in lines[1]
    assert "resourcequota llm/gpu-quota restored" in lines[2]
    assert lines[3] == f"rollback: 3 of 3 Kubernetes fault(s) undone under {out.resolve()}"
    # the cluster is back: the saved objects exactly (PUT back as stored), the taint gone, the
    # labels exactly as stored, the policy deleted
    after = _snapshot(fake)
    for key in ("quota", "deployment", "hpa"):
        assert _strip_rv(after[key]) == _strip_rv(before[key]), key
    assert _strip_rv(after["nodes"]["gpu-a"]) == _strip_rv(before["nodes"]["gpu-a"])
    assert after["labels"][blocked] == before["labels"][blocked]
    assert after["netpols"] == [] == before["netpols"]
    # (the pod evicted by the NoExecute taint was replaced by its ReplicaSet: no undo needed)
    assert tainted not in after["labels"] and len(fake.pods(NS, "app=vllm")) == 3
    assert list(out.glob("*/k8s-state/*")) == []
    for d in cfg:
        log = [json.loads(x) for x in (out / d / "faults.jsonl").read_text().splitlines()]
        assert log[-1]["phase"] == "cleared", d

    # a second replay finds nothing: exit 0 and no API call at all
    n = len(fake.requests)
    again = _rollback(env, "--run-dir", str(out))
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout.strip() == f"rollback: no Kubernetes fault pending under {out.resolve()}"
    assert len(fake.requests) == n


def test_rollback_failures_are_one_line_each_and_keep_the_state(
    tmp_path: Path, cluster: tuple[FakeK8s, Path, dict[str, str]]
) -> None:
    fake, target, env = cluster
    q0 = fake.get("", "resourcequotas", "gpu-quota", NS)
    out = tmp_path / "out"
    k8s.k8s_cut_quota(gpus=1, target_file=str(target), configuration={"infer_run_dir": str(out / "quota-cut")})  # fmt: skip
    # a state saved before the target was recorded (older run), and a file of no known kind
    old = out / "node-loss" / "k8s-state"
    old.mkdir(parents=True)
    (old / "node-loss.json").write_text(json.dumps({"node": "gpu-b", "was_unschedulable": False}))
    (out / "other" / "k8s-state").mkdir(parents=True)
    (out / "other" / "k8s-state" / "chaos-mesh.json").write_text("{}")
    fake.forbid("update", "resourcequotas")
    n = len(fake.requests)

    r = CliRunner().invoke(main, ["rollback", "--run-dir", str(out)], catch_exceptions=False)
    assert r.exit_code == 1
    errors = r.stderr.splitlines()
    assert len(errors) == 3 and all(e.startswith("chaos-infer: error: rollback: ") for e in errors)
    text = "\n".join(errors)
    assert "unknown fault kind 'chaos-mesh'" in text
    assert (
        "node-loss: node gpu-b cordoned: no target recorded in node-loss.json; pass --target"
        in text
    )
    assert (
        "k8s_restore_quota failed: replace resourcequota llm/gpu-quota: permission denied" in text
    )
    assert r.stdout.strip() == f"rollback: 0 of 3 Kubernetes fault(s) undone under {out.resolve()}"
    assert (out / "quota-cut" / "k8s-state" / "quota-cut.json").exists()  # kept for a retry
    assert (old / "node-loss.json").exists()
    assert (
        fake.get("", "resourcequotas", "gpu-quota", NS)["spec"]["hard"]["requests.nvidia.com/gpu"]
        == "1"
    )
    tried = [(q.method, q.path, q.status) for q in fake.requests[n:] if q.method in MUTATING]
    assert tried == [("PUT", f"/api/v1/namespaces/{NS}/resourcequotas/gpu-quota", 403)]

    # permission granted, --target for the old state, the unknown file removed by hand: all done
    fake.forbidden = set()
    (out / "other" / "k8s-state" / "chaos-mesh.json").unlink()
    r = CliRunner().invoke(
        main, ["rollback", "--run-dir", str(out), "--target", str(target)], catch_exceptions=False
    )
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert (
        r.stdout.splitlines()[-1]
        == f"rollback: 2 of 2 Kubernetes fault(s) undone under {out.resolve()}"
    )
    assert _strip_rv(fake.get("", "resourcequotas", "gpu-quota", NS)) == _strip_rv(q0)
    assert find_pending(out) == []

    # bad input: one line, exit 2
    r = CliRunner().invoke(main, ["rollback", "--run-dir", str(tmp_path / "nope")])
    assert r.exit_code == 2 and r.stderr.strip().endswith("no such folder")


def test_replay_refuses_a_target_that_now_names_another_context(
    tmp_path: Path, cluster: tuple[FakeK8s, Path, dict[str, str]]
) -> None:
    fake, target, _ = cluster
    run = tmp_path / "run"
    k8s.k8s_taint_model_node(effect="NoSchedule", target_file=str(target), configuration={"infer_run_dir": str(run)})  # fmt: skip
    path = run / "k8s-state" / "node-taint.json"
    state = json.loads(path.read_text())
    state["k8s_target"]["context"] = "kind-prod"  # injected while the kubeconfig said kind-prod
    path.write_text(json.dumps(state))
    n = len(fake.requests)
    result = replay(run)
    (line,) = result.failed
    assert (
        "now resolves to context 'kind-lab', but the fault was injected in context 'kind-prod'"
        in line
    )
    assert result.undone == [] and len(fake.requests) == n and path.exists()
    assert set(ROLLBACKS.values()) <= set(k8s.__all__)  # every kind maps to a real rollback


def test_sigkilled_quota_cut_drill_is_restored_by_rollback(
    tmp_path: Path, cluster: tuple[FakeK8s, Path, dict[str, str]]
) -> None:
    fake, target, env = cluster
    before = _snapshot(fake)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "name": "k8s-kill",
                "platform": "kubernetes",
                "drills": [
                    {
                        "name": "quota-cut",
                        "experiment": str(ROOT / "experiments" / "k8s" / "quota-cut.yaml"),
                        "vars": {"load_warmup_s": 2, "window_s": 2, "load_rate_rps": 10, "hold_s": 60},
                    }
                ],
            }
        )
    )  # fmt: skip
    out = tmp_path / "out"
    run_dir = out / "quota-cut"
    with sim_engine(zero_latency=False, itl_s=0.002, output_tokens=8) as url:
        doc = yaml.safe_load(target.read_text())
        target.write_text(yaml.safe_dump({**doc, "url": url + "/v1"}))
        runner = subprocess.Popen(
            [sys.executable, "-m", "chaoslib_infer.cli", "drill", "run", "quota-cut"]
            + ["--target", str(target), "--out", str(out)],
            env={**env, "CHAOS_INFER_K8S_PLAN": str(plan)},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        load_pid = None
        try:
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and runner.poll() is None:
                hpa = fake.get("autoscaling", "horizontalpodautoscalers", "vllm", NS) or {}
                if (run_dir / "k8s-state" / "quota-cut.json").exists() and hpa["spec"][
                    "maxReplicas"
                ] == 2:
                    break  # saved, then cut (quota, deployment, HPA last): the fault is in place
                time.sleep(0.05)
            else:
                pytest.fail(f"the cut never appeared (runner exit {runner.poll()})")
            os.killpg(runner.pid, signal.SIGKILL)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=10)
            pid_file = run_dir / "load.pid"  # the load runs in its own session: end it too
            if pid_file.exists():
                load_pid = int(pid_file.read_text())
                cmdline = (
                    Path(f"/proc/{load_pid}/cmdline").read_bytes()
                    if Path(f"/proc/{load_pid}").exists()
                    else b""
                )
                if str(run_dir).encode() in cmdline:
                    os.killpg(load_pid, signal.SIGKILL)
    assert runner.returncode == -signal.SIGKILL and load_pid is not None
    # killed mid-fault: its rollback never ran, the cluster is still cut
    assert fake.calls("PUT") == []
    assert fake.get("apps", "deployments", "vllm", NS)["spec"]["replicas"] == 2
    assert json.loads((out / "summary.json").read_text())["complete"] is False

    p = _rollback(env, "--run-dir", str(run_dir))
    assert "Traceback" not in p.stdout + p.stderr
    assert p.returncode == 0 and p.stderr == "", p.stdout + p.stderr
    (line, last) = p.stdout.splitlines()
    assert (
        line.startswith(f"undone: {run_dir.resolve()}: quota-cut: ")
        and "k8s_restore_quota: " in line
    )
    assert last == f"rollback: 1 of 1 Kubernetes fault(s) undone under {run_dir.resolve()}"
    after = _snapshot(fake)
    for key in ("quota", "deployment", "hpa"):
        assert _strip_rv(after[key]) == _strip_rv(before[key]), key
    assert sorted(r.path.rsplit("/", 2)[1] for r in fake.calls("PUT")) == [
        "deployments", "horizontalpodautoscalers", "resourcequotas",
    ]  # fmt: skip
    assert not (run_dir / "k8s-state" / "quota-cut.json").exists()
    again = _rollback(env, "--run-dir", str(out))
    assert again.returncode == 0 and "no Kubernetes fault pending" in again.stdout


def test_lab_rollback_dry_run_lists_the_ledger_and_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "lab"
    state.mkdir()
    reps = [
        {"name": n, "port": 2 + i, "cgroup": "/nonexistent"} for i, n in enumerate(["r0", "r1"])
    ]
    (state / "lab.json").write_text(json.dumps({"lab_id": "t1", "replicas": reps}))
    records = [
        {
            "kind": "quota-cut",
            "id": "quota-cut-0000abcd",
            "stopped": ["r1"],
            "ttl_s": 120,
            "module": "chaoslib_infer.lab.scaling",
        },
        {"kind": "oom-kill", "replica": "r1", "pid": 4194303},
    ]
    (state / "faults.json").write_text(json.dumps(records))
    r = CliRunner().invoke(main, ["rollback", "--state-dir", str(state), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "would undo: quota-cut quota-cut-0000abcd (ttl 120 s)",
        "would undo: oom-kill 4194303 on r1",
        f"rollback: dry run: 2 fault(s) pending in {state}; nothing was changed",
    ]
    assert json.loads((state / "faults.json").read_text()) == records
    # with --run-dir alone the lab ledger is left alone; with both, both are looked at
    empty = tmp_path / "run"
    empty.mkdir()
    r = CliRunner().invoke(main, ["rollback", "--run-dir", str(empty), "--dry-run"])
    assert r.exit_code == 0 and "would undo: quota-cut" not in r.stdout
    r = CliRunner().invoke(
        main, ["rollback", "--run-dir", str(empty), "--state-dir", str(state), "--dry-run"]
    )
    assert r.exit_code == 0 and "would undo: quota-cut quota-cut-0000abcd" in r.stdout
    assert "no Kubernetes fault pending" in r.stdout
