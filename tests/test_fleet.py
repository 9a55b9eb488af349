"""Tests for the local lab fleet (supervisord + HAProxy + memory cgroups + recorder).

Tests marked ``lab`` start real processes (a stand-in engine from ``tests/_standin_engine.py``,
supervisord, HAProxy) and need a writable memory cgroup; they are skipped where either is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from labutil import lab_skip_reason, wait_for
from labutil import pid_alive as _alive

from chaoslib_infer.lab import fleet
from chaoslib_infer.lab.cgroups import CgroupError, detect_hierarchy
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.lab.haproxy import parse_request_log, show_stat

STANDIN = Path(__file__).with_name("_standin_engine.py").resolve()
LOAD_DELAY_S = 1.0


def _standin(replica: str, port: int, ledger: Path, args: dict[str, object]) -> list[str]:
    return [
        sys.executable,
        str(STANDIN),
        "--port",
        str(port),
        "--replica-id",
        replica,
        "--ledger",
        str(ledger),
        *fleet.cli_args(args),
    ]


fleet.register_engine("standin", _standin)


_SKIP = lab_skip_reason()
needs_lab = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def _wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    return wait_for(pred, timeout_s, what, poll_s=0.01)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Two stand-in replicas (1 s load delay, 128 MiB each) behind HAProxy."""
    state = tmp_path_factory.mktemp("lab")
    t0 = time.monotonic()
    lab = Lab.up(
        state,
        replicas=2,
        engine="standin",
        memory_limit_mb=128,
        engine_args={"load_delay_s": LOAD_DELAY_S},
        ready_timeout_s=30,
    )
    print(f"\nlab up in {time.monotonic() - t0:.2f} s")
    try:
        yield lab
    finally:
        lab.down()


# --------------------------------------------------------------------------------------------
# No processes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"replicas": 0}, "replicas must be between"),
        ({"engine": "nope"}, "unknown engine 'nope'"),
        ({"memory_limit_mb": 4}, "memory_limit_mb must be at least"),
        ({"port": 70000}, "port must be"),
    ],
)
def test_bad_config_raises_one_line_lab_error(
    tmp_path: Path, kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(LabError) as info:
        Lab.up(tmp_path / "state", **kwargs)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "state" / "lab.json").exists()


def test_missing_haproxy_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet.hap, "find_haproxy", lambda: None)
    with pytest.raises(LabError, match=r"^haproxy not found: apt-get install haproxy$"):
        Lab.up(tmp_path, replicas=1, engine="standin")


