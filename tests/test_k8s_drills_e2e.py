"""The six other Kubernetes drills end to end through the command line, against the fake API.

``chaos-infer drill run NAME --target k8s-target.yaml`` runs as a subprocess (KUBECONFIG pointing at
the HTTP-level fake of tests/fake_k8s.py, a simulated engine on loopback as the target's ``url``),
as ``tests/test_k8s_cli.py`` does for simultaneous-restarts. What a real cluster would do behind
the API is scripted here: the fake's controllers (ReplicaSet, scheduler, taint manager, endpoint
controller), a kubelet stand-in for the in-container programs (:class:`k8s_sim.SimContainer`:
the hog makes the container restart ``OOMKilled``; SIGSTOP/SIGCONT flip the process states) and,
for traffic-spike, an autoscaler that reads the load's own records and rescales the HPA when the
send rate doubles. The engine behind ``url`` is one process, not the pods, so the client figures
show a healthy service (availability 1.0): these tests check the plumbing (each fault reaches the
cluster with the exact calls, its figures match the scripted ground truth, its rollback restores
the cluster and removes its saved state), not the service's resilience.

Confirmed by the traffic (issue 21 item 3): with ``url`` the engine itself, the requests never
cross the faulted pods (every answer names the engine, ``X-Replica-Id: r0``), so each fault on a
pod reads ``inconclusive``, "the fault did not reach the service's traffic" (traffic-spike, a
fault of the load itself, passes; the unmeasured duplicate generations of network-jitter stay
behind the unconfirmed fault). Routed (``url`` the Service's data path,
:class:`k8s_sim.ServiceProxy`: ready endpoints round robin, each answer naming its pod), a drain
moves the traffic off its pods and is judged as before: passed; a quota cut still misses it (the
fake's ReplicaSet does not scale down: all three pods keep serving through the cut).

Holds and settles are shortened through the plan's ``vars`` (``hold_s``, ``settle_s``) so each
drill takes about 10 s.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_k8s import ExecCall, ExecReply, FakeK8s, make_cluster, write_target
from k8s_sim import ServiceProxy, SimContainer, kubelet_restart

from chaoslib_infer.load.ceiling import sim_engine
from chaoslib_infer.verdict.confirm import MISSED
from chaoslib_infer.verdict.state import ALSO_INCONCLUSIVE

ROOT = Path(__file__).resolve().parent.parent
K8S_EXPERIMENTS = ROOT / "experiments" / "k8s"
NS = "llm"
STRATEGIC = "application/strategic-merge-patch+json"
# traffic-spike: the baseline phase before the spike (seconds of the profile); the method must
# read the HPA before the spike: 9 s left ~3 s after the 5.5 s warm-up and the hypothesis, which a
# loaded CI box overran once (the HPA had fired before the probe read its baseline: desired 4)
SPIKE_AT_S = 11.0

# a baseline of >= 50 requests, so each drill is judged, not inconclusive (docs/definitions.md)
COMMON_VARS = {"load_warmup_s": 5.5, "window_s": 2, "load_rate_rps": 12}
VARS: dict[str, dict[str, Any]] = {
    "node-loss": {"settle_s": 1},
    "oom-kill": {"settle_s": 1},
    "network-jitter": {"hold_s": 2, "settle_s": 1, "jitter_delay_ms": 150, "jitter_ms": 40},
    # the method starts ~5 s before the spike (after the 5.5 s warm-up): the HPA is read first
    "traffic-spike": {"load_profile": [[SPIKE_AT_S, 7], [4, 40], [6, 7]], "window_s": 3},
    "upstream-timeout": {"hold_s": 2},
    "quota-cut": {"hold_s": 2},
}


def _strip_rv(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object without its resourceVersion (the only field a PUT back must change)."""
    assert obj is not None
    out = copy.deepcopy(obj)
    out["metadata"].pop("resourceVersion", None)
    return out


class Kubelet:
    """The exec handler of every model pod: one :class:`SimContainer` per pod; a memory hog
    makes that container die ``OOMKilled`` and restart (:func:`k8s_sim.kubelet_restart`)."""

    def __init__(self, fake: FakeK8s) -> None:
        self.fake = fake
        self.containers: dict[str, SimContainer] = {}
        self.restarts: list[dict[str, Any]] = []  # ground truth of each scripted OOM kill

    def _on_hog(self, pod: str) -> Callable[[int], None]:
        def hog(mb: int) -> None:
            truth = kubelet_restart(self.fake, NS, pod, "vllm", "OOMKilled", 137, 0.2, 0.3)
            self.restarts.append({"pod": pod, "hog_mb": mb, "truth": truth})

        return hog

    def __call__(self, call: ExecCall) -> ExecReply:
        sim = self.containers.get(call.pod)
        if sim is None:
            sim = self.containers[call.pod] = SimContainer(call.pod, on_hog=self._on_hog(call.pod))
        return sim(call)


