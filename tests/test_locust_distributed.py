"""Locust's own distribution as the drills' load (``chaoslib_infer.locust.distributed`` and
``.relay``): a real master and ``locust --worker`` processes on loopback, against the fake SSE
server, the workers' records carried to the master by Locust's stats reports.

* every attempt each worker made is in the master's ``records.jsonl`` (the per-worker ledger's
  counts, Locust's own request count), request ids unique, the last reports delivered at the stop;
* a worker SIGKILLed mid-run is reported (``workers_lost``) with its records up to its last report;
* workers that never connect: one clear line naming the worker command;
* the workers as a Kubernetes Indexed Job on the fake API server (exact calls; deleted at the stop
  and when the workers never connect).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import InterruptExecution
from fake_k8s import FakeK8s, write_target
from labutil import free_port as _port
from labutil import write_locustfile as _locustfile

from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import read_records
from chaoslib_infer.locust import control
from chaoslib_infer.locust.distributed import WORKERS_FILE, parse_distributed, read_ledger

if importlib.util.find_spec("locust") is None:  # never import it here (gevent monkey-patching)
    pytest.skip("locust is not installed (extra 'locust')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="ld") as srv:
        yield srv


@pytest.fixture(autouse=True)
def _no_run_left() -> Iterator[None]:
    yield
    for run_dir in list(control._RUNNING):
        control.stop_locust({"infer_run_dir": run_dir})


def _worker(lf: Path | str, port: int, log: Path, env: dict[str, str] | None = None) -> Any:
    """``locust -f LF --worker`` (the operator's command on another machine), in its own folder."""
    cwd = log.parent / log.stem
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "locust", "-f", str(lf), "--worker", "--master-host", "127.0.0.1",
        "--master-port", str(port), "--loglevel", "INFO",
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**ENV, **(env or {})},
            start_new_session=True,
        )  # fmt: skip


def _conf(tmp_path: Path, server: FakeServer) -> dict[str, Any]:
    return {"infer_run_dir": str(tmp_path / "run"), "infer_base_url": server.url}


def _dist(port: int, **more: Any) -> dict[str, Any]:
    return {
        "master_bind_host": "127.0.0.1", "master_bind_port": port, "master_host": "127.0.0.1",
        "connect_timeout_s": 30, **more,
    }  # fmt: skip


def _reap(procs: list[Any], timeout: float = 20.0) -> list[int | None]:
    out = []
    for p in procs:
        try:
            out.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
            out.append(None)
    return out


def _by_worker(records: list[dict[str, Any]], worker: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in records if r["request_id"][:8] in worker["run_ids"]]


def _check_records(records: list[dict[str, Any]]) -> None:
    assert len({(r["request_id"], r["attempt"]) for r in records}) == len(records)
    finals = [r["request_id"] for r in records if r["final"]]
    assert len(set(finals)) == len(finals)  # one logical request, one final attempt