def test_attach_without_lab_raises(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no lab in"):
        Lab.attach(tmp_path)


def test_engine_command_sim_and_args(tmp_path: Path) -> None:
    cmd = fleet.engine_command(
        "sim", "r1", 9001, tmp_path / "l.jsonl", {"load_delay_s": 0.5, "zero_latency": True}
    )
    assert cmd[1:3] == ["-m", "chaoslib_infer.lab.engine"]
    assert cmd[cmd.index("--port") + 1] == "9001"
    assert cmd[cmd.index("--replica-id") + 1] == "r1"
    assert cmd[cmd.index("--ledger") + 1] == str(tmp_path / "l.jsonl")
    assert cmd[-3:] == ["--load-delay-s", "0.5", "--zero-latency"]


def test_detect_hierarchy_v2_and_none(tmp_path: Path) -> None:
    v2 = tmp_path / "unified"
    (v2 / "lab").mkdir(parents=True)
    (v2 / "lab" / "cgroup.controllers").write_text("cpu memory pids\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/lab\n")
    mounts = tmp_path / "mountinfo"
    mounts.write_text(f"41 31 0:38 / {v2} rw,relatime - cgroup2 cgroup2 rw\n")
    h = detect_hierarchy(proc, mounts)
    assert (h.version, h.base) == (2, v2 / "lab")
    (v2 / "lab" / "cgroup.controllers").write_text("hugetlb\n")
    with pytest.raises(CgroupError, match="no memory controller"):
        detect_hierarchy(proc, mounts)


# --------------------------------------------------------------------------------------------
# Real processes
# --------------------------------------------------------------------------------------------
@pytest.mark.lab
@needs_lab
def test_status_healthy(lab: Lab) -> None:
    st = lab.status()
    json.dumps(st)
    assert st["running"] is True and st["url"] == lab.url and st["engine"] == "standin"
    assert [r["name"] for r in st["replicas"]] == ["r0", "r1"] == lab.replica_names()
    for rep in st["replicas"]:
        assert rep["state"] == "RUNNING" and rep["healthy"] is True
        assert rep["haproxy_status"].startswith("UP")
        assert rep["memory_limit_bytes"] == 128 << 20
        assert 0 < rep["memory_bytes"] < 128 << 20
        assert Path(rep["cgroup"]).is_dir()
        assert rep["pid"] in [
            int(p) for p in Path(rep["cgroup"], "cgroup.procs").read_text().split()
        ]
    assert st["active_faults"] == []
    ev = lab.events()
    assert {(e["event"], e["replica"]) for e in ev} >= {
        ("start", "r0"),
        ("start", "r1"),
        ("ready", "r0"),
        ("ready", "r1"),
    }
    meta = json.loads((lab.state_dir / "lab.json").read_text())
    assert meta["url"] == lab.url and meta["pids"]["supervisord"] and meta["pids"]["haproxy"]


@pytest.mark.lab
@needs_lab
def test_requests_through_haproxy_reach_both_and_are_logged(lab: Lab) -> None:
    before = time.time()
    seen: dict[str, str] = {}
    with httpx.Client(timeout=5) as client:
        for i in range(10):
            rid = f"fleet-{i}-{os.getpid()}"
            r = client.post(lab.url + "/v1/completions", headers={"X-Request-Id": rid}, json={})
            assert r.status_code == 200
            assert r.headers["X-Lab-Server"] == r.headers["X-Replica-Id"]
            seen[rid] = r.headers["X-Lab-Server"]
    after = time.time()
    assert set(seen.values()) == {"r0", "r1"}

    def logged() -> dict[str, Any]:
        entries = parse_request_log(lab.state_dir / "haproxy-requests.log")
        return {e.request_id: e for e in entries if e.request_id in seen}

    entries = _wait_for(lambda: len(logged()) == len(seen) and logged(), 3.0, "request log lines")
    for rid, entry in entries.items():
        assert entry.server == seen[rid] and entry.status == 200
        assert before - 0.01 <= entry.accept_t <= after + 0.01
        assert entry.request == "POST /v1/completions HTTP/1.1"
        assert entry.forwarded_t is not None
    for name in ("r0", "r1"):
        served = lab.served(name, before)
        assert served is not None and before < served <= after
    assert lab.served("r0", after + 1) is None


@pytest.mark.lab
@needs_lab
def test_sigkill_replica_is_restarted_and_marked_down_then_up(lab: Lab) -> None:
    old = lab.replica_pid("r0")
    assert old
    t_kill = time.time()
    os.kill(old, signal.SIGKILL)

    def non_up() -> bool:
        return not show_stat(lab.state_dir / "haproxy.sock")["r0"]["status"].startswith("UP")

    _wait_for(non_up, 3.0, "HAProxy marking r0 DOWN")
    down_s = time.time() - t_kill

    def restarted() -> dict[str, Any] | None:
        ev = [e for e in lab.events() if e.get("replica") == "r0" and e["t"] >= t_kill - 0.01]
        kinds = [e["event"] for e in ev]
        if kinds[:3] == ["exit", "start", "ready"]:
            return {e["event"]: e for e in ev[:3]}
        return None

    ev = _wait_for(restarted, 10.0, "exit/start/ready events for r0")
    assert ev["exit"]["pid"] == old and ev["exit"]["cause"] == "signal:SIGKILL"
    assert ev["exit"]["t"] - t_kill < 0.2
    assert ev["start"]["pid"] != old and _alive(ev["start"]["pid"])
    assert ev["start"]["t"] - ev["exit"]["t"] < 0.5
    assert ev["ready"]["t"] - ev["start"]["t"] >= LOAD_DELAY_S - 0.05
    assert lab.replica_pid("r0") == ev["start"]["pid"]
    _wait_for(lambda: not non_up(), 5.0, "HAProxy marking r0 UP again")
    print(
        f"\nSIGKILL: exit recorded +{ev['exit']['t'] - t_kill:.3f} s, restart +"
        f"{ev['start']['t'] - t_kill:.3f} s, ready +{ev['ready']['t'] - t_kill:.3f} s, "
        f"HAProxy DOWN +{down_s:.3f} s"
    )
    assert lab.status()["replicas"][0]["restarts"] == 1


@pytest.mark.lab
@needs_lab
def test_oom_kill_is_done_by_the_kernel_and_replica_serves_again(lab: Lab) -> None:
    old = lab.replica_pid("r1")
    assert old
    res = lab.oom_kill("r1", timeout_s=20)
    assert set(res) >= {
        "replica",
        "fault_at",
        "oom_kills_before",
        "oom_kills_after",
        "killed_pid",
        "hog_pid",
        "cgroup",
    }
    assert res["replica"] == "r1" and res["killed_pid"] == old
    # Usually +1; where the hog cannot set oom_score_adj -1000 (no CAP_SYS_RESOURCE) the kernel
    # sometimes also kills the hog in the same OOM episode (+2). The engine dies exactly once.
    assert res["oom_kills_after"] >= res["oom_kills_before"] + 1
    counter = Path(res["cgroup"], "memory.oom_control")
    if counter.exists():  # cgroup v1: read the kernel's own counter
        kernel = dict(ln.split() for ln in counter.read_text().splitlines())
        assert int(kernel["oom_kill"]) >= res["oom_kills_after"] >= 1
    assert not _alive(old) and not _alive(res["hog_pid"])

    def restarted() -> dict[str, Any] | None:
        ev = [e for e in lab.events() if e.get("replica") == "r1" and e["t"] >= res["fault_at"] - 1]
        by: dict[str, dict[str, Any]] = {}
        for e in ev:
            key = e["event"] if e["event"] != "fault" else "fault-" + e["phase"]
            by.setdefault(key, e)
        return (
            by if {"exit", "start", "ready", "fault-injected", "fault-cleared"} <= set(by) else None
        )

    ev = _wait_for(restarted, 10.0, "exit/start/ready events for r1")
    assert ev["exit"]["pid"] == old and ev["exit"]["cause"] == "oom"
    # the kill lies between the last counter read that saw none (fault_at) and the one that saw
    # it: the engine's exit event, stamped after the kill (by supervisord's log line, to the
    # millisecond, truncated), never reads before the fault
    assert res["injected_at"] - 1 < res["fault_at"] <= ev["exit"]["t"] + 0.001, (res, ev["exit"])
    assert res["fault_at"] <= res["oom_observed_at"]
    assert ev["exit"]["status"] == "signal:SIGKILL"  # exit by signal 9 from the kernel
    assert ev["exit"]["oom_kills"] >= 1
    assert ev["start"]["pid"] not in (old, res["hog_pid"])
    exits = [e for e in lab.events() if e["event"] == "exit" and e["t"] >= res["fault_at"] - 1]
    assert [(e["replica"], e["pid"]) for e in exits] == [("r1", old)]
    log = (lab.state_dir / "supervisord.log").read_text()
    assert "exited: r1 (terminated by SIGKILL; not expected)" in log

    with httpx.Client(timeout=5) as client:

        def served_again() -> float | None:
            client.get(lab.url + "/v1/models")
            return lab.served("r1", res["fault_at"])

        served = _wait_for(served_again, 10.0, "r1 serving again")
    print(
        f"\nOOM: kill after {res['fault_at'] - res['injected_at']:.3f} s of pressure, restart +"
        f"{ev['start']['t'] - res['fault_at']:.3f} s, ready +{ev['ready']['t'] - res['fault_at']:.3f} s, "
        f"served again +{served - res['fault_at']:.3f} s"
    )
    st = lab.status()
    assert st["active_faults"] == []
    assert st["replicas"][1]["oom_kills"] >= 1 and st["replicas"][1]["pid"] == ev["start"]["pid"]
    assert lab.clear_faults() == []


@pytest.mark.lab
@needs_lab
def test_attach_from_fresh_object(lab: Lab) -> None:
    other = Lab.attach(lab.state_dir)
    assert other.url == lab.url and other.replica_names() == ["r0", "r1"]
    assert other.engine_name() == "standin"
    st = other.status()
    assert st["running"] and all(r["healthy"] for r in st["replicas"])
    assert [e["event"] for e in other.events()] == [e["event"] for e in lab.events()]


@pytest.mark.lab
@needs_lab
@pytest.mark.skipif(
    importlib.util.find_spec("chaoslib_infer.lab.monitoring") is None
    or __import__("shutil").which("prometheus") is None,
    reason="needs Debian's prometheus package",
)
def test_the_labs_prometheus_scrapes_every_job_and_goes_down_with_the_lab(lab: Lab) -> None:
    """Issue 31: a real Prometheus over the lab: HAProxy's exporter, the cgroup memory (as DCGM
    names), the load client's counters and every replica's /metrics (the stand-in engine has
    none: listed, down); its scrapes never reach the request log; the lab's teardown stops it."""
    from chaoslib_infer.lab import prometheus_server
    from chaoslib_infer.lab.monitoring import start_monitoring
    from chaoslib_infer.measure.prom_api import instant

    log_before = (lab.state_dir / "haproxy-requests.log").read_text(errors="replace").count("\n")
    mon = start_monitoring(lab, interval_s=1.0)
    try:
        url = mon.server.url

        last: list[dict[str, list[str]]] = [{}]

        def scraped() -> dict[str, list[str]] | None:
            ups = instant(url, "up")
            jobs: dict[str, list[str]] = {}
            for r in ups:
                jobs.setdefault(r["metric"]["job"], []).append(r["value"][1])
            last[0] = jobs
            up = all(jobs.get(j) == ["1"] for j in ("haproxy", "lab", "client"))
            return jobs if up and len(jobs.get("engine", [])) == 2 else None

        # every job answered a scrape (one that timed out on a busy machine is tried again);
        # the stand-in engine has no /metrics: its two targets are listed, down
        try:
            _wait_for(scraped, 30, "every job scraped and up")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen: {last[0]}") from None
        assert instant(url, "haproxy_process_uptime_seconds")  # HAProxy's own exporter
        used = {
            r["metric"]["replica"]: float(r["value"][1])
            for r in instant(url, 'DCGM_FI_DEV_FB_USED{stand_in="cgroup-memory"}')
        }
        assert set(used) == {"r0", "r1"}
        for name, mib in used.items():  # the cgroup's own usage, in MiB (a few MiB of drift)
            assert abs(mib - lab.replica_cgroup(name).usage_bytes() / 2**20) < 16
        assert not instant(url, 'ALERTS{severity="page"}')  # an idle lab pages nobody
        assert mon.server.rule_files and all(p.is_file() for p in mon.server.rule_files)
    finally:
        mon.exporter.close()
    log_after = (lab.state_dir / "haproxy-requests.log").read_text(errors="replace").count("\n")
    assert log_after == log_before  # `no log` on the exporter's frontend
    prometheus_server.stop_in(lab.state_dir)  # what Lab.down does
    assert wait_for(
        lambda: mon.server.process and mon.server.process.poll() is not None, 10, "stop"
    )
    assert not (lab.state_dir / "prometheus" / "prometheus.pid").exists()


@pytest.mark.lab
@needs_lab
def test_down_leaves_no_process_and_no_cgroup(lab: Lab) -> None:
    meta = json.loads((lab.state_dir / "lab.json").read_text())
    pids = {int(meta["pids"]["supervisord"]), int(meta["pids"]["haproxy"])}
    pids |= {int(p) for p in meta["pids"]["replicas"].values() if p}
    pids |= {int(e["pid"]) for e in lab.events() if e.get("event") == "start"}
    root = Path(meta["cgroup_root"])
    for d in [root, *root.iterdir()]:
        if (d / "cgroup.procs").exists():
            pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
    assert len(pids) >= 6
    t0 = time.monotonic()
    lab.down()
    print(f"\ndown in {time.monotonic() - t0:.2f} s")
    assert [p for p in pids if _alive(p)] == []
    assert not root.exists()
    lab.down()  # idempotent
    st = Lab.attach(lab.state_dir).status()
    assert st["running"] is False and all(r["state"] == "DOWN" for r in st["replicas"])


@pytest.mark.lab
@needs_lab
@pytest.mark.skipif(
    importlib.util.find_spec("chaoslib_infer.lab.engine") is None,
    reason="sim engine not written yet",
)
def test_real_sim_engine_serves_through_the_lab(tmp_path: Path) -> None:
    lab = Lab.up(tmp_path, replicas=1, engine="sim", engine_args={"load_delay_s": 0.2})
    try:
        r = httpx.get(lab.url + "/health", timeout=5)
        assert r.status_code == 200 and r.headers["X-Lab-Server"] == "r0"
        assert lab.status()["replicas"][0]["healthy"]
    finally:
        lab.down()


@pytest.mark.lab
@needs_lab
def test_crash_looping_engine_fails_fast_and_leaves_nothing(tmp_path: Path) -> None:
    fleet.register_engine(
        "broken",
        lambda r, p, ledger, a: [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
    )
    t0 = time.monotonic()
    with pytest.raises(LabError) as info:
        Lab.up(tmp_path, replicas=1, engine="broken", ready_timeout_s=20)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "r0 keeps exiting (exit:3): boom" in msg and "\n" not in msg
    meta = json.loads((tmp_path / "lab.json").read_text())
    assert not Path(meta["cgroup_root"]).exists()
    assert not _alive(int(meta["pids"]["supervisord"]))