class Autoscaler(threading.Thread):
    """An HPA stand-in: every 0.2 s it counts the attempts the load scheduled in the last second
    (``intended_at`` in the drill's records.jsonl: the offered rate, not skewed by a busy
    client); the first time that count reaches ``threshold``, it rescales the HPA to ``desired``
    (the fake then scales the Deployment 0.3 s later)."""

    def __init__(self, fake: FakeK8s, records: Path, threshold: int, desired: int) -> None:
        super().__init__(daemon=True)
        self.fake, self.records, self.threshold, self.desired = fake, records, threshold, desired
        self.fired_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2) and self.fired_at is None:
            try:
                lines = self.records.read_text().splitlines()
            except OSError:
                continue
            now = time.time()
            sent = 0
            for line in lines[-200:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if now - 1.0 <= float(rec.get("intended_at") or 0) <= now:
                    sent += 1
            if sent >= self.threshold:
                self.fired_at = time.time()
                self.fake.hpa_rescale(NS, "vllm", self.desired, scale_after_s=0.3)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[FakeK8s, dict[str, str]]]:
    """The fake API (3 model pods, HPA ``vllm``); env with KUBECONFIG pointing at it."""
    with FakeK8s(schedule_delay_s=0.1, ready_delay_s=0.2) as fake:
        make_cluster(fake, hpa="vllm")
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        env.pop("CHAOS_INFER_ALLOW", None)
        yield fake, env


def _run_drill(
    tmp_path: Path, env: dict[str, str], name: str, url: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    plan = tmp_path / "plan.yaml"
    drill = {
        "name": name,
        "experiment": str(K8S_EXPERIMENTS / f"{name}.yaml"),
        "vars": {**COMMON_VARS, **VARS[name]},
    }
    plan.write_text(
        yaml.safe_dump({"name": "k8s-e2e", "platform": "kubernetes", "drills": [drill]})
    )
    target = write_target(tmp_path / "k8s-target.yaml", Path(env["KUBECONFIG"]), url=url + "/v1")
    doc = yaml.safe_load(target.read_text())
    doc.pop("kubeconfig")  # the client finds the fake through $KUBECONFIG, as a user's would
    doc["service"] = "vllm"
    target.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "drill", "run", name]
        + ["--target", str(target), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**env, "CHAOS_INFER_K8S_PLAN": str(plan)},
        timeout=90,
        cwd=ROOT,
    )
    return proc, out


def _outputs(journal: dict[str, Any]) -> dict[str, Any]:
    """``{activity name: output}`` of the method (the last run of each name)."""
    return {r["activity"]["name"]: r.get("output") for r in journal["run"]}


#: the drills also run with the url routed through the Service to the pods: a drain moves the
#: traffic off its pods (passed); the fake's quota cut leaves every pod serving (inconclusive);
#: the others would need a per-pod engine to feel theirs
ROUTED = ("node-loss", "quota-cut")


