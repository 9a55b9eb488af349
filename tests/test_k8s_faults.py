"""Issue 4's Kubernetes fault actions against the HTTP-level fake API (and, for the in-container
programs, real processes in a PID namespace and a memory cgroup): exact requests, state after the
action and after the rollback, one-line errors."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed
from fake_k8s import ExecCall, ExecReply, FakeK8s, make_cluster, write_target
from k8s_sim import (
    LocalContainer,
    SimContainer,
    kubelet_restart,
    running_as_root_with_memory_cgroup,
    set_container,
)
from labutil import put_hpa

from chaoslib_infer.activities import k8s
from chaoslib_infer.platforms.kubernetes import K8sError, clients
from chaoslib_infer.platforms.kubernetes import scripts as S
from chaoslib_infer.platforms.kubernetes.exec import exec_in_container, run_script
from chaoslib_infer.platforms.kubernetes.freeze import Proc, resolve_targets
from chaoslib_infer.platforms.kubernetes.policy import BLOCK_LABEL, policy_body

SCHEDULE_S, READY_S, POLL_S = 0.2, 0.3, 0.05
MERGE = "application/merge-patch+json"


@pytest.fixture()
def fake():
    with FakeK8s(schedule_delay_s=SCHEDULE_S, ready_delay_s=READY_S) as f:
        yield f


def _setup(tmp_path: Path, fake: FakeK8s, **target: Any) -> tuple[str, dict[str, Any]]:
    kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
    path = write_target(tmp_path / "target.yaml", kc, **target)
    return str(path), {"infer_run_dir": str(tmp_path / "run")}


def _state(cfg: dict[str, Any], kind: str) -> dict[str, Any] | None:
    path = Path(cfg["infer_run_dir"]) / "k8s-state" / f"{kind}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _faults(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    text = (Path(cfg["infer_run_dir"]) / "faults.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _cluster_and_pod(tmp_path: Path, fake: FakeK8s) -> tuple[str, dict[str, Any], str]:
    """The default fake cluster, a target and configuration for it (:func:`_setup`), and the
    name of its first model pod."""
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    return target, cfg, _first_pod(fake)


def _again_sends_nothing(
    fake: FakeK8s, activity: Callable[..., Any], target: str, cfg: dict[str, Any]
) -> Any:
    """Call the rollback ``activity`` again; it sends no request to the API. Returns its answer."""
    n = len(fake.requests)
    answer = activity(target_file=target, configuration=cfg)
    assert len(fake.requests) == n
    return answer


def _first_pod(fake: FakeK8s) -> str:
    return sorted(p["metadata"]["name"] for p in fake.pods("llm", "app=vllm"))[0]


def _strip_rv(obj: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("resourceVersion", None)
    return obj


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# -- exec transport -----------------------------------------------------------------------------


def test_exec_channels_exit_codes_interpreter_fallback_and_errors(
    tmp_path: Path, fake: FakeK8s
) -> None:
    from kubernetes import client

    make_cluster(fake)
    core = client.CoreV1Api(clients(str(fake.write_kubeconfig(tmp_path / "kc")), "kind-lab"))
    pod = _first_pod(fake)
    replies = {
        "ok": ExecReply("out\n", "warn\n", 0),
        "fail": ExecReply("", "boom\n", 3),
        "nf": ExecReply.not_found("python3"),
    }
    fake.exec_handler = lambda call: replies[call.command[-1]]
    ok = exec_in_container(core, "llm", pod, "vllm", ["sh", "-c", "x", "sh", "ok"])
    assert (ok.stdout, ok.stderr, ok.exit_code, ok.message, ok.not_found) == (
        "out\n",
        "warn\n",
        0,
        "",
        False,
    )
    fail = exec_in_container(core, "llm", pod, "vllm", ["sh", "-c", "x", "sh", "fail"])
    assert fail.exit_code == 3 and "exit code 3" in fail.message and fail.stderr == "boom\n"
    nf = exec_in_container(core, "llm", pod, "vllm", ["python3", "-c", "x", "nf"])
    assert nf.exit_code is None and nf.not_found and "executable file not found" in nf.message
    req = fake.calls("GET", "/exec")[0]
    assert req.path == f"/api/v1/namespaces/llm/pods/{pod}/exec" and req.status == 101
    assert req.command == ["sh", "-c", "x", "sh", "ok"]
    assert {k: req.query[k] for k in ("container", "stdin", "stdout", "stderr", "tty")} == {
        "container": "vllm",
        "stdin": "false",
        "stdout": "true",
        "stderr": "true",
        "tty": "false",
    }
    assert (req.verb, req.also_verbs, req.resource) == ("get", ("create",), "pods/exec")
    # no python3 in the image: the sh version of the same program runs
    sim = SimContainer(pod, has_python=False)
    fake.exec_handler = sim
    n = len(fake.calls("GET", "/exec"))
    used, res = run_script(core, "llm", pod, "vllm", S.PROBE, [])
    sent = [r.command for r in fake.calls("GET", "/exec")[n:]]
    assert used == "sh" and [c[0] for c in sent] == ["python3", "sh"]
    assert sent[1] == ["sh", "-c", S.PROBE["sh"], "sh"] and res.lines[0].startswith("self ")
    # refusals: one line each, with the cause
    for verb in ("get", "create"):  # the WebSocket upgrade needs both (Kubernetes 1.35+)
        fake.forbidden = {(verb, "pods/exec")}
        with pytest.raises(K8sError) as err:
            exec_in_container(core, "llm", pod, "vllm", ["true"])
        assert err.value.status == 403 and f'cannot {verb} resource "pods/exec"' in str(err.value)
        assert "\n" not in str(err.value)
    fake.forbidden = set()
    # a POST upgrade (SPDY-era clients, kubectl before 1.30) is served too, authorized as create
    import base64
    import os
    import socket

    host, port = fake.url.rsplit("/", 1)[-1].split(":")
    key = base64.b64encode(os.urandom(16)).decode()
    fake.exec_handler = lambda call: ExecReply("posted\n")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            f"POST /api/v1/namespaces/llm/pods/{pod}/exec?command=true&container=vllm HTTP/1.1\r\n"
            f"Host: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n".encode()
        )
        data = b""
        while b'"status": "Success"}' not in data:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 101") and b"\x01posted\n" in data
    assert b"Sec-WebSocket-Protocol: v4.channel.k8s.io" in data
    post = fake.calls("POST", "/exec")[-1]
    assert (post.verb, post.also_verbs, post.command, post.status) == ("create", (), ["true"], 101)
    with pytest.raises(K8sError, match=r'exec true in pod llm/ghost .*not found: pods "ghost"'):
        exec_in_container(core, "llm", "ghost", "vllm", ["true"])
    with pytest.raises(K8sError, match="HTTP 400: container nope is not valid for pod"):
        exec_in_container(core, "llm", pod, "nope", ["true"])


# -- oom-kill -----------------------------------------------------------------------------------


def test_oom_kill_figures_against_the_kubelet_and_rollback(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    truth: list[dict[str, float]] = []
    down_s, ready_s = 0.3, 0.4

    def on_hog(mb: int) -> None:  # the kernel kills the server 0.2 s after the hog starts
        import threading

        threading.Timer(
            0.2,
            lambda: truth.append(
                kubelet_restart(fake, "llm", pod, "vllm", down_s=down_s, ready_s=ready_s)
            ),
        ).start()

    sim = SimContainer(pod, on_hog=on_hog)
    fake.exec_handler = sim
    out = k8s.k8s_oom_kill(poll_s=POLL_S, timeout_s=10, target_file=target, configuration=cfg)
    mb = math.ceil(24 * 1024 * 1.1) + 64  # limit 24Gi + 10% + 64 MiB
    assert sim.calls == [("python3", "hog", [str(mb), "40"])]
    execs = fake.calls("GET", "/exec")
    assert [r.command for r in execs] == [["python3", "-c", S.HOG["python3"], str(mb), "40"]]
    assert out["pod"] == pod and out["hog_mb"] == mb and out["memory_limit_bytes"] == 24 << 30
    assert (out["reason"], out["exit_code"]) == ("OOMKilled", 137)
    assert (out["restart_count_before"], out["restart_count_after"]) == (0, 1)
    gt = truth[0]
    # observed by polling: after the event, within one poll (+ slack for the 2-core box)
    for mine, real in (
        ("oom_at", "died_at"),
        ("running_at", "running_at"),
        ("ready_at", "ready_at"),
    ):
        assert 0 <= out[mine] - gt[real] <= POLL_S + 0.1, (mine, out[mine] - gt[real])
    assert out["restart_s"] == pytest.approx(gt["running_at"] - gt["died_at"], abs=POLL_S + 0.1)
    assert out["ready_s"] == pytest.approx(gt["ready_at"] - gt["died_at"], abs=POLL_S + 0.1)
    assert out["warmup_ttft_s"] is None and "not to one pod" in out["warmup_omitted"]
    assert [f["kind"] for f in _faults(cfg)] == ["k8s-oom-kill", "k8s-oom-recovery"]
    assert _state(cfg, "oom-kill")["hog"]["pid"] == out["hog"]["pid"]
    # rollback: the container restarted (new container id), the hog died with it: no exec
    line = k8s.k8s_stop_memory_hog(target_file=target, configuration=cfg)
    assert line == f"container vllm of pod llm/{pod} restarted; the hog died with it"
    assert len(fake.calls("GET", "/exec")) == 1 and _state(cfg, "oom-kill") is None
    assert _again_sends_nothing(fake, k8s.k8s_stop_memory_hog, target, cfg) == (
        "no memory hog started by this run"
    )


def test_oom_kill_timeout_leaves_the_hog_to_the_rollback(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    sim = SimContainer(pod)  # a container that never reaches its limit
    fake.exec_handler = sim
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_oom_kill(
            hog_mb=200, timeout_s=0.5, poll_s=POLL_S, target_file=target, configuration=cfg
        )
    msg = _one_line(err)
    assert f"container vllm of pod llm/{pod} was not OOM-killed within 0.5 s (hog 200 MiB" in msg
    assert "k8s_stop_memory_hog" in msg
    hog = _state(cfg, "oom-kill")["hog"]
    assert hog["pid"] in sim.procs  # still running
    line = k8s.k8s_stop_memory_hog(target_file=target, configuration=cfg)
    assert line == f"memory hog {hog['pid']} killed in pod llm/{pod}"
    assert sim.calls[-1] == ("python3", "kill", [str(hog["pid"]), hog["start"]])
    assert hog["pid"] not in sim.procs and _state(cfg, "oom-kill") is None
    assert sim.procs[7]["state"] == "S"  # the server was never touched
    _again_sends_nothing(fake, k8s.k8s_stop_memory_hog, target, cfg)


def test_oom_kill_refusals_and_a_restart_for_another_reason(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    fake.exec_handler = SimContainer(pod)
    with pytest.raises(ActivityFailed, match="hog_mb must be >= 1"):
        k8s.k8s_oom_kill(hog_mb=0, target_file=target, configuration=cfg)
    fake.forbid("create", "pods/exec")
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_oom_kill(target_file=target, configuration=cfg)
    assert "permission denied" in _one_line(err) and 'cannot create resource "pods/exec"' in str(
        err.value
    )
    assert _state(cfg, "oom-kill") is None  # nothing started, nothing to roll back
    fake.forbidden = set()
    with fake.lock:  # a container without a memory limit: refused before any exec
        spec = fake.objects[("", "pods")][("llm", pod)]["spec"]["containers"][0]
        spec["resources"]["limits"].pop("memory")
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_oom_kill(pod=pod, target_file=target, configuration=cfg)
    assert "has no memory limit" in _one_line(err) and "refusing" in str(err.value)
    assert fake.calls("GET", "/exec")[-1].status == 403  # only the forbidden attempt above
    with pytest.raises(ActivityFailed, match="pod.s. ghost not found"):
        k8s.k8s_oom_kill(pod="ghost", target_file=target, configuration=cfg)
    other = sorted(p["metadata"]["name"] for p in fake.pods("llm", "app=vllm"))[1]
    fake.exec_handler = SimContainer(
        other, on_hog=lambda mb: kubelet_restart(fake, "llm", other, reason="Error", exit_code=1)
    )
    with pytest.raises(
        ActivityFailed, match="lastState.terminated.reason is 'Error' .exit 1., not 'OOMKilled'"
    ):
        k8s.k8s_oom_kill(
            pod=other, poll_s=POLL_S, timeout_s=5, target_file=target, configuration=cfg
        )
    k8s.k8s_stop_memory_hog(target_file=target, configuration=cfg)


# -- upstream-timeout: freeze -------------------------------------------------------------------


def _procs(*rows: tuple[int, int, str, bool]) -> list[Proc]:
    return [Proc(pid, ppid, str(pid * 10), "S", same, comm) for pid, ppid, comm, same in rows]


def test_resolve_targets_pid1_rules() -> None:
    tini = _procs(
        (1, 0, "tini", True),
        (7, 1, "python3", True),
        (9, 7, "python3", True),
        (40, 0, "python3", True),
    )
    assert [p.pid for p in resolve_targets(tini, 40)[0]] == [7, 9]
    assert "PID 1 is tini" in resolve_targets(tini, 40)[1]
    # the helper and its children are never targets, even under PID 1
    helper_child = [*tini, Proc(41, 40, "1", "S", True, "sh")]
    assert [p.pid for p in resolve_targets(helper_child, 40)[0]] == [7, 9]
    shared = _procs(
        (1, 0, "pause", False),
        (5, 0, "python3", True),
        (6, 5, "python3", True),
        (8, 0, "envoy", False),
        (40, 0, "sh", True),
    )
    assert [p.pid for p in resolve_targets(shared, 40)[0]] == [5, 6]
    server = _procs((1, 0, "vllm", True), (12, 1, "python3", True), (40, 0, "sh", True))
    targets, how = resolve_targets(server, 40)  # PID 1 cannot be stopped: its engine workers
    assert [p.pid for p in targets] == [12] and how.startswith("PID 1 (vllm) is the model server")
    with pytest.raises(K8sError, match=r"model server itself \(vllm\) and has no child process"):
        resolve_targets([server[0], server[2]], 40)
    assert [p.pid for p in resolve_targets(server, 40, pid=12)[0]] == [12]
    with pytest.raises(K8sError, match="no process 99"):
        resolve_targets(server, 40, pid=99)
    with pytest.raises(K8sError, match="has no child process"):
        resolve_targets(_procs((1, 0, "dumb-init", True), (40, 0, "sh", True)), 40)


@pytest.mark.parametrize("python", [True, False], ids=["python3", "sh"])
def test_freeze_and_thaw_model_server(tmp_path: Path, fake: FakeK8s, python: bool) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    sim = SimContainer(pod, has_python=python)
    fake.exec_handler = sim
    out = k8s.k8s_freeze_model_server(target_file=target, configuration=cfg)
    interp = "python3" if python else "sh"
    assert out["how"] == "PID 1 is tini (an init): its descendants"
    assert [t["pid"] for t in out["targets"]] == [7, 9] and out["stopped"] == [7, 9]
    assert {p: sim.procs[p]["state"] for p in (1, 7, 9)} == {1: "S", 7: "T", 9: "T"}
    assert [c[:2] for c in sim.calls] == [(interp, "probe"), (interp, "signal"), (interp, "probe")]
    assert sim.calls[1][2] == ["STOP", "120", "7:70", "9:90"] or sim.calls[1][2] == [
        "STOP",
        "120",
        f"7:{sim.procs[7]['start']}",
        f"9:{sim.procs[9]['start']}",
    ]
    timer = out["timer"]
    assert timer["pid"] in sim.procs and _state(cfg, "upstream-freeze")["timer"] == timer
    execs = [r.command[0] for r in fake.calls("GET", "/exec")]
    assert execs == (["python3"] * 3 if python else ["python3", "sh", "sh", "sh"])
    line = k8s.k8s_thaw_model_server(target_file=target, configuration=cfg)
    assert line == f"SIGCONT sent to 7, 9 in pod llm/{pod}"
    assert [c[:2] for c in sim.calls[3:]] == [(interp, "signal"), (interp, "kill")]
    assert sim.calls[3][2][:2] == ["CONT", "0"]
    assert all(p["state"] == "S" for p in sim.procs.values()) and timer["pid"] not in sim.procs
    assert _state(cfg, "upstream-freeze") is None
    assert [f.get("phase") for f in _faults(cfg)] == [None, "cleared"]
    assert _again_sends_nothing(fake, k8s.k8s_thaw_model_server, target, cfg) == (
        "no model server frozen by this run"
    )


def test_freeze_when_the_model_server_is_pid1(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    sim = SimContainer(pod, procs={1: {"ppid": 0, "start": "100", "state": "S", "comm": "vllm"}})
    fake.exec_handler = sim
    with pytest.raises(ActivityFailed) as err:  # no child: nothing that SIGSTOP can reach
        k8s.k8s_freeze_model_server(target_file=target, configuration=cfg)
    msg = _one_line(err)
    assert "PID 1 of the container is the model server itself (vllm) and has no child" in msg
    assert "ignores SIGSTOP" in msg and "k8s_block_pod_ingress" in msg
    assert [c[1] for c in sim.calls] == ["probe"]  # nothing signalled
    assert _state(cfg, "upstream-freeze") is None
    assert k8s.k8s_thaw_model_server(target_file=target, configuration=cfg) == (
        "no model server frozen by this run"
    )
    # with an engine worker (vLLM's EngineCore): the worker is frozen, PID 1 keeps accepting
    sim.procs[12] = {"ppid": 1, "start": "120", "state": "S", "comm": "VLLM::EngineCor"}
    out = k8s.k8s_freeze_model_server(ttl_s=0, target_file=target, configuration=cfg)
    assert out["stopped"] == [12] and out["timer"] is None and sim.procs[1]["state"] == "S"
    assert (
        out["how"].startswith("PID 1 (vllm) is the model server") and sim.procs[12]["state"] == "T"
    )
    # a restarted container is not thawed blindly (its pids are new processes)
    set_container(fake, "llm", pod, "vllm", containerID="containerd://new")
    n = len(sim.calls)
    line = k8s.k8s_thaw_model_server(target_file=target, configuration=cfg)
    assert line == f"container vllm of pod llm/{pod} restarted since the freeze; nothing to thaw"
    assert len(sim.calls) == n


# -- upstream-timeout: NetworkPolicy -------------------------------------------------------------


def test_block_pod_ingress_and_exact_restore(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    labels0 = fake.get("", "pods", pod, "llm")["metadata"]["labels"]
    out = k8s.k8s_block_pod_ingress(target_file=target, configuration=cfg)
    token = out["label"][BLOCK_LABEL]
    name = f"chaos-infer-block-{token}"
    assert out["pod"] == pod and out["policy"] == name
    assert [(r.path, r.content_type, r.body) for r in fake.calls("PATCH")] == [
        (
            f"/api/v1/namespaces/llm/pods/{pod}",
            MERGE,
            {"metadata": {"labels": {BLOCK_LABEL: token}}},
        )
    ]
    posts = fake.calls("POST")
    assert [r.path for r in posts] == ["/apis/networking.k8s.io/v1/namespaces/llm/networkpolicies"]
    assert posts[0].body == policy_body(name, "llm", token)
    pol = fake.get("networking.k8s.io", "networkpolicies", name, "llm")
    assert pol["spec"] == {
        "podSelector": {"matchLabels": {BLOCK_LABEL: token}},
        "policyTypes": ["Ingress"],
    }
    assert fake.get("", "pods", pod, "llm")["metadata"]["labels"] == {**labels0, BLOCK_LABEL: token}
    assert _state(cfg, "upstream-ingress")["labels"] == labels0
    lines = k8s.k8s_restore_pod_ingress(target_file=target, configuration=cfg)
    assert lines == [f"networkpolicy llm/{name} deleted", f"labels of pod llm/{pod} restored"]
    assert fake.calls("DELETE")[-1].path.endswith(f"/networkpolicies/{name}")
    assert fake.calls("PATCH")[-1].body == {"metadata": {"labels": {BLOCK_LABEL: None}}}
    assert fake.get("", "pods", pod, "llm")["metadata"]["labels"] == labels0
    assert fake.get("networking.k8s.io", "networkpolicies", name, "llm") is None
    assert _again_sends_nothing(fake, k8s.k8s_restore_pod_ingress, target, cfg) == []


def test_block_pod_ingress_refusals(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    labels0 = fake.get("", "pods", pod, "llm")["metadata"]["labels"]
    fake.forbid("create", "networkpolicies")
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_block_pod_ingress(target_file=target, configuration=cfg)
    assert _one_line(err).startswith("create networkpolicy llm/chaos-infer-block-")
    assert "permission denied" in str(err.value)
    # the pod was labelled before the refusal: the rollback puts its labels back
    assert BLOCK_LABEL in fake.get("", "pods", pod, "llm")["metadata"]["labels"]
    lines = k8s.k8s_restore_pod_ingress(target_file=target, configuration=cfg)
    assert lines[0].endswith("already gone") and lines[1] == f"labels of pod llm/{pod} restored"
    assert fake.get("", "pods", pod, "llm")["metadata"]["labels"] == labels0
    fake.forbidden = set()
    # a policy of that name that this drill did not create is never deleted
    out = k8s.k8s_block_pod_ingress(target_file=target, configuration=cfg)
    with fake.lock:
        fake.objects[("networking.k8s.io", "networkpolicies")][("llm", out["policy"])]["metadata"][
            "labels"
        ] = {"team": "net"}
    with pytest.raises(ActivityFailed, match="is not the one this drill created"):
        k8s.k8s_restore_pod_ingress(target_file=target, configuration=cfg)
    assert fake.get("networking.k8s.io", "networkpolicies", out["policy"], "llm") is not None
    with pytest.raises(ActivityFailed, match="already in place"):
        k8s.k8s_block_pod_ingress(target_file=target, configuration=cfg)


# -- node-loss variants --------------------------------------------------------------------------


def test_noexecute_taint_evicts_and_rollback_removes_only_ours(
    tmp_path: Path, fake: FakeK8s
) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    node = fake.get("", "pods", pod, "llm")["spec"]["nodeName"]
    node0 = fake.get("", "nodes", node)
    out = k8s.k8s_taint_model_node(poll_s=POLL_S, target_file=target, configuration=cfg)
    ours = {"key": "chaos-infer.io/node-loss", "value": "true", "effect": "NoExecute"}
    assert (out["node"], out["taint"], out["taints_before"]) == (node, ours, None)
    assert [(r.path, r.content_type, r.body) for r in fake.calls("PATCH")] == [
        (
            f"/api/v1/nodes/{node}",
            MERGE,
            {
                "metadata": {"resourceVersion": node0["metadata"]["resourceVersion"]},
                "spec": {"taints": [ours]},
            },
        )
    ]
    assert fake.calls("POST") == []  # the taint manager evicts; no Eviction API, no PDB
    assert not [p for p in fake.pods() if p["spec"].get("nodeName") == node]  # DaemonSet pod too
    row = out["recovery"]["pods"][0]
    assert row["pod"] == pod and row["recovered"] and row["node_after"] != node
    assert SCHEDULE_S - 0.01 <= row["rescheduling_s"] <= SCHEDULE_S + 0.25
    # someone else taints the node meanwhile: the rollback leaves that taint alone
    other = {"key": "maintenance", "value": "x", "effect": "NoSchedule"}
    with fake.lock:
        fake.objects[("", "nodes")][("", node)]["spec"]["taints"].append(other)
    line = k8s.k8s_remove_node_taint(target_file=target, configuration=cfg)
    assert line == f"taint chaos-infer.io/node-loss:NoExecute removed from node {node}"
    assert fake.calls("PATCH")[-1].body["spec"] == {"taints": [other]}
    assert fake.get("", "nodes", node)["spec"]["taints"] == [other]
    assert k8s.k8s_remove_node_taint(target_file=target, configuration=cfg) == (
        "no node tainted by this run"
    )
    # with no other taint, the node's spec reads back exactly as before (NoSchedule: no eviction)
    node2 = fake.get("", "pods", _first_pod(fake), "llm")["spec"]["nodeName"]
    spec2 = fake.get("", "nodes", node2)["spec"]
    out = k8s.k8s_taint_model_node(effect="NoSchedule", target_file=target, configuration=cfg)
    assert (out["node"], out["taints_before"], out["recovery"]["pods"]) == (node2, None, [])
    assert len(fake.pods("llm", "app=vllm")) == 3
    k8s.k8s_remove_node_taint(target_file=target, configuration=cfg)
    assert fake.get("", "nodes", node2)["spec"] == spec2


def test_taint_refusals(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)
    target, cfg = _setup(tmp_path, fake)
    with pytest.raises(
        ActivityFailed, match="effect must be NoExecute, NoSchedule or PreferNoSchedule"
    ):
        k8s.k8s_taint_model_node(effect="Evict", target_file=target, configuration=cfg)
    assert fake.requests == []
    node = fake.get("", "pods", _first_pod(fake), "llm")["spec"]["nodeName"]
    with fake.lock:
        fake.objects[("", "nodes")][("", node)]["spec"]["taints"] = [
            {"key": "chaos-infer.io/node-loss", "effect": "NoExecute"}
        ]
    with pytest.raises(ActivityFailed, match=f"node {node} already has a taint"):
        k8s.k8s_taint_model_node(target_file=target, configuration=cfg)
    assert fake.calls("PATCH") == [] and _state(cfg, "node-taint") is None
    fake.forbid("patch", "nodes")
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_taint_model_node(
            pod=sorted(p["metadata"]["name"] for p in fake.pods("llm"))[1],
            target_file=target,
            configuration=cfg,
        )
    assert _one_line(err).startswith("taint node ") and "permission denied" in str(err.value)
    assert _state(cfg, "node-taint") is None


def test_delete_node_recovery_and_restore(tmp_path: Path, fake: FakeK8s) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    node = fake.get("", "pods", pod, "llm")["spec"]["nodeName"]
    node0 = fake.get("", "nodes", node)
    out = k8s.k8s_delete_model_node(poll_s=POLL_S, target_file=target, configuration=cfg)
    assert [r.path for r in fake.calls("DELETE")] == [f"/api/v1/nodes/{node}"]
    assert fake.get("", "nodes", node) is None
    row = out["recovery"]["pods"][0]
    assert row["pod"] == pod and row["recovered"] and row["node_after"] != node
    gc_s = fake.podgc_delay_s
    assert gc_s + SCHEDULE_S - 0.01 <= row["rescheduling_s"] <= gc_s + SCHEDULE_S + 0.3
    assert json.loads(_state(cfg, "node-delete")["raw"]) == node0  # stored before the DELETE
    assert k8s.k8s_restore_node(target_file=target, configuration=cfg) == f"node {node} recreated"
    post = fake.calls("POST", "/api/v1/nodes")[-1]
    sent = json.loads(json.dumps(node0))
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        sent["metadata"].pop(key)
    assert post.body == sent and post.status == 201
    node1 = fake.get("", "nodes", node)
    assert {k: node1[k] for k in ("spec", "status")} == {k: node0[k] for k in ("spec", "status")}
    assert node1["metadata"]["labels"] == node0["metadata"]["labels"]
    assert node1["metadata"]["uid"] != node0["metadata"]["uid"]  # a new object
    assert (
        k8s.k8s_restore_node(target_file=target, configuration=cfg) == "no node deleted by this run"
    )
    # the kubelet re-registered the node before the rollback: left as it is
    k8s.k8s_delete_model_node(
        pod=pod if fake.get("", "pods", pod, "llm") else None,
        poll_s=POLL_S,
        target_file=target,
        configuration=cfg,
    )
    gone = _state(cfg, "node-delete")["node"]
    fake.put(
        "", "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": gone}, "spec": {}}
    )
    line = k8s.k8s_restore_node(target_file=target, configuration=cfg)
    assert line == f"node {gone} exists again (re-registered meanwhile); left as it is"
    assert fake.get("", "nodes", gone)["spec"] == {}
    fake.forbid("delete", "nodes")
    with pytest.raises(ActivityFailed) as err:
        k8s.k8s_delete_model_node(target_file=target, configuration=cfg)
    assert _one_line(err).startswith("delete node ") and "permission denied" in str(err.value)
    assert _state(cfg, "node-delete") is None


# -- quota-cut: HPA ------------------------------------------------------------------------------


def test_quota_cut_hpa_max_replicas_and_byte_for_byte_restore(
    tmp_path: Path, fake: FakeK8s
) -> None:
    make_cluster(fake, hpa="vllm")
    target, cfg = _setup(tmp_path, fake)
    h0 = fake.get("autoscaling", "horizontalpodautoscalers", "vllm", "llm")
    out = k8s.k8s_cut_quota(replicas=1, hpa_max_replicas=2, target_file=target, configuration=cfg)
    assert out["hpa"] == {"name": "vllm", "before": 6, "after": 2, "min_before": 3, "min_after": 2}
    hpa_path = "/apis/autoscaling/v2/namespaces/llm/horizontalpodautoscalers/vllm"
    assert [(r.path, r.body) for r in fake.calls("PATCH", "horizontalpodautoscalers")] == [
        (hpa_path, {"spec": {"maxReplicas": 2, "minReplicas": 2}})
    ]
    assert fake.calls("PATCH", "horizontalpodautoscalers")[0].content_type == MERGE
    saved = _state(cfg, "quota-cut")
    assert json.loads(saved["hpa"]["raw"]) == h0
    lines = k8s.k8s_restore_quota(target_file=target, configuration=cfg)
    assert lines == ["horizontalpodautoscaler llm/vllm restored", "deployment llm/vllm restored"]
    put = fake.calls("PUT", "horizontalpodautoscalers")
    assert [r.path for r in put] == [hpa_path] and put[0].body == _strip_rv(h0)
    h1 = fake.get("autoscaling", "horizontalpodautoscalers", "vllm", "llm")
    assert _strip_rv(h1) == _strip_rv(h0)


def test_quota_cut_hpa_absent_or_foreign(tmp_path: Path, fake: FakeK8s) -> None:
    make_cluster(fake)  # no HPA
    target, cfg = _setup(tmp_path, fake)
    out = k8s.k8s_cut_quota(gpus=2, hpa_max_replicas=2, target_file=target, configuration=cfg)
    assert out["hpa"] is None and out["hpa_skipped"] == "no HorizontalPodAutoscaler llm/vllm"
    assert [r.status for r in fake.calls("GET", "horizontalpodautoscalers")] == [404]
    assert fake.calls("PATCH", "horizontalpodautoscalers") == []
    assert k8s.k8s_restore_quota(target_file=target, configuration=cfg) == [
        "resourcequota llm/gpu-quota restored"
    ]
    put_hpa(
        fake,
        {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "sglang"},
            "maxReplicas": 4,
        },
    )
    with pytest.raises(ActivityFailed, match="scales Deployment sglang, not Deployment vllm"):
        k8s.k8s_cut_quota(hpa_max_replicas=2, target_file=target, configuration=cfg)
    assert fake.calls("PATCH", "horizontalpodautoscalers") == []


# -- real processes: PID namespace + memory cgroup (lab) -----------------------------------------

_NO_LAB = running_as_root_with_memory_cgroup()
_SERVER = "import subprocess, time; subprocess.Popen(['sleep', '60']); x = b'1' * (4 << 20); time.sleep(60)"


@pytest.mark.lab
@pytest.mark.skipif(_NO_LAB is not None, reason=str(_NO_LAB))
@pytest.mark.parametrize("python", [True, False], ids=["python3", "sh"])
def test_real_freeze_under_an_init_and_the_pid1_rule(
    tmp_path: Path, fake: FakeK8s, python: bool
) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    shim = ["sh", "-c", f'{sys.executable} -c "{_SERVER}" & wait']
    box = LocalContainer(fake, "llm", pod, "vllm", shim, has_python=python).start()
    try:
        fake.exec_handler = box
        deadline = time.monotonic() + 5
        while len(box.ns_states()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # sh -> python3 server -> sleep
        init = box.host_init_pid()
        out = k8s.k8s_freeze_model_server(ttl_s=30, target_file=target, configuration=cfg)
        assert out["how"] == "PID 1 is sh (an init): its descendants" and len(out["stopped"]) == 2
        states = box.ns_states()  # ground truth: the kernel's view from outside the namespace
        stopped = [t["pid"] for t in out["targets"]]
        assert stopped == out["stopped"] and {states[p] for p in stopped} == {"T"}
        assert states[1] == "S" and "T" not in {s for p, s in states.items() if p not in stopped}
        assert box.host_states()[init] == "S"
        k8s.k8s_thaw_model_server(target_file=target, configuration=cfg)
        assert "T" not in box.host_states().values()
        if python:  # the dead-man timer thaws without any rollback
            k8s.k8s_freeze_model_server(ttl_s=1, target_file=target, configuration=cfg)
            assert "T" in box.host_states().values()
            time.sleep(1.6)
            assert "T" not in box.host_states().values()
            assert k8s.k8s_thaw_model_server(target_file=target, configuration=cfg).startswith(
                "SIGCONT sent to"
            )
    finally:
        box.close()
    # the server itself as PID 1: the kernel ignores kill -STOP 1 sent from inside the container,
    # so the action stops what it can reach, the server's child processes, and says so
    other = sorted(p["metadata"]["name"] for p in fake.pods("llm", "app=vllm"))[1]
    box = LocalContainer(
        fake, "llm", other, "vllm", ["python3", "-c", _SERVER], has_python=python
    ).start()
    try:
        fake.exec_handler = box
        deadline = time.monotonic() + 5
        while len(box.ns_states()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # python3 server -> sleep
        reply = box(ExecCall("llm", other, "vllm", ["sh", "-c", "kill -STOP 1; echo rc=$?"]))
        assert reply.stdout == "rc=0\n"  # "succeeds" ...
        time.sleep(0.1)
        assert box.ns_states()[1] != "T"  # ... and does nothing
        out = k8s.k8s_freeze_model_server(pod=other, target_file=target, configuration=cfg)
        assert out["how"].startswith("PID 1 (python") and len(out["stopped"]) == 1
        states = box.ns_states()
        assert states[1] != "T" and states[out["stopped"][0]] == "T"
        k8s.k8s_thaw_model_server(target_file=target, configuration=cfg)
        assert "T" not in box.ns_states().values()
    finally:
        box.close()


@pytest.mark.lab
@pytest.mark.skipif(_NO_LAB is not None, reason=str(_NO_LAB))
@pytest.mark.parametrize("python", [True, False], ids=["python3", "sh"])
def test_real_oom_kill_in_the_container_cgroup(tmp_path: Path, fake: FakeK8s, python: bool) -> None:
    target, cfg, pod = _cluster_and_pod(tmp_path, fake)
    with fake.lock:
        res = fake.objects[("", "pods")][("llm", pod)]["spec"]["containers"][0]["resources"]
        res["limits"]["memory"] = res["requests"]["memory"] = "96Mi"
    box = LocalContainer(
        fake,
        "llm",
        pod,
        "vllm",
        ["python3", "-c", _SERVER],
        limit_bytes=96 << 20,
        has_python=python,
    ).start()
    try:
        fake.exec_handler = box
        time.sleep(0.3)
        out = k8s.k8s_oom_kill(timeout_s=20, poll_s=POLL_S, target_file=target, configuration=cfg)
        exits = [e for e in box.events if e["event"] == "exit"]
        assert len(exits) == 1 and exits[0]["cause"] == "oom" and exits[0]["oom_kills"] >= 1
        assert out["hog_mb"] == math.ceil(96 * 1.1) + 64 and out["hog"]["interpreter"] == (
            "python3" if python else "sh"
        )
        assert (out["reason"], out["exit_code"], out["restart_count_after"]) == (
            "OOMKilled",
            137,
            1,
        )
        assert 0 <= out["oom_at"] - exits[0]["t"] <= POLL_S + 0.2  # seen within a poll of the kill
        assert out["time_to_oom_s"] < 10 and out["ready_s"] >= out["restart_s"] >= 0
        line = k8s.k8s_stop_memory_hog(target_file=target, configuration=cfg)
        assert line.endswith("restarted; the hog died with it")
    finally:
        box.close()
