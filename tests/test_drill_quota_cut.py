"""End to end: ``chaos-infer drill run quota-cut`` against a real lab, figures against ground truth.

The lab comes from a plan written by the test (``$CHAOS_INFER_PLAN``), shaped like the game day's
(3 replicas x ``max_num_seqs`` 4, one standby replica, autoscaler on).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from labutil import alive_pids as _alive
from labutil import check_verdict, drill_run, write_plan
from labutil import lab_events as _events

from chaoslib_infer.capacity import instances
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.metrics import window_stats

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.lab]


def _plan(tmp: Path, lab: dict[str, Any], drill: dict[str, Any]) -> Path:
    """A plan in ``tmp/drills/`` whose sibling ``experiments`` is the checkout's (``drill run`` looks
    experiments up next to the plan's folder)."""
    return write_plan(tmp, {"name": "test", "lab": lab, "drills": [drill]}, "plan.yaml")


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _cap_end(gt: dict[str, Any]) -> float:
    """End of the cap: the rollback starting the first stopped replica (``lift_started_at``),
    never after the ledger's cleared event; checked here against the lab's own start events."""
    lift, restored = gt["lift_started_at"], gt["restored_at"]
    assert lift is not None and lift <= restored
    return float(lift)


def _check_faults_cleared_by_rollback(out: Path, drill: str) -> None:
    """Every fault the drill put in the lab's ledger was cleared by the rollback (before the
    journal ended and the lab went down), and the lab left no process behind."""
    journal = json.loads((out / drill / "journal.json").read_text())
    assert [r["status"] for r in journal["rollbacks"]] == ["succeeded"]
    rollback_end = _unix(journal["rollbacks"][-1]["end"])
    events = _events(out / "lab")
    injected = {e["fault_id"]: e for e in events if e.get("phase") == "injected"}
    cleared = {e["fault_id"]: e for e in events if e.get("phase") == "cleared"}
    assert injected
    for fid in injected:
        assert fid in cleared, f"fault {fid} never cleared"
        assert cleared[fid]["t"] <= rollback_end + 0.01, f"fault {fid} cleared after the drill"
    assert json.loads((out / "lab" / "faults.json").read_text()) == []
    assert _alive({int(e["pid"]) for e in events if e.get("pid")}) == []


GAMEDAY_LAB = {
    "replicas": 3,
    "engine": "sim",
    "standby": 1,
    "autoscale": True,
    "engine_args": {"max_num_seqs": 4},
}