@pytest.mark.slow  # ~25 s a drill: out of the fast tier
@pytest.mark.parametrize(
    ("name", "routed"),
    [(n, False) for n in sorted(VARS)] + [(n, True) for n in ROUTED],
    ids=[*sorted(VARS), *(f"{n}-routed" for n in ROUTED)],
)
def test_k8s_drill_runs_end_to_end_on_the_fake_cluster(
    tmp_path: Path, cluster: tuple[FakeK8s, dict[str, str]], name: str, routed: bool
) -> None:
    fake, env = cluster
    kubelet = Kubelet(fake)
    fake.exec_handler = kubelet
    pods0 = {p["metadata"]["name"]: p for p in fake.pods(NS, "app=vllm")}
    nodes0 = {n["metadata"]["name"]: n for n in fake.list("", "nodes")}
    objs0 = {
        "quota": fake.get("", "resourcequotas", "gpu-quota", NS),
        "deployment": fake.get("apps", "deployments", "vllm", NS),
        "hpa": fake.get("autoscaling", "horizontalpodautoscalers", "vllm", NS),
    }
    scaler = Autoscaler(fake, tmp_path / "out" / name / "records.jsonl", threshold=25, desired=4)
    if name == "traffic-spike":
        scaler.start()
    try:
        with sim_engine(zero_latency=False, itl_s=0.002, output_tokens=8) as url:
            if routed:
                with ServiceProxy(fake, NS, "vllm", url) as svc:
                    proc, out = _run_drill(tmp_path, env, name, svc.url)
                served = {pod for pod, _ in svc.served}
                assert served >= set(pods0), (served, sorted(pods0))  # every pod served
            else:
                proc, out = _run_drill(tmp_path, env, name, url)
    finally:
        scaler.stop.set()
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    # unrouted: the faulted pods never served the traffic (the fault missed it); a spike is the
    # load's own. Duplicate generations need an engine ledger, which a cluster does not have:
    # network-jitter cannot answer its question there (never "0")
    # Routed, quota-cut still misses: the fake's ReplicaSet does not scale a Deployment down, so
    # the cut changes the API's numbers while all three pods keep serving (ready endpoints 3)
    missed = (not routed and name != "traffic-spike") or name == "quota-cut"
    # Unrouted, the fake's one engine serves every request: during the cut one replica serves
    # where the quota allows two (instances_held 0.5x), a row that does not depend on the
    # client, so the drill reads FAILED whatever else is inconclusive (issue 29), the miss beside
    short = name == "quota-cut" and not routed
    expected = "inconclusive" if missed or name == "network-jitter" else "passed"
    expected = "failed" if short else expected
    assert proc.returncode == {"passed": 0, "failed": 1, "inconclusive": 3}[expected], text
    run_dir = out / name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["target"]["kind"] == "kubernetes"
    (drill,) = summary["drills"]
    assert drill["status"] == expected, drill["reasons"]
    reasons = list(drill["reasons"])
    if missed:
        if short:
            held = reasons.pop(0)
            assert held == "replicas serving during the cut / quota: 0.5x < 1x (instances_held)"
            assert reasons[0].startswith(ALSO_INCONCLUSIVE), reasons
            reasons[0] = reasons[0][len(ALSO_INCONCLUSIVE) :]
        why = reasons.pop(0)
        if name == "quota-cut":  # no pod named: fewer engines serving during the cut, or not
            n = 3 if routed else 1
            assert why.startswith(f"{MISSED}: {n} engines served before the cut ("), why
            assert f"), {n} during it (" in why, why
        else:
            assert why.startswith(f"{MISSED}: "), why
            assert "served none of the" in why and "(served by: r0 " in why, why
    if name == "network-jitter" and not missed:
        assert reasons == [
            "duplicate generations is unmeasured on this target (duplicate_generations): "
            "the drill cannot answer its question"
        ]
    else:
        assert reasons == []
        assert not drill["verdict"]["notes"][0].startswith("fault: no fault was recorded")
    if routed and not missed:  # the traffic felt it: the pods' answers moved off the faulted ones
        note = drill["verdict"]["notes"][0]
        assert "the traffic felt it: " in note and "moved (share of answers" in note, note
    assert drill["hypothesis"] == {"before": True, "after": not short}
    figures = drill["figures"]
    # one engine behind the url, untouched by the cluster's faults: a healthy client view
    assert figures["requests"] >= 20 and figures["availability"] == 1.0, figures
    journal = json.loads((run_dir / "journal.json").read_text())
    assert journal["status"] == "completed", journal["status"]
    failed = [
        r["activity"]["name"]
        for r in journal["run"] + journal["rollbacks"]
        if r.get("status") != "succeeded"
    ]
    assert failed == [], failed
    assert [r["activity"]["name"] for r in journal["rollbacks"]][-1] == "stop-observation"
    faults = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    kinds = [f["kind"] for f in faults]
    assert kinds[0] == "k8s-observation"
    # every saved fault was undone by the drill's own rollback: nothing left to replay
    assert sorted(p.name for p in run_dir.glob("k8s-state/*")) == []
    assert (run_dir / "k8s-observations.jsonl").stat().st_size > 0
    outputs = _outputs(journal)
    CHECKS[name](Seen(fake, kubelet, scaler, outputs, faults, pods0, nodes0, objs0))


@dataclass
class Seen:
    """What one drill run left: the fake, the scripted kubelet and autoscaler, the method's
    outputs (by activity name), the fault log, and the cluster before the run."""

    fake: FakeK8s
    kubelet: Kubelet
    scaler: Autoscaler
    outputs: dict[str, Any]
    faults: list[dict[str, Any]]
    pods0: dict[str, dict[str, Any]]
    nodes0: dict[str, dict[str, Any]]
    objs0: dict[str, dict[str, Any] | None]


