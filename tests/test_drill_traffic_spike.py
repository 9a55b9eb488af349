"""End to end: ``chaos-infer drill run traffic-spike`` against a real lab, figures against ground
truth (the autoscaler's events, HAProxy's request log, the load generator's phase summary).

The lab comes from a plan written by the test (``$CHAOS_INFER_PLAN``): 3 replicas x ``max_num_seqs``
4 (about 24 req/s) plus one standby replica, against the experiment's 8 -> 28 -> 8 req/s profile.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from labutil import alive_pids as _alive
from labutil import check_verdict, drill_run, write_plan
from labutil import lab_events as _events

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.load.clientside import read_run_summary
from chaoslib_infer.load.records import read_records

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.lab]
SPIKE = {"name": "traffic-spike", "experiment": "../experiments/traffic-spike.yaml"}


def _plan(tmp: Path, lab: dict[str, Any]) -> Path:
    return write_plan(tmp, {"name": "test", "lab": lab, "drills": [SPIKE]}, "plan.yaml")


def _shed_ground_truth(out: Path, records: list[dict[str, Any]]) -> int:
    ids = {r["request_id"] for r in records}
    return sum(
        1
        for e in hap.parse_request_log(out / "lab" / "haproxy-requests.log")
        if e.status in (429, 503) and e.request_id in ids
    )


def _shed_diff(out: Path, shed: list[dict[str, Any]]) -> str:
    """The shed request ids only the records, or only HAProxy's log, hold (a failure message)."""
    ids = {r["request_id"] for r in shed}
    logged = {
        e.request_id
        for e in hap.parse_request_log(out / "lab" / "haproxy-requests.log")
        if e.status in (429, 503)
    }
    return f"only in the records: {sorted(ids - logged)}; only in the log: {sorted(logged - ids)}"


def _p(values: list[float], pct: float) -> float:
    """Percentile by hand, at the rank HdrHistogram takes (``pct`` % of the count, rounded; at
    least 1); the figures' HDR values are within 0.1 % of it (docs/definitions.md)."""
    ordered = sorted(values)
    return ordered[max(1, int(pct / 100 * len(ordered) + 0.5)) - 1]


def _e2e(records: list[dict[str, Any]], a: float, b: float) -> list[float]:
    """E2E of the successful records sent in ``[a, b)``, timed from when each was due
    (``intended_at``: coordinated omission corrected, docs/definitions.md)."""
    return [r["end_at"] - r["intended_at"] for r in records if r["ok"] and a <= r["sent_at"] < b]


def _in_band(
    records: list[dict[str, Any]], a: float, b: float, base: dict[str, float], slack: float
) -> bool:
    """The requests sent in ``[a, b)`` are inside the baseline bands, by hand: some were sent,
    some succeeded, P99 E2E <= 1.5x the baseline's (times ``slack``: the figure's HDR
    percentiles are 0.1 % apart from these), error rate <= the baseline's + 0.5 %
    (docs/definitions.md, "Recovery time")."""
    sent = [r for r in records if a <= r["sent_at"] < b and not r.get("cut_off")]
    ok = _e2e(records, a, b)
    if not sent or not ok:
        return False
    err = sum(1 for r in sent if not r["ok"]) / len(sent)
    return _p(ok, 99) <= 1.5 * base["p99"] * slack and err <= base["err"] + 0.005


