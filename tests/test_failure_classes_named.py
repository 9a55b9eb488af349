"""Every failure class named in the reason that counts it, and ``routed_to_down_late`` judged
(issue 30): synthetic records through the real judge (``tests/verdictkit.py``)."""

from __future__ import annotations

from typing import Any

from verdictkit import OOM_GROUND, T0, steady

from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.blame import add_blame
from chaoslib_infer.verdict.policy import VerdictPolicy

STRICT = VerdictPolicy("strict")

#: oom-kill's figures of a replica back in time, its first requests warm
OOM_FIG = {
    "restart_s": 1.0,
    "warmup_ratio": 1.1,
    "interruption_s": 0.0,
    "interruption_sustained": True,
}


def _bad(classes: dict[str, tuple[int, int | None]]) -> list[dict[str, Any]]:
    """35 s of steady load; from T0 + 20 on (after the kill at T0 + 10 and the replica's return
    at T0 + 12), ``n`` requests fail with each class (and status)."""
    records = steady(T0, T0 + 35)
    for r in records:  # r0 killed at T0 + 10, serving again at T0 + 12: its traffic moved
        if T0 + 10 <= r["sent_at"] < T0 + 12.5 and r["replica"] == "r0":
            r["replica"] = "r1"
    k = 200
    for cls, (n, status) in classes.items():
        for r in records[k : k + n]:
            r.update(ok=False, error_class=cls, status=status, chunk_times=[], first_token_at=None)
        k += n
    return records


def test_each_failure_class_is_named_in_the_reason_that_counts_it() -> None:
    """Empty replies, garbled, truncated, in-stream errors and 400 answers were counted by the
    availability and error-rate rows but named in no reason: a reader could not tell a service
    answering 400 from one truncating streams."""
    classes = {
        "empty": (3, 200),
        "garbled": (2, 200),
        "truncated": (2, 200),
        "stream_error": (1, 200),
        "http_4xx": (1, 400),
    }
    v = judge_drill(DrillFacts("oom-kill", _bad(classes), OOM_FIG, OOM_GROUND, policy=STRICT))
    assert v.state == "failed"
    named = "failed: 3 empty, 2 garbled, 2 truncated, 1 http_4xx (400), 1 stream_error"
    for crit in ("availability", "error_rate"):
        line = next(x for x in v.reasons if f"({crit})" in x)
        assert named in line, line
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["availability"]["failed_classes"] == {
        "empty": 3,
        "garbled": 2,
        "http_4xx": 1,
        "stream_error": 1,
        "truncated": 2,
    }
    # a timeout row names only the timeouts it counts, not the other classes
    more = _bad({**classes, "timeout_ttft": (2, None)})
    v = judge_drill(DrillFacts("oom-kill", more, OOM_FIG, OOM_GROUND, policy=STRICT))
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["timeout_rate"]["failed_classes"] == {"timeout_ttft": 2}
    assert "failed: 2 timeout_ttft" in rows["timeout_rate"]["statement"]
    # the default policy judges the fault's error-budget share, over every request from the
    # injection on: its reason names their classes too (a failed row, as a long outage gives)
    lots = _bad({"empty": (30, 200), "http_4xx": (20, 400)})
    lots[50].update(ok=False, error_class="reset", status=None)  # before the injection
    facts = DrillFacts("oom-kill", lots, OOM_FIG, OOM_GROUND)
    row = {"criterion": "budget_share", "window": "fault", "result": "fail", "value": 0.05}
    (named_row,) = add_blame([row], facts, {}, {"fault": []})
    assert named_row["failed_classes"] == {"empty": 30, "http_4xx": 20}
    assert named_row["statement"] == "failed: 30 empty, 20 http_4xx (400)"
    # a passing service's rows name nothing
    v = judge_drill(DrillFacts("oom-kill", _bad({}), OOM_FIG, OOM_GROUND, policy=STRICT))
    assert v.state == "passed", v.reasons
    assert not any("failed_classes" in r for r in v.rows)


def test_a_gateway_routing_to_a_replica_down_for_seconds_fails_node_loss() -> None:
    ground = {
        "fault_at": T0 + 10,
        "replica": "r0",
        "node": "n0",
        "lost_replica_names": ["r0"],
        "replicas_killed_at": T0 + 10.1,
        "replica_serving_again_at": T0 + 14,
    }
    base = {
        "gateway": "nginx",
        "replacement_serving_s": 4.0,
        "interruption_s": 0.0,
        "interruption_sustained": True,
        "routed_to_down": 2,
    }
    records = steady(T0, T0 + 35, replicas=("r0", "r1", "r2"))
    for r in records:  # the gateway moved r0's traffic off once it went down
        if T0 + 10 <= r["sent_at"] < T0 + 14 and r["replica"] == "r0":
            r["replica"] = "r1"
    ok = judge_drill(DrillFacts("node-loss", records, {**base, "routed_to_down_late": 0}, ground))
    rows = {r["criterion"]: r for r in ok.rows}
    assert rows["routed_to_down_late"]["result"] == "pass", ok.reasons
    bad = judge_drill(DrillFacts("node-loss", records, {**base, "routed_to_down_late": 5}, ground))
    assert bad.state == "failed"
    line = next(x for x in bad.reasons if "(routed_to_down_late)" in x)
    assert line.startswith("requests the gateway routed to a replica down for over 2 s: 5 > 0")
    assert (
        "BLAME: gateway (it sent 5 upstream tries to a replica that was down or frozen over 2 s"
        in line
    )