def _check_node_loss(r: Seen) -> None:
    """The default node-loss: cordon, then drain through the Eviction API (no taint, no delete)."""
    drain = r.outputs["drain-model-node"]
    node = drain["node"]
    on_node = sorted(n for n, p in r.pods0.items() if p["spec"]["nodeName"] == node)
    assert on_node
    # the exact calls: one policy/v1 Eviction per model pod of the node, each accepted ...
    evictions = r.fake.calls("POST", "/eviction")
    assert [(q.path, q.body, q.status) for q in evictions] == [
        (
            f"/api/v1/namespaces/{NS}/pods/{pod}/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NS}},
            201,
        )
        for pod in on_node
    ]  # fmt: skip
    # ... the DaemonSet pod of the node skipped, not evicted
    assert drain["drain"]["skipped"] == [
        {"namespace": "monitoring", "pod": f"node-exporter-{node}", "reason": "DaemonSet"}
    ]
    assert sorted(e["pod"] for e in drain["drain"]["evicted"]) == on_node
    assert drain["drain"]["refused"] == [] and drain["drain"]["still_terminating"] == []
    # the node: cordoned, then uncordoned by the rollback; no taint, no delete, no create
    writes = [q for q in r.fake.requests if q.resource == "nodes" and q.verb != "get"]
    assert [(q.method, q.path, q.body, q.content_type) for q in writes] == [
        ("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, STRATEGIC),
        ("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": None}}, STRATEGIC),
    ]
    assert _strip_rv(r.fake.get("", "nodes", node)) == _strip_rv(r.nodes0[node])  # uncordoned
    rec = drain["recovery"]
    assert sorted(p["pod"] for p in rec["pods"]) == on_node and rec["unrecovered"] == []
    # the fake schedules after 0.1 s and readies 0.2 s later; polled every 0.25 s
    assert 0.3 - 0.05 <= rec["max_total_recovery_s"] <= 0.3 + 0.25 + 1.0, rec
    now = {p["metadata"]["name"]: p for p in r.fake.pods(NS, "app=vllm")}
    assert len(now) == 3 and not set(now) & set(on_node)
    assert all(p["spec"]["nodeName"] != node for p in now.values())
    assert r.outputs["ready-endpoints-after-node-loss"] == 3
    assert [f.get("phase") for f in r.faults if f["kind"] == "k8s-node-loss"] == [None, "cleared"]


def _check_oom_kill(r: Seen) -> None:
    oom = r.outputs["oom-kill-model-server"]
    (restart,) = r.kubelet.restarts
    truth = restart["truth"]
    assert oom["pod"] == restart["pod"] == sorted(r.pods0)[0]
    assert oom["reason"] == "OOMKilled" and oom["exit_code"] == 137
    assert oom["restart_count_before"] == 0 and oom["restart_count_after"] == 1
    # the pods' limit is 24Gi; the hog defaults to limit + 10% + 64 MiB: ceil(27033.6) + 64
    assert oom["memory_limit_bytes"] == 24 * 2**30
    assert oom["hog_mb"] == restart["hog_mb"] == 27034 + 64
    # observed to within the poll interval (0.5 s) of the scripted kubelet's ground truth
    assert truth["died_at"] - 0.05 <= oom["oom_at"] <= truth["died_at"] + 0.5 + 0.3
    assert truth["ready_at"] - 0.05 <= oom["ready_at"] <= truth["ready_at"] + 0.5 + 0.3
    assert 0 <= oom["restart_s"] <= 0.2 + 0.5 + 0.3 and oom["ready_s"] >= oom["restart_s"]
    assert r.outputs["oomkilled-pods"] == [oom["pod"]]
    assert r.outputs["restart-counts"][oom["pod"]] == 1
    assert sum(r.outputs["restart-counts"].values()) == 1
    # the hog died with its container: the rollback had nothing to exec
    hogs = [c for c in r.kubelet.containers[oom["pod"]].calls if c[1] == "hog"]
    kills = [c for c in r.kubelet.containers[oom["pod"]].calls if c[1] == "kill"]
    assert len(hogs) == 1 and kills == []


def _check_network_jitter(r: Seen) -> None:
    inj = r.outputs["inject-network-jitter"]
    patches = r.fake.calls("PATCH", "/ephemeralcontainers")
    assert [q.path for q in patches] == [
        f"/api/v1/namespaces/{NS}/pods/{inj['pod']}/ephemeralcontainers"
    ] * 2
    added = [q.body["spec"]["ephemeralContainers"][-1] for q in patches]
    assert added[0]["name"] == inj["container"] and added[1]["name"] == inj["container"] + "-undo"
    assert added[0]["command"] == [
        "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "150ms", "40ms",
        "distribution", "normal",
    ]  # fmt: skip
    assert added[1]["command"] == ["tc", "qdisc", "del", "dev", "eth0", "root"]
    assert all(c["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"] for c in added)
    assert r.outputs["remove-network-jitter"].startswith("netem qdisc removed from pod")
    assert [f.get("phase") for f in r.faults if f["kind"] == "k8s-network-jitter"] == [
        None,
        "cleared",
    ]


