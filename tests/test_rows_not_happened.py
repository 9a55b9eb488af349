"""No row for what did not happen (issue 21, item 4).

A criterion about an event that did not occur reads ``n/a`` with its why (never ``pass``); no
reason renders ``None``; recovery skips thin windows and reads ``unmeasured`` when the load
ended before a recovery could be shown or refuted. Synthetic records (unix seconds) through the
real figure and judge code.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_verdict import GOOD, T0, facts, rec, steady

from chaoslib_infer.evidence.scorecard import build_scorecard
from chaoslib_infer.evidence.verdicts import hypothesis_failures
from chaoslib_infer.measure.figures import (
    MIN_BUCKET_REQUESTS,
    RECOVERY_UNMEASURED,
    recovery,
    recovery_outcome,
)
from chaoslib_infer.verdict import judge_drill

BASE = {"p99_e2e_s": 0.3, "error_rate": 0.0}
RATE = 8.0  # requests/s: 16 per 2 s window


def load(a: float, b: float, rate: float = RATE, **kw: Any) -> list[dict[str, Any]]:
    """Records sent at ``rate`` from ``a`` to ``b`` (s after T0)."""
    n = round((b - a) * rate)
    return [rec(T0 + a + i / rate, **kw) for i in range(n)]


def no_none(v: Any) -> None:
    """No reason, row note or note of the verdict renders ``None``."""
    texts = [*v.reasons, *v.notes, *(str(r["note"]) for r in v.rows if r["note"] is not None)]
    assert not [t for t in texts if "None" in t], texts


# -- recovery --------------------------------------------------------------------------------


def test_recovery_after_an_impact_is_the_start_of_the_settled_run() -> None:
    recs = load(0, 4, ok=False) + load(4, 20)
    assert recovery_outcome(recs, T0, BASE) == (4.0, None)
    assert recovery(recs, T0, BASE) == 4.0
    assert recovery_outcome(load(0, 20), T0, BASE) == (0.0, None)  # no impact


def test_a_service_out_of_band_to_the_end_never_recovered() -> None:
    recs = load(0, 4) + load(4, 20, e2e=2.0)
    rec_s, note = recovery_outcome(recs, T0, BASE)
    assert rec_s is None and note == "never back inside the baseline bands before the load ended"


def test_one_slow_request_in_the_loads_thin_last_window_is_not_never() -> None:
    # impact 0-4 s, then in band for 4 s (< the 5 s settling), then the load's last partial
    # window: 3 requests, one of them slow. It used to read "never back".
    recs = load(0, 4, ok=False) + load(4, 8) + load(8, 8.25) + [rec(T0 + 8.3, e2e=0.8)]
    assert len([r for r in recs if r["sent_at"] >= T0 + 8]) < MIN_BUCKET_REQUESTS
    rec_s, note = recovery_outcome(recs, T0, BASE)
    assert rec_s is None and note is not None and note.startswith(RECOVERY_UNMEASURED)
    assert "4 s in band at its end" in note
    # even judged (no minimum), one window out of band at the end is not "never back"
    assert str(recovery_outcome(recs, T0, BASE, min_requests=1)[1]).startswith(RECOVERY_UNMEASURED)


def test_one_slow_request_in_the_last_full_window_after_a_return_is_unmeasured() -> None:
    recs = load(0, 4, ok=False) + load(4, 8) + load(8, 9.9) + [rec(T0 + 9.95, e2e=0.8)]
    rec_s, note = recovery_outcome(recs, T0, BASE)
    assert rec_s is None and note is not None and note.startswith(RECOVERY_UNMEASURED)


def test_a_thin_window_neither_breaks_nor_extends_a_run() -> None:
    # a trickle from 6 to 8 s (2 requests, one slow) inside an otherwise settled return
    recs = load(0, 4, ok=False) + load(4, 6) + [rec(T0 + 6.5), rec(T0 + 7, e2e=2.0)] + load(8, 14)
    assert recovery_outcome(recs, T0, BASE) == (4.0, None)
    with pytest.raises(ValueError, match="min_requests"):
        recovery_outcome(recs, T0, BASE, min_requests=0)


def spike(figures: dict[str, Any]) -> Any:
    ground, fig = (dict(x) for x in GOOD["traffic-spike"])
    return judge_drill(facts("traffic-spike", steady(T0, T0 + 35), {**fig, **figures}, ground))


def test_traffic_spike_recovery_unmeasured_when_the_load_ended_first() -> None:
    note = RECOVERY_UNMEASURED + "the load ended before 5 s in the baseline bands could be seen"
    v = spike({"recovery_s": None, "recovery_note": note})
    row = {r["criterion"]: r for r in v.rows}["recovery_s"]
    assert row["result"] == "unmeasured" and row["note"] == note
    assert v.state == "inconclusive"  # the key row: the drill cannot answer its question
    assert any("(recovery_s)" in r and "unmeasured" in r for r in v.reasons), v.reasons
    no_none(v)


def test_traffic_spike_recovery_never_back_still_fails_and_a_recovery_passes() -> None:
    never = "never back inside the baseline bands before the load ended"
    v = spike({"recovery_s": None, "recovery_note": never})
    row = {r["criterion"]: r for r in v.rows}["recovery_s"]
    assert row["result"] == "fail" and v.state == "failed"
    assert f"back inside the baseline bands after the spike: {never} (recovery_s)" in v.reasons, (
        v.reasons
    )
    ok = spike({"recovery_s": 5.0, "recovery_note": None})
    assert (
        ok.state == "passed"
        and {r["criterion"]: r for r in ok.rows}["recovery_s"]["result"] == "pass"
    )


# -- node-loss: no replica moved -------------------------------------------------------------


def node_loss(moved: int, serving: tuple[int | None, int | None] = (3, 3)) -> Any:
    ground, fig = (dict(x) for x in GOOD["node-loss"])
    ground |= {"node_up_by": "rollback", "node_up_at": T0 + 50}
    # the replica served again only when the rollback restored its node: 43.9 s
    fig |= {"lost_replicas": 1, "moved_replicas": moved, "replacement_serving_s": 43.9}
    return judge_drill(facts("node-loss", steady(T0, T0 + 35), fig, ground, serving=serving))


def test_node_loss_with_no_replica_moved_reads_na_not_pass() -> None:
    v = node_loss(moved=0)
    rows = {r["criterion"]: r for r in v.rows}
    why = (
        "no replica moved: the 1 lost replica(s) were not rescheduled onto another node; they "
        "served again on node n0 once it came back (rollback)"
    )
    for name in ("replacement_serving_s", "serving_after_vs_baseline"):
        assert rows[name]["result"] == "n/a" and rows[name]["value"] is None, rows[name]
        assert rows[name]["note"] == why
    assert v.state == "passed", v.reasons  # the interruption, the other key row, was met
    no_none(v)


def test_node_loss_that_moved_its_replica_is_judged() -> None:
    rows = {r["criterion"]: r for r in node_loss(moved=1).rows}
    assert rows["replacement_serving_s"]["result"] == "pass"
    assert rows["replacement_serving_s"]["value"] == 43.9
    assert rows["serving_after_vs_baseline"]["result"] == "pass"


def test_node_loss_with_no_move_that_ended_smaller_still_fails() -> None:
    v = node_loss(moved=0, serving=(3, 2))
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["replacement_serving_s"]["result"] == "n/a"
    assert rows["serving_after_vs_baseline"]["result"] == "fail" and v.state == "failed"
    assert any(r.endswith("(serving_after_vs_baseline)") for r in v.reasons), v.reasons


# -- quota-cut: what held --------------------------------------------------------------------


def quota_cut(ground: dict[str, Any], fig: dict[str, Any], records: Any = None) -> Any:
    g, f = (dict(x) for x in GOOD["quota-cut"])
    g.update(ground)
    f.update(fig)
    for k in [k for k, v in g.items() if v is None]:
        del g[k]
    recs = steady(T0, T0 + 35) if records is None else records
    return judge_drill(facts("quota-cut", recs, f, g))


def test_quota_cut_judges_the_replicas_that_served_against_the_quota() -> None:
    v = quota_cut({"instances_serving_during_cut": 2}, {"planned_instances": 3})
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    # quota 2 below a plan of 3: the operator's setting, not a failure of the quota's replicas
    assert row["value"] == 1.0 and row["result"] == "pass" and v.state == "passed", v.reasons
    assert row["note"] == (
        "2 of the quota's 2 replicas served within the SLO during the cut (records, HAProxy "
        "request log; plan: 3); "
        "load carried: r0 40, r1 78"  # r2 stopped: its share moved to r1 (test_verdict.felt)
    )


def test_quota_cut_with_a_kept_replica_not_serving_fails() -> None:
    v = quota_cut({"instances_serving_during_cut": 1}, {})
    assert v.state == "failed"
    assert "replicas serving during the cut / quota: 0.5x < 1x (instances_held)" in v.reasons
    no_none(v)


def test_quota_cut_without_the_lab_log_counts_the_replicas_in_the_records() -> None:
    # no HAProxy log: the fault window's successful records, which name r0 and r1 only
    recs = [rec(T0 + i / 10, replica=("r0", "r1")[i % 2]) for i in range(350)]
    v = quota_cut({"instances_serving_during_cut": None}, {}, recs)
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    assert row["value"] == 1.0 and row["result"] == "pass"
    assert "(records; plan: 2)" in row["note"]
    recs = [rec(T0 + i / 10, replica="r0") for i in range(350)]
    v = quota_cut({"instances_serving_during_cut": None}, {}, recs)
    assert {r["criterion"]: r for r in v.rows}["instances_held"]["result"] == "fail"


def test_quota_cut_whose_replicas_fail_every_request_fails_with_none_served() -> None:
    """HAProxy forwarded requests to both of the quota's replicas and they failed every one
    during the cut (issue 29 item 5: the log counted them as served, and the drill PASSED)."""
    cut = (T0 + 10.2, T0 + 22)
    recs = [
        r if not cut[0] <= r["sent_at"] < cut[1] else rec(r["sent_at"], ok=False, replica=None)
        for r in steady(T0, T0 + 35)
    ]
    v = quota_cut({"instances_serving_during_cut": 2}, {}, recs)
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    assert (row["value"], row["result"], v.state) == (0.0, "fail", "failed")
    assert row["note"] == (
        "0 of the quota's 2 replicas served within the SLO during the cut (no request answered "
        "successfully within 10 s during the cut: 118 of 118 attempts failed; plan: 2)"
    )
    assert "replicas serving during the cut / quota: 0x < 1x (instances_held)" in v.reasons
    # one of them answered, but every answer took 12 s (over the 10 s the SLO allows): 1 of 2
    recs = [
        r
        if not cut[0] <= r["sent_at"] < cut[1]
        else rec(r["sent_at"], e2e=12.0, replica="r1")
        if r["replica"] == "r1"
        else rec(r["sent_at"], replica="r0")
        for r in steady(T0, T0 + 35)
    ]
    v = quota_cut({"instances_serving_during_cut": 2}, {}, recs)
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    assert (row["value"], row["result"]) == (0.5, "fail"), row
    assert row["note"].startswith("1 of the quota's 2 replicas served within the SLO during")


def test_quota_cut_without_a_quota_is_unmeasured_not_pass() -> None:
    v = quota_cut({"quota": None}, {"instances_held": None})
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    assert row["result"] == "unmeasured" and v.state == "inconclusive", v.reasons


# -- no reason renders None ------------------------------------------------------------------


def test_a_probe_without_a_threshold_renders_no_none() -> None:
    out = {
        "metric": "replicas_in_service",
        "value": 2,
        "expected": 3,
        "passed": False,
        "missing": ["r0"],
        "placement": {},
    }
    journal = {
        "steady_states": {
            "before": {"probes": []},
            "after": {
                "probes": [
                    {
                        "activity": {"name": "all-replicas-in-service"},
                        "output": out,
                        "tolerance_met": False,
                    }
                ]
            },
        }
    }
    assert hypothesis_failures(journal) == [
        (
            "after",
            "all-replicas-in-service: replicas_in_service = 2 (3 expected; missing: r0)",
        )
    ]


def test_the_scorecard_does_not_call_an_unmeasured_recovery_never() -> None:
    def drill(note: str) -> dict[str, Any]:
        fig = {"requests": 100, "error_rate": 0.0, "recovery_s": None, "recovery_note": note}
        return {"name": "traffic-spike", "status": "inconclusive", "figures": fig}

    unmeasured = RECOVERY_UNMEASURED + "the load ended before 5 s in the baseline bands"
    never = "never back inside the baseline bands before the load ended"
    card = build_scorecard({"drills": [drill(unmeasured), {**drill(never), "name": "x"}]})
    per = {d["name"]: d for d in card["tiers"][0]["drills"]}
    assert per["traffic-spike"]["never_recovered"] is False
    assert per["traffic-spike"]["recovery_s"] is None
    assert per["traffic-spike"]["recovery_figure"] == "recovery_s (unmeasured)"
    assert per["x"]["never_recovered"] is True