def _check_recovery(fig: dict[str, Any], gt: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """``recovery_s`` against the records, by hand: the 2 s windows from the spike's end plus
    ``recovery_s`` hold the baseline bands for the 5 s settle (three windows), and a window
    before that point left them (0.0: none had to). The baseline: the profile's first phase,
    the 12 s before the spike (experiments/traffic-spike.yaml ``load_profile``)."""
    a, b = gt["fault_at"] - 12.0, gt["fault_at"]
    base_recs = [r for r in records if a <= r["sent_at"] < b and not r.get("cut_off")]
    base = {
        "p99": _p(_e2e(records, a, b), 99),
        "err": sum(1 for r in base_recs if not r["ok"]) / len(base_recs),
    }
    end, rec = gt["spike_end_at"], fig["recovery_s"]
    assert rec is not None
    back = end + rec
    assert all(_in_band(records, back + 2 * k, back + 2 * k + 2, base, 1.002) for k in range(3))
    if rec > 0:
        before = [end + 2 * k for k in range(round(rec / 2))]
        assert any(not _in_band(records, t, t + 2, base, 0.998) for t in before)


def _check_common(out: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    fig, gt = drill["figures"], drill["ground_truth"]
    records = read_records(out / "traffic-spike" / "records.jsonl")
    # shed requests: the 429/503 records (the figure, exact), and HAProxy's log says the same
    # (the ground truth, exact): the two sources within one request of each other. A CI run on a
    # starved box read 49 shed records against 48 logged lines once (the cause not established:
    # the test now names the request ids that differ)
    shed = [r for r in records if r["status"] in (429, 503)]
    logged = _shed_ground_truth(out, records)
    assert fig["shed_requests"] == len(shed) and gt["shed_requests"] == logged
    assert abs(len(shed) - logged) <= 1, _shed_diff(out, shed)
    assert fig["shed_429"] + fig["shed_503"] == fig["shed_requests"]
    # the spike phase comes from the load generator's own summary: 15 s at 28 req/s
    assert round(gt["spike_end_at"] - gt["fault_at"], 6) == 15.0
    rates = fig["phase_rates"]
    assert [p["planned_rps"] for p in rates] == [8.0, 28.0, 8.0]
    spike_sent = [
        r
        for r in records
        if r["attempt"] == 1 and gt["fault_at"] <= r["intended_at"] < gt["spike_end_at"]
    ]
    assert rates[1]["offered_rps"] == pytest.approx(len(spike_sent) / 15.0)
    assert 20.0 <= rates[1]["offered_rps"] <= 36.0 and rates[0]["offered_rps"] <= 12.0
    # due during the spike, sent or not sent: the records' own count and the load's summary
    summary = read_run_summary(out / "traffic-spike" / "load.log")
    assert summary is not None
    assert fig["requests_during_spike"] == len(spike_sent)
    assert len(spike_sent) == summary["phases"][1]["sent"] + summary["phases"][1]["not_sent"]
    assert fig["not_sent_during_spike"] == sum(1 for r in spike_sent if r.get("not_sent"))
    # the spike's latency and availability against the records sent in it, counted by hand
    spike = [
        r
        for r in records
        if gt["fault_at"] <= r["sent_at"] < gt["spike_end_at"] and not r.get("cut_off")
    ]
    ok_e2e = _e2e(records, gt["fault_at"], gt["spike_end_at"])
    assert fig["p99_e2e_during_spike_s"] == pytest.approx(_p(ok_e2e, 99), rel=2e-3)
    assert fig["availability_during_spike"] == pytest.approx(len(ok_e2e) / len(spike))
    # every fault the drill (and the autoscaler) recorded was cleared by the rollback, which
    # returned the lab to its initial size: the standby is stopped again
    journal = json.loads((out / "traffic-spike" / "journal.json").read_text())
    assert [r["status"] for r in journal["rollbacks"]] == ["succeeded"]
    rollback_end = datetime.fromisoformat(journal["rollbacks"][-1]["end"]).timestamp()
    events = _events(out / "lab")
    injected = {e["fault_id"] for e in events if e.get("phase") == "injected"}
    cleared = {e["fault_id"]: e["t"] for e in events if e.get("phase") == "cleared"}
    assert injected and injected <= set(cleared)
    assert all(cleared[f] <= rollback_end + 0.01 for f in injected)
    assert _alive({int(e["pid"]) for e in events if e.get("pid")}) == []
    return fig, gt, records


def test_traffic_spike_scales_out_and_holds_the_slo(tmp_path: Path) -> None:
    lab = {
        "replicas": 3,
        "standby": 1,
        "autoscale": True,
        "scale_out_queue": 4,
        "scale_out_after_s": 1.0,
        "engine_args": {"max_num_seqs": 4},
    }
    out = tmp_path / "out"
    proc = drill_run("traffic-spike", out, _plan(tmp_path / "plan", lab), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert drill["status"] == "passed" and drill["hypothesis"] == {"before": True, "after": True}
    check_verdict(drill)
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["scale_out_s"]["result"] == "pass" and rows["timeouts_fault"]["result"] == "pass"
    assert rows["recovery_s"]["result"] == "pass"
    # every failure of the spike is a 429/503 shed (none at all on this lab: 0 of 400 in a run)
    assert rows["non_shed_failures_fault"]["value"] == 0.0
    assert rows["availability"]["value"] == rows["availability_fault"]["value"] == 1.0
    fig, gt, records = _check_common(out)

    # the lab's own record of the scale-out
    events = _events(out / "lab")
    trig = [e for e in events if e.get("event") == "scale_out_triggered"]
    assert len(trig) == 1 and trig[0]["replica"] == "r3" == gt["scale_out_replica"]
    serving = [e for e in events if e.get("event") == "scale_out_serving"]
    ready = [e for e in events if e.get("event") == "scale_out_ready"]
    assert len(serving) == 1 and len(ready) == 1
    t_trig, t_ready, t_serving = trig[0]["t"], ready[0]["t"], serving[0]["t"]
    # the trigger comes with the spike: at its start or after, or within the last 2 s of the
    # baseline when a starved box (CI) already queued there (a CI run triggered 0.5 ms before the
    # spike's first phase second, its samples above 4 for the second before)
    assert gt["fault_at"] - 2.0 <= t_trig < t_ready <= t_serving < gt["spike_end_at"]
    assert gt["scale_out_s"] == pytest.approx(t_serving - t_trig, abs=1e-9)
    # client view (send time of r3's first successful request) vs ground truth: within 0.25 s
    assert fig["scale_out_s"] is not None
    assert abs(fig["scale_out_s"] - (t_serving - t_trig)) <= 0.25
    assert fig["cold_start_s"] == pytest.approx(t_ready - t_trig, abs=1e-9)
    assert fig["cold_start_s"] >= 1.0  # the sim engine's weight-load delay
    # the trigger followed the policy: its own samples above 4 for >= 1 s just before it
    samples = [
        json.loads(x) for x in (out / "lab" / "queue-depth.jsonl").read_text().splitlines() if x
    ]
    before = [s for s in samples if t_trig - 1.0 <= s["t"] <= t_trig]
    assert len(before) >= 4 and all(s["depth"] > 4 for s in before)
    assert trig[0]["queue_depth"] > 4
    # the new replica really served (HAProxy log) and the spike was absorbed
    assert any(r["replica"] == "r3" and r["ok"] for r in records)
    assert fig["shed_requests"] == 0 and fig["availability"] == 1.0
    assert fig["p99_e2e_during_spike_s"] <= 10.0
    _check_recovery(fig, gt, records)
    # the rollback put r3 back in standby: stopped (expected exit) after the spike
    exits = [e for e in events if e.get("event") == "exit" and e["replica"] == "r3"]
    assert len(exits) >= 1 and exits[0]["expected"] is True and exits[0]["t"] > gt["spike_end_at"]


def test_traffic_spike_without_autoscaling_and_a_tiny_queue_deviates(tmp_path: Path) -> None:
    lab = {
        "replicas": 3,
        "standby": 1,
        "autoscale": False,
        "engine_args": {"max_num_seqs": 4, "max_waiting": 1},
    }
    out = tmp_path / "out"
    proc = drill_run("traffic-spike", out, _plan(tmp_path / "plan", lab), timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert drill["status"] == "failed"
    check_verdict(drill)
    # the overload was shed as fast 429s (a sane drop policy), but nothing scaled out: the
    # drill-criteria probe deviates on the scale-out, the shed itself fails no probe
    assert drill["hypothesis"] == {"before": True, "after": False}
    journal = json.loads((out / "traffic-spike" / "journal.json").read_text())
    after = {
        p["activity"]["name"]: p["tolerance_met"]
        for p in journal["steady_states"]["after"]["probes"]
    }
    assert after["availability-meets-slo"] is True and after["shed-is-sane"] is True, after
    assert after["drill-criteria-hold"] is False, after
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    for name in ("shed_p99_s", "shed_share_fault", "non_shed_failures_fault"):
        assert rows[name]["result"] == "pass", (name, rows[name])  # shed as 429s, nothing else
    # the fault window's loss: counted (the shed left out), judged by its budget (default policy)
    assert rows["availability_fault"]["value"] == 1.0
    assert rows["availability_fault"]["result"] == "not judged"
    assert rows["budget_share"]["result"] == "pass"
    assert any(
        r.startswith("scale-out (trigger to serving): never scaled out while")
        for r in drill["reasons"]
    ), drill["reasons"]
    assert not any("(availability" in r or "(shed_" in r for r in drill["reasons"])
    fig, gt, records = _check_common(out)
    assert fig["shed_requests"] > 0 and fig["shed_429"] == fig["shed_requests"]
    shed_times = [r["sent_at"] for r in records if r["status"] == 429]
    assert all(gt["fault_at"] - 1.0 <= t <= gt["spike_end_at"] + 1.0 for t in shed_times)
    assert fig["availability_during_spike"] < 0.999
    assert fig["scale_out_s"] is None and gt["scale_outs"] == 0
    assert not any(str(e.get("event")).startswith("scale_out") for e in _events(out / "lab"))


def _shed_by_hand(gt: dict[str, Any], records: list[dict[str, Any]]) -> tuple[int, int]:
    """(shed, sent) in the fault window, by hand: requests sent in the spike or in flight at its
    start, and those answered 429/503 within 1 s (no client retries in this experiment)."""
    window = [
        r
        for r in records
        if not r.get("cut_off")
        and (
            gt["fault_at"] <= r["sent_at"] < gt["spike_end_at"]
            or r["sent_at"] < gt["fault_at"] < r["end_at"]
        )
    ]
    shed = [r for r in window if r["status"] in (429, 503) and r["end_at"] - r["sent_at"] <= 1.0]
    return len(shed), len(window)


def test_a_sane_429_shed_with_a_scale_out_passes(tmp_path: Path) -> None:
    """The engines' queues hold one request each: the spike is shed as fast 429s until the
    standby serves (and in its bursts after). A sane drop policy: PASSED, hypotheses held (the
    shed is judged by its own budget, never as lost availability). With queues this short the
    depth the autoscaler reads flickers between 0 and 3 under the spike (0 throughout the
    baseline), so it scales out at the first sample of 2 or more (``scale_out_after_s: 0``):
    at 0.5 s the depth must hold would miss the spike in some runs."""
    lab = {
        "replicas": 3,
        "standby": 1,
        "autoscale": True,
        "scale_out_queue": 1,
        "scale_out_after_s": 0,
        "engine_args": {"max_num_seqs": 4, "max_waiting": 1},
    }
    out = tmp_path / "out"
    proc = drill_run("traffic-spike", out, _plan(tmp_path / "plan", lab), timeout=240)
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert proc.returncode == 0, (drill["reasons"], proc.stdout[-3000:] + proc.stderr[-3000:])
    assert drill["status"] == "passed" and drill["reasons"] == []
    assert drill["hypothesis"] == {"before": True, "after": True}
    check_verdict(drill)
    fig, gt, records = _check_common(out)
    shed, sent = _shed_by_hand(gt, records)
    assert shed > 0 and fig["shed_429"] == fig["shed_requests"] >= shed  # the engines' 429s
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["shed_share_fault"]["value"] == pytest.approx(shed / sent)
    assert rows["shed_share_fault"]["result"] == "pass" and rows["shed_p99_s"]["result"] == "pass"
    assert rows["availability_fault"]["value"] == 1.0  # the shed is left out, nothing else failed
    assert rows["scale_out_s"]["result"] == "pass"
    _check_recovery(fig, gt, records)