def test_quota_cut_to_the_planned_instances_carries_the_load(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path / "plan",
        GAMEDAY_LAB,
        {"name": "quota-cut", "experiment": "../experiments/quota-cut.yaml"},
    )
    out = tmp_path / "out"
    proc = drill_run("quota-cut", out, plan, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert drill["status"] == "passed", drill["reasons"]
    check_verdict(drill)
    assert drill["hypothesis"] == {"before": True, "after": True}
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["instances_held"]["value"] == 1.0 and rows["instances_held"]["result"] == "pass"
    assert rows["serving_after_vs_baseline"]["result"] == "pass"  # r2 is back after the drill
    # the after window holds enough requests to compare its P99 with the baseline's
    assert drill["verdict"]["windows"]["after"]["requests"] >= 10
    assert rows["p99_after_vs_baseline"]["result"] == "pass", rows["p99_after_vs_baseline"]
    fig, gt = drill["figures"], drill["ground_truth"]
    records = read_records(out / "quota-cut" / "records.jsonl")

    # the quota is the capacity formula for the drill's load: 8 req/s x P50 / max_num_seqs 4 / 0.7
    assert fig["quota_source"] == "formula"
    assert fig["offered_rps"] == 8.0 and fig["max_concurrency_per_instance"] == 4
    steady = window_stats(records, start=gt["fault_at"] - 8.0, end=gt["fault_at"])
    assert abs(fig["expected_latency_s"] - steady["p50_e2e_s"]) <= 0.05
    assert fig["planned_instances"] == instances(8.0, fig["expected_latency_s"], 4, 0.7)
    assert fig["planned_instances"] == math.ceil(8.0 * fig["expected_latency_s"] / 4 / 0.7)
    assert fig["instances_held"] == fig["planned_instances"] == 2
    assert fig["held_at_quota"] is True

    # ground truth: exactly Q replicas served while the cap held (HAProxy's own request log)
    assert gt["kept"] == ["r0", "r1"] and gt["stopped"] == ["r2"]
    assert gt["servers_serving_during_cut"] == gt["kept"]
    assert gt["instances_serving_during_cut"] == fig["instances_held"]
    served = {
        e.server
        for e in hap.parse_request_log(out / "lab" / "haproxy-requests.log")
        if e.forwarded_t is not None and gt["cut_done_at"] <= e.forwarded_t < _cap_end(gt)
    }
    assert served == {"r0", "r1"}
    assert [(e["replica"], e["expected"]) for e in gt["stopped_exits"]] == [("r2", True)]
    assert gt["fault_at"] <= gt["stopped_exits"][0]["t"] <= gt["cut_done_at"] + 0.01
    assert gt["restored_ready_at"]["r2"] >= gt["cut_done_at"]
    assert gt["scale_outs_during_cut"] == 0
    restarts = [
        e["t"]
        for e in _events(out / "lab")
        if e.get("event") == "start" and e["replica"] == "r2" and e["t"] >= gt["cut_done_at"]
    ]
    assert gt["lift_started_at"] == restarts[0]  # the rollback's restart of the stopped replica

    # SLO figures at Q are the records sent while the cap held (counts exact)
    at_q = [r for r in records if gt["cut_done_at"] <= r["sent_at"] < _cap_end(gt)]
    assert fig["quota_requests"] == len(at_q) > 60
    assert fig["quota_availability"] == sum(r["ok"] for r in at_q) / len(at_q) == 1.0
    assert fig["quota_p99_e2e_s"] <= 10.0
    # attempts still on the wire when the load stopped are recorded as cut off, not counted
    assert fig["requests"] == len([r for r in records if not r.get("cut_off")])
    _check_faults_cleared_by_rollback(out, "quota-cut")


def test_quota_cut_to_one_replica_under_a_heavier_load_deviates(tmp_path: Path) -> None:
    lab = {
        **GAMEDAY_LAB,
        "engine_args": {"max_num_seqs": 4, "max_waiting": 4},
        "scale_out_queue": 1,  # the autoscaler wants to scale out, but the quota forbids it
    }
    drill_spec = {
        "name": "quota-cut",
        "experiment": "../experiments/quota-cut.yaml",
        "vars": {"quota": 1, "load_rate_rps": 12},
        "verdict_policy": "strict",  # the SLO rows judged as SLOs over the cut (zero loss)
    }
    plan = _plan(tmp_path / "plan", lab, drill_spec)
    out = tmp_path / "out"
    proc = drill_run("quota-cut", out, plan, timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert drill["status"] == "failed"
    check_verdict(drill)
    assert drill["hypothesis"] == {"before": True, "after": False}
    # the quota is below the plan for the load: the SLO rows say so, with the shedding it
    # caused; the quota's one replica held (served through the cut): not a failure of its own
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["instances_held"]["value"] == 1.0 and rows["instances_held"]["result"] == "pass"
    assert not any("(instances_held)" in r for r in drill["reasons"])
    # one replica at 12 req/s: the cut costs the SLO (requests shed, or slow, over the cut)
    slo_rows = ("availability_fault", "p99_e2e_fault_s", "timeout_rate_fault")
    assert any(rows[c]["result"] == "fail" for c in slo_rows if c in rows), drill["reasons"]
    assert any(f"({c})" in r for c in slo_rows for r in drill["reasons"]), drill["reasons"]
    fig, gt = drill["figures"], drill["ground_truth"]
    assert fig["quota_source"] == "given" and fig["instances_held"] == 1
    assert fig["planned_instances"] == instances(12.0, fig["expected_latency_s"], 4, 0.7) >= 2
    assert fig["held_at_quota"] is False
    assert gt["servers_serving_during_cut"] == ["r0"] and gt["stopped"] == ["r1", "r2"]
    records = read_records(out / "quota-cut" / "records.jsonl")
    at_q = [r for r in records if gt["cut_done_at"] <= r["sent_at"] < _cap_end(gt)]
    shed = [r for r in at_q if r["status"] == 429]
    if rows["availability_fault"]["result"] == "fail":  # the loss is the one replica's shedding
        assert shed
    assert fig["quota_availability"] == (len(at_q) - sum(not r["ok"] for r in at_q)) / len(at_q)
    # the queue stayed above the autoscaler's threshold, yet the cap held: no scale-out at all
    samples = [
        json.loads(x) for x in (out / "lab" / "queue-depth.jsonl").read_text().splitlines() if x
    ]
    capped = [s for s in samples if gt["cut_done_at"] <= s["t"] < _cap_end(gt)]
    longest, since = 0.0, None
    for s in capped:  # the policy's condition: depth above 1 for >= 1 s without a break
        since = (since if since is not None else s["t"]) if s["depth"] > 1 else None
        longest = max(longest, s["t"] - since) if since is not None else longest
    assert longest >= 1.0, longest
    assert gt["scale_outs_during_cut"] == 0
    # ... nor while the rollback restored the stopped replicas (the cap is off the ledger then)
    assert not any(e.get("event") == "scale_out_triggered" for e in _events(out / "lab"))
    _check_faults_cleared_by_rollback(out, "quota-cut")