@pytest.mark.serial  # the workers' last reports race the master's stop: run it alone
@pytest.mark.parametrize("stop", ["drill", "run_time"])
def test_every_attempt_of_every_worker_reaches_the_master(
    server: FakeServer, tmp_path: Path, stop: str
) -> None:
    """Stopped with the drill (SIGTERM to the master) or by Locust's own run-time limit (-t),
    with streams of ~1.2 s: users are mid-stream at the stop, and their last records come after
    the 0.5 s Locust's master alone waits for its workers' last reports."""
    lf, port = _locustfile(tmp_path), _port()
    conf = {**_conf(tmp_path, server), "infer_base_url": server.url + "/tokens=8,itl=0.15"}
    workers = [_worker(lf, port, tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        out = control.start_locust(
            str(lf), users=4, warmup_s=2, max_duration_s=60 if stop == "drill" else 7,
            stop_timeout_s=3, distributed=_dist(port, expect_workers=2),
            extra_args=["--json-file", str(tmp_path / "run" / "locust_final")],
            configuration=conf,
        )  # fmt: skip
        assert out["engine"] == "locust" and "closed loop" in out["note"]
        if stop == "drill":
            time.sleep(5)
        else:  # the master stops its workers and quits by itself
            run = control._RUNNING[str((tmp_path / "run").resolve())]
            assert run.proc.wait(timeout=30) == 0
    finally:
        report = control.stop_locust(conf)
        codes = _reap(workers)
    assert codes == [0, 0]  # the master told them to quit after the stop
    assert report is not None and report["exit_code"] == 0
    assert report["workers_lost"] == []
    ws = report["workers"]
    assert len(ws) == 2 and sorted(w["pid"] for w in ws) == sorted(p.pid for p in workers)
    records = read_records(tmp_path / "run" / "records.jsonl")
    _check_records(records)
    for w in ws:
        mine = _by_worker(records, w)
        assert w["ended"] == "stopped" and w["last_report_delivered"]
        assert len(mine) == w["records_delivered"] == w["records_made"] > 3
        assert w["records_missing"] == 0 and w["reports"] >= 2
    assert sum(w["records_delivered"] for w in ws) == len(records)
    assert report["records_delivered"] == {w["worker"]: w["records_delivered"] for w in ws}
    # ground truth: every request the server received from these workers has its record (the
    # ones cut at the stop included), and every attempt that ended before the stop was received
    runs = {i for w in ws for i in w["run_ids"]}
    received = Counter(rid for rid in server.request_ids if rid[:8] in runs)
    assert received and not received - Counter(r["request_id"] for r in records)
    ended = Counter(r["request_id"] for r in records if r["error_class"] != "cut_off")
    assert not ended - received
    # Locust's own count (its master's final stats, written as it quits) misses at most the
    # workers' last reports, which our control waits for (CI saw 16 of 18, 20 of 24): never more
    stats = json.loads((tmp_path / "run" / "locust_final.json").read_text())
    posts = [e for e in stats if e["method"] == "POST"]
    seen = [r for r in records if r["error_class"] != "cut_off"]
    assert 0 < sum(e["num_requests"] for e in posts) <= len(seen)
    assert sum(e["num_failures"] for e in posts) == sum(not r["ok"] for r in seen)
    saved = json.loads((tmp_path / "run" / control.LOCUST_FILE).read_text())
    assert saved["note"] == control.CO_NOTE and saved["workers_lost"] == []
    assert saved["distributed"]["worker_command"] == (
        f"locust -f {lf} --worker --master-host 127.0.0.1 --master-port {port}"
    )
    ledger = read_ledger(tmp_path / "run" / WORKERS_FILE)
    assert ledger is not None and ledger["final"] and ledger["records_written"] == len(records)
    assert control.stop_locust(conf) is None


def test_a_killed_worker_is_reported_with_its_records_up_to_its_last_report(
    server: FakeServer, tmp_path: Path
) -> None:
    """Three workers: one SIGKILLed (no heartbeat: lost, its records up to its last report), one
    SIGTERMed (quits during the run: lost, its last report delivered), one to the end."""
    lf, port = _locustfile(tmp_path), _port()
    conf = _conf(tmp_path, server)
    workers = [_worker(lf, port, tmp_path / f"worker-{i}.log") for i in range(3)]
    victim, quitter, survivor = workers
    ledger_path = tmp_path / "run" / WORKERS_FILE
    try:
        control.start_locust(
            str(lf), users=6, warmup_s=2, max_duration_s=60, stop_timeout_s=1,
            distributed=_dist(port, expect_workers=3), configuration=conf,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # both have delivered at least one report
            doc = read_ledger(ledger_path) or {}
            reported = {w["pid"] for w in doc.get("workers", []) if w["records"]}
            if {victim.pid, quitter.pid} <= reported:
                break
            time.sleep(0.2)
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.time()
        os.kill(quitter.pid, signal.SIGTERM)
        while time.monotonic() < deadline + 10:  # Locust: no heartbeat for ~3 s -> missing
            if len((read_ledger(ledger_path) or {}).get("workers_lost") or []) == 2:
                break
            time.sleep(0.2)
        time.sleep(1)
    finally:
        report = control.stop_locust(conf)
        codes = _reap(workers)
    assert codes == [-signal.SIGKILL, 0, 0]
    assert report is not None
    lost = {w["pid"]: w for w in report["workers_lost"]}
    assert sorted(lost) == sorted([victim.pid, quitter.pid])
    assert lost[victim.pid]["reason"] == "missing" and lost[quitter.pid]["reason"] == "quit"
    assert not lost[victim.pid]["last_report_delivered"]
    assert lost[victim.pid]["last_report_at"] < killed_at
    assert lost[quitter.pid]["last_report_delivered"]  # stopped its users, then sent the rest
    records = read_records(tmp_path / "run" / "records.jsonl")
    _check_records(records)
    by_pid = {w["pid"]: w for w in report["workers"]}
    assert by_pid[victim.pid]["ended"] == "missing" and by_pid[quitter.pid]["ended"] == "quit"
    assert by_pid[survivor.pid]["ended"] == "stopped"
    for p in workers:
        w = by_pid[p.pid]
        assert len(_by_worker(records, w)) == w["records_delivered"] > 0
        assert w["records_missing"] == 0
        if p is not victim:
            assert w["last_report_delivered"] and w["records_made"] == w["records_delivered"]
    assert lost[victim.pid]["records_delivered"] == by_pid[victim.pid]["records_delivered"]
    assert sum(w["records_delivered"] for w in report["workers"]) == len(records)


def test_workers_that_never_connect_fail_the_start_in_one_line(
    server: FakeServer, tmp_path: Path
) -> None:
    lf, port = _locustfile(tmp_path), _port()
    conf = _conf(tmp_path, server)
    t0 = time.monotonic()
    with pytest.raises(InterruptExecution) as err:
        control.start_locust(
            str(lf), users=2, distributed=_dist(port, expect_workers=1, connect_timeout_s=3),
            configuration=conf,
        )  # fmt: skip
    msg = str(err.value)
    assert "\n" not in msg and time.monotonic() - t0 < 20
    assert re.search(
        r"0 of 1 Locust worker\(s\) connected to the master \(port \d+\) within 3 s", msg
    )
    assert f"locust -f {lf} --worker --master-host 127.0.0.1 --master-port {port}" in msg
    assert control._RUNNING == {}
    saved = json.loads((tmp_path / "run" / control.LOCUST_FILE).read_text())
    assert saved["exit_code"] is not None  # the master was stopped


@pytest.mark.parametrize(
    ("spec", "processes", "match"),
    [
        ({"expect_workers": 2}, 2, "'processes' forks workers on this machine"),
        ({"expect_workers": 2, "port": 1}, 1, "unknown key.*port"),
        ({}, 1, "give expect_workers"),
        ({"expect_workers": 0}, 1, "expect_workers must be an integer"),
        ({"kubernetes": {"workers": 2}}, 1, "give master_host"),
        ({"kubernetes": {"workers": 2, "nodes": 1}, "master_host": "h"}, 1, "unknown key.*nodes"),
        ({"kubernetes": {"workers": 3}, "expect_workers": 2, "master_host": "h"}, 1, "less than"),
        ("4", 1, "must be a mapping"),
    ],
)
def test_bad_distributed_options(spec: Any, processes: int, match: str) -> None:
    with pytest.raises(InterruptExecution, match=match):
        parse_distributed(spec, processes)


def test_distributed_defaults() -> None:
    d = parse_distributed({"kubernetes": {"workers": 3}, "master_host": "10.0.0.5"}, 1)
    assert d is not None and d.expect_workers == 3 and d.master_bind_host == "*"
    assert d.master_bind_port == 5557 and d.kubernetes is not None
    assert d.kubernetes.namespace == "chaos-infer" and d.kubernetes.image.startswith("chaoslib-")
    assert parse_distributed(None, 4) is None


# -- the workers as a Kubernetes Indexed Job ---------------------------------------------------


def _kubelet(fake: FakeK8s, tmp_path: Path) -> Any:
    """Run a Job pod's container like a kubelet: its env, its own temporary folder (the
    emptyDir), ``locust`` as this interpreter's; SIGTERM when the pod is deleted."""

    def run(pod: dict[str, Any]) -> tuple[int, str]:
        (c,) = pod["spec"]["containers"]
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        env = {e["name"]: e["value"] for e in c.get("env") or []}
        mount = tmp_path / "pods" / name
        mount.mkdir(parents=True)
        env = {k: v.replace("/work/out", str(mount)) for k, v in env.items()}
        assert c["command"] == ["locust"]
        log = mount / "log"
        with log.open("wb") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", "locust", *c["args"]], cwd=mount, stdout=out,
                stderr=subprocess.STDOUT, env={**ENV, **env}, start_new_session=True,
            )  # fmt: skip
            while p.poll() is None:
                if fake.get("", "pods", name, ns) is None:  # deleted: SIGTERM, then SIGKILL
                    os.killpg(p.pid, signal.SIGTERM)
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                    break
                time.sleep(0.1)
            p.wait(10)
        return p.returncode, log.read_text(errors="replace")

    return run


def test_workers_as_an_indexed_job(server: FakeServer, tmp_path: Path) -> None:
    lf, port = _locustfile(tmp_path), _port()
    with FakeK8s() as fake:
        fake.run_pod = _kubelet(fake, tmp_path)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = write_target(tmp_path / "t.yaml", kubeconfig, url=server.url)
        conf = {**_conf(tmp_path, server), "infer_k8s_target": str(target)}
        try:
            control.start_locust(
                str(lf), users=4, warmup_s=2, max_duration_s=60, stop_timeout_s=1,
                distributed=_dist(port, kubernetes={"workers": 2, "image": "reg/ci:1"}),
                configuration=conf,
            )  # fmt: skip
            time.sleep(3)
        finally:
            report = control.stop_locust(conf)
        calls = [(r.method, re.sub(r"locust-\d+", "locust-T", r.path)) for r in fake.requests]
        job_body = fake.requests[0].body
        delete_query = fake.requests[-1].query
        assert fake.list("batch", "jobs") == []
    # (leaving the fake joins its kubelet threads: the pods' workers have exited)
    base = "/apis/batch/v1/namespaces/chaos-infer/jobs"
    assert calls[0] == ("POST", base)
    assert set(calls[1:-1]) == {("GET", f"{base}/chaos-infer-locust-T")}  # status reads
    assert calls[-1] == ("DELETE", f"{base}/chaos-infer-locust-T")
    assert delete_query.get("propagationPolicy") == "Background"  # the pods go too
    spec = job_body["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] > 60
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["image"] == "reg/ci:1" and c["command"] == ["locust"]
    assert c["args"] == [
        "-f", "-", "--worker", "--master-host", "127.0.0.1", "--master-port", str(port),
    ]  # fmt: skip
    assert report is not None and report["workers_lost"] == []
    k8s = report["distributed"]["kubernetes"]
    assert k8s["deleted"] and k8s["namespace"] == "chaos-infer" and k8s["workers"] == 2
    records = read_records(tmp_path / "run" / "records.jsonl")
    _check_records(records)
    ws = report["workers"]
    assert len(ws) == 2 and all(w["last_report_delivered"] for w in ws)
    assert [len(_by_worker(records, w)) for w in ws] == [w["records_delivered"] for w in ws]
    assert all(w["records_delivered"] > 5 for w in ws)
    # each pod fetched the locustfile from the master (-f -) and quit when told
    logs = sorted((tmp_path / "pods").glob("*/log"))
    assert len(logs) == 2
    assert Counter("Got quit message from master" in p.read_text() for p in logs)[True] == 2


def test_a_job_whose_workers_never_connect_is_deleted(server: FakeServer, tmp_path: Path) -> None:
    lf, port = _locustfile(tmp_path), _port()
    with FakeK8s() as fake:  # no kubelet: the pods stay Pending
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = write_target(tmp_path / "t.yaml", kubeconfig, url=server.url)
        conf = {**_conf(tmp_path, server), "infer_k8s_target": str(target)}
        with pytest.raises(InterruptExecution, match=r"0 of 2 Locust worker.*Job chaos-infer/"):
            control.start_locust(
                str(lf), users=2,
                distributed=_dist(port, connect_timeout_s=3, kubernetes={"workers": 2}),
                configuration=conf,
            )  # fmt: skip
        assert fake.list("batch", "jobs") == []
        assert fake.calls("DELETE")[-1].path.startswith("/apis/batch/v1/namespaces/chaos-infer/")
    assert control._RUNNING == {}


def test_a_job_outside_the_allowlist_is_never_created(server: FakeServer, tmp_path: Path) -> None:
    lf, port = _locustfile(tmp_path), _port()
    with FakeK8s() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig", contexts=("prod-eu",))
        target = write_target(tmp_path / "t.yaml", kubeconfig, context="prod-eu")
        conf = {**_conf(tmp_path, server), "infer_k8s_target": str(target)}
        with pytest.raises(InterruptExecution, match="kubernetes: .*prod-eu"):
            control.start_locust(
                str(lf), users=2, distributed=_dist(port, kubernetes={"workers": 1}),
                configuration=conf,
            )  # fmt: skip
        assert fake.requests == []
    assert control._RUNNING == {}
