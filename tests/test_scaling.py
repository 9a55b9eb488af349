"""Capacity formula, scale-out policy, and the lab's standby replicas and replica cap.

The formula and the policy are pure; the last test runs a real lab (supervisord, HAProxy, engines)
and checks that starting/stopping a standby and capping/restoring replicas leave it whole.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from chaoslib_infer.capacity import instances, plan
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.lab.scaling import (
    HOLD_FILE,
    ScaleOutPolicy,
    _hold,
    cap_replicas,
    mark_standby_servers,
    replica_cap,
    scaling_held,
    scaling_options,
    serving_replicas,
    standby_names,
    start_replica,
    stop_replica,
)

# -- capacity formula (docs/definitions.md) -------------------------------------------------


def test_capacity_formula_reproduces_the_seed_example() -> None:
    assert instances(200, 1.0, 20, 0.7) == 15
    cap = plan(200, 1.0, 20, 0.7)
    assert cap.raw == pytest.approx(14.2857, abs=1e-4)
    assert cap.autoscaler_min == 9  # ~60% of 15, rounded up
    assert cap.acceptance_qps == 300.0  # 1.5x the peak
    assert cap.describe() == "200 QPS x 1 s / 20 / 0.7 = 14.29 -> 15 instances"


def test_capacity_formula_rounds_up_but_not_float_noise() -> None:
    assert instances(200, 1.0, 20, 0.5) == 20  # exactly 20: no spurious 21st instance
    assert instances(201, 1.0, 20, 0.5) == 21
    assert instances(0.1, 0.01, 64, 1.0) == 1  # never fewer than one instance
    assert instances(8, 0.47, 4, 0.7) == 2  # the quota-cut drill's lab: 1.34 -> 2
    assert instances(3, 0.1, 1) == 1  # default redundancy 0.7: 0.43 -> 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((0, 1.0, 20, 0.7), "peak_qps"),
        ((-5, 1.0, 20, 0.7), "peak_qps"),
        ((200, 0, 20, 0.7), "expected_latency_s"),
        ((200, 1.0, 0, 0.7), "max_concurrency_per_instance"),
        ((200, 1.0, 20, 0), "redundancy_factor"),
        ((200, 1.0, 20, 1.2), "redundancy_factor"),
        ((math.nan, 1.0, 20, 0.7), "peak_qps"),
        ((200, math.inf, 20, 0.7), "expected_latency_s"),
        ((True, 1.0, 20, 0.7), "peak_qps"),
        (("200", 1.0, 20, 0.7), "peak_qps"),
        ((1e308, 1e308, 1e-308, 0.7), "overflows"),
    ],
)
def test_capacity_formula_rejects_nonsense(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        plan(*args)


# -- scale-out policy -------------------------------------------------------------------------


def test_policy_needs_the_depth_above_threshold_for_the_whole_duration() -> None:
    pol = ScaleOutPolicy(threshold=4, after_s=1.0, cooldown_s=10.0)
    assert pol.observe(0.0, 5) is False
    assert pol.observe(0.5, 9) is False
    assert pol.observe(0.75, 4) is False  # not *above* the threshold: the clock restarts
    assert pol.observe(1.0, 5) is False
    assert pol.observe(1.75, 5) is False
    assert pol.observe(2.0, 5) is True  # 1.0 s above since t=1.0
    pol.fired(2.0)
    assert pol.observe(2.25, 50) is False  # a new overload period starts
    assert pol.observe(3.5, 50) is False  # above for 1.25 s, but inside the cooldown
    assert pol.observe(11.75, 50) is False
    assert pol.observe(12.0, 50) is True  # cooldown over (10 s after the trigger)


def test_policy_without_a_scale_out_keeps_asking() -> None:
    pol = ScaleOutPolicy(threshold=0, after_s=0.5, cooldown_s=0)
    assert [pol.observe(t / 4, 1) for t in range(5)] == [False, False, True, True, True]


def test_undo_holds_the_autoscaler_only_while_it_runs(tmp_path: Path) -> None:
    lab = Lab(tmp_path, {"replicas": []})
    assert scaling_held(lab) is False
    with _hold(lab, "undo quota-cut", max_s=30):
        assert scaling_held(lab) is True
    assert scaling_held(lab) is False
    (tmp_path / HOLD_FILE).write_text(json.dumps({"until": time.time() - 1, "reason": "crashed"}))
    assert scaling_held(lab) is False  # a hold left by a killed undo expires


def test_scaling_options_are_validated() -> None:
    opts = scaling_options(3, standby=1, autoscale=True, scale_out_queue=2)
    assert opts["standby"] == 1 and opts["autoscale"] is True and opts["scale_out_queue"] == 2.0
    assert scaling_options(2)["standby"] == 0
    with pytest.raises(LabError, match="needs at least one standby"):
        scaling_options(3, standby=0, autoscale=True)
    with pytest.raises(LabError, match="standby must be"):
        scaling_options(3, standby=-1)
    with pytest.raises(LabError, match="at most 32"):
        scaling_options(30, standby=3)
    with pytest.raises(LabError, match="scale_out_after_s"):
        scaling_options(3, standby=1, scale_out_after_s=-1)
    with pytest.raises(LabError, match="autoscale must be"):
        scaling_options(3, standby=1, autoscale="yes")  # type: ignore[arg-type]


def test_standby_servers_start_in_maintenance() -> None:
    cfg = hap.render_config("x", 8800, [("r0", 1), ("r1", 2)], Path("/tmp/s.sock"))
    out = mark_standby_servers(cfg, ["r1"])
    assert "    server r1 127.0.0.1:2 check disabled\n" in out
    assert "    server r0 127.0.0.1:1 check\n" in out
    with pytest.raises(LabError, match="r9"):
        mark_standby_servers(cfg, ["r9"])


def test_lab_up_rejects_bad_scaling_options(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="standby"):
        Lab.up(tmp_path / "lab", replicas=2, autoscale=True)
    assert not (tmp_path / "lab" / "lab.json").exists()  # nothing started


# -- the real lab -----------------------------------------------------------------------------


def _served_by(url: str, n: int) -> list[str]:
    """Send ``n`` small completions through HAProxy; return the replica of each response."""
    u = urlparse(url)
    out = []
    body = json.dumps(
        {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    for _ in range(n):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        try:
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            out.append(resp.getheader("X-Replica-Id") or "")
        finally:
            conn.close()
    return out


def _whole(lab: Lab, serving: list[str]) -> None:
    status = lab.status()
    assert status["active_faults"] == []
    by_name = {r["name"]: r for r in status["replicas"]}
    for name in serving:
        assert by_name[name]["state"] == "RUNNING"
        assert by_name[name]["haproxy_status"].startswith("UP")  # "UP 1/2": checks catching up
    for name in standby_names(lab):
        assert by_name[name]["state"] in ("STOPPED", "EXITED")
        assert by_name[name]["haproxy_status"] == "MAINT"
        assert by_name[name]["standby"] is True
    assert serving_replicas(lab) == serving
    lab.wait_healthy(10.0)


@pytest.mark.lab
def test_standby_start_stop_and_replica_cap_leave_the_lab_whole(tmp_path: Path) -> None:
    lab = Lab.up(tmp_path / "lab", replicas=2, standby=1, engine_args={"load_delay_s": 0.5})
    try:
        assert lab.replica_names() == ["r0", "r1"]
        assert standby_names(lab) == ["r2"]
        _whole(lab, ["r0", "r1"])
        assert "r2" not in _served_by(lab.url, 12)  # a standby takes no traffic

        t0 = time.time()
        up = start_replica(lab, "r2", timeout_s=15)
        assert up["ready_at"] - up["started_at"] >= 0.5  # it paid its weight-load delay
        assert serving_replicas(lab) == ["r0", "r1", "r2"]
        assert "r2" in _served_by(lab.url, 12)
        served = lab.served("r2", after=t0)  # ground truth: HAProxy log / engine ledger
        assert served is not None and served >= up["enabled_at"] - 0.01
        starts = [e for e in lab.events() if e.get("event") == "start" and e["replica"] == "r2"]
        assert len(starts) == 1 and starts[0]["t"] >= t0

        down = stop_replica(lab, "r2")
        assert down["drained"] is True
        _whole(lab, ["r0", "r1"])

        cut = cap_replicas(lab, 1)
        assert (cut["kept"], cut["stopped"]) == (["r0"], ["r1"])
        assert replica_cap(lab) == 1
        faults = lab.status()["active_faults"]
        assert [f["kind"] for f in faults] == ["quota-cut"] and faults[0]["stopped"] == ["r1"]
        by_name = {r["name"]: r for r in lab.status()["replicas"]}
        assert by_name["r1"]["state"] == "STOPPED" and by_name["r1"]["haproxy_status"] == "MAINT"
        t1 = time.time()
        assert set(_served_by(lab.url, 10)) == {"r0"}
        assert lab.served("r1", after=t1) is None
        with pytest.raises(LabError, match="already active"):
            cap_replicas(lab, 1)

        notes = lab.clear_faults()
        assert len(notes) == 1 and "restored r1" in notes[0]
        assert replica_cap(lab) is None
        _whole(lab, ["r0", "r1"])
        assert set(_served_by(lab.url, 12)) == {"r0", "r1"}
        exits = [e for e in lab.events() if e.get("event") == "exit"]
        assert {(e["replica"], e["expected"]) for e in exits} == {("r2", True), ("r1", True)}
        assert not any(str(e.get("event")).startswith("scale_out") for e in lab.events())
    finally:
        lab.down()