def _check_traffic_spike(r: Seen) -> None:
    res = r.outputs["wait-for-scale-out"]
    assert res["spike_source"] == "load profile (records.jsonl)"
    assert res["timed_out"] is False and res["new_ready"] >= 1 and res["hpa"] == "vllm"
    assert res["hpa_desired_before"] == 3 and res["hpa_desired_after"] == 4
    (logged,) = [f for f in r.faults if f.get("spike_source")]
    spike_at = logged["fault_at"]
    # the autoscaler fired on the spike it saw in the records: after the spike's start
    assert r.scaler.fired_at is not None and r.scaler.fired_at >= spike_at - 0.2
    # the HPA decision is seen to within the probe's poll (1 s) of when it happened
    assert abs(spike_at + res["hpa_desired_at_s"] - r.scaler.fired_at) <= 1.0 + 0.3, res
    order = [res[k] for k in ("hpa_desired_at_s", "pod_created_at_s", "ready_at_s", "serving_at_s")]
    assert order == sorted(order), res
    assert res["completed_at_s"] >= res["serving_at_s"] and res["serving_at_s"] <= 4 + 2.0
    assert len(r.fake.pods(NS, "app=vllm")) == 4


def _check_upstream_timeout(r: Seen) -> None:
    frz = r.outputs["freeze-model-server"]
    sim = r.kubelet.containers[frz["pod"]]
    assert sorted(frz["stopped"]) == [7, 9] and frz["not_stopped"] == []  # under tini: its tree
    assert [c[1] for c in sim.calls][:3] == ["probe", "signal", "probe"]
    # thawed by the rollback: every process runs again, the dead-man timer is gone
    assert {pid: p["state"] for pid, p in sim.procs.items()} == {1: "S", 7: "S", 9: "S"}
    assert frz["timer"]["pid"] not in sim.procs
    assert any(c[1] == "signal" and c[2][0] == "CONT" for c in sim.calls)
    assert r.outputs["ready-endpoints-while-frozen"] == 3


def _check_quota_cut(r: Seen) -> None:
    cut = r.outputs["cut-quota"]
    assert cut["quota"]["after"] == "2" and cut["deployment"]["after"] == 2
    assert cut["hpa"]["after"] == 2 and cut["hpa"]["min_after"] == 2
    # put back exactly as saved before the cut
    assert _strip_rv(r.fake.get("", "resourcequotas", "gpu-quota", NS)) == _strip_rv(
        r.objs0["quota"]
    )
    assert _strip_rv(r.fake.get("apps", "deployments", "vllm", NS)) == _strip_rv(
        r.objs0["deployment"]
    )
    assert _strip_rv(
        r.fake.get("autoscaling", "horizontalpodautoscalers", "vllm", NS)
    ) == _strip_rv(r.objs0["hpa"])
    assert r.outputs["ready-endpoints-at-quota"] == 3


CHECKS: dict[str, Callable[..., None]] = {
    "node-loss": _check_node_loss,
    "oom-kill": _check_oom_kill,
    "network-jitter": _check_network_jitter,
    "traffic-spike": _check_traffic_spike,
    "upstream-timeout": _check_upstream_timeout,
    "quota-cut": _check_quota_cut,
}


def test_fake_refuses_an_eviction_that_is_not_the_urls_pod() -> None:
    """The fake answers a malformed eviction 400 as the API server does (so the exact-call
    checks above see only evictions a real cluster would accept)."""
    import urllib.error
    import urllib.request

    with FakeK8s() as fake:
        make_cluster(fake)
        pod = sorted(p["metadata"]["name"] for p in fake.pods(NS, "app=vllm"))[0]
        url = f"{fake.url}/api/v1/namespaces/{NS}/pods/{pod}/eviction"

        def post(body: dict[str, Any]) -> int:
            req = urllib.request.Request(
                url, json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        good = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}
        assert post({**good, "metadata": {"name": "other"}}) == 400
        assert post({**good, "kind": "DeleteOptions"}) == 400
        assert post({**good, "metadata": {"name": pod, "namespace": "team-b"}}) == 400
        assert fake.get("", "pods", pod, NS) is not None  # nothing evicted
        assert post(good) == 201 and fake.get("", "pods", pod, NS) is None
