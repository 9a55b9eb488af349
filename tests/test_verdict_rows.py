"""Verdict rows that must read right: who the health row blames, the fix a warm-up reason names,
and a sustained-service row with nothing interrupted (``docs/definitions.md``, "Verdicts").

Pure functions over synthetic records (unix seconds).
"""

from __future__ import annotations

from typing import Any

from verdictkit import JITTER_GROUND, OOM_GROUND, T0, rec, steady

from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.policy import VerdictPolicy
from chaoslib_infer.verdict.state import reason


def moved(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` as an oom-kill of r0 at T0 + 10 leaves them: its requests of the next 5 s
    served by r1 (the traffic felt the fault, verdict/confirm.py)."""
    for r in records:
        if r["replica"] == "r0" and T0 + 10 <= r["sent_at"] < T0 + 15:
            r["replica"] = "r1"
    return records


def rows_of(drill: str, records: list[dict], fig: dict, ground: dict, **kw: Any) -> dict:
    overrides = kw.pop("overrides", None)
    kw.setdefault("policy", VerdictPolicy("strict"))
    v = judge_drill(DrillFacts(drill, records, fig, ground, **kw), overrides)
    return {r["criterion"]: r for r in v.rows} | {"_verdict": v}


# -- network-jitter's health row: whose failures it counts --------------------------------------

#: HAProxy kept the slowed replica's detour server UP all along
UP = [{"event": "lb_state", "t": T0 + 1, "servers": {"r0-jitter": "UP", "r1": "UP", "r2": "UP"}}]
#: the rows of lost requests are not what these tests are about
LOSS_OFF = {
    n: "off"
    for n in ("availability", "availability_fault", "error_rate", "timeout_rate")
    + ("timeout_rate_fault", "budget_share", "p99_e2e_fault_s")
}


def _jitter_health(classes: list[str]) -> dict[str, Any]:
    """The health row of a jitter drill whose r0 attempts of the fault window all failed, their
    error classes taken in turn from ``classes``."""
    records = steady(T0, T0 + 35)
    n = 0
    for i, r in enumerate(records):
        if r["replica"] == "r0" and T0 + 10 <= r["sent_at"] < T0 + 20:
            cls = classes[n % len(classes)]
            e2e = 1.0 if cls.startswith("timeout_") else 0.2  # the client's 1 s attempt timeout
            records[i] = rec(r["sent_at"], False, e2e, "r0", error_class=cls)
            n += 1
    fig = {"duplicate_generations": 0, "extra_generations": 0, "retries": 0}
    return rows_of(
        "network-jitter", records, fig, JITTER_GROUND, lab_events=UP, overrides=LOSS_OFF
    )["health_disagreement_s"]


def test_the_health_row_does_not_count_the_clients_own_timeouts_on_a_slowed_replica() -> None:
    """The slowed replica was still answering: the client's own attempt timeouts are no
    failure its health checks could see (found by a new-user trial: the row failed with BLAME
    client while its own words cleared the gateway). The retry-cost rows judge what they cost."""
    row = _jitter_health(["timeout_total"])
    assert (row["result"], row["value"]) == ("pass", 0.0)
    assert "blame" not in row or not row["blame"]


def test_the_health_row_blames_the_gateway_when_the_replica_really_failed() -> None:
    row = _jitter_health(["http_5xx"])
    assert (row["result"], row["value"]) == ("fail", 9.0)
    assert reason(row) == (
        "gateway health UP while the faulted replica's completions fail: 9 s > 3 s "
        "(health_disagreement_s); BLAME: gateway (its health checks kept the replica UP while "
        "31 of its completions failed: 31 http_5xx)"
    )
    # the client's own timeouts among them are left out: only the upstream's failures count
    both = _jitter_health(["timeout_total", "http_5xx"])
    assert both["result"] == "fail"
    assert reason(both).endswith(
        "(health_disagreement_s); BLAME: gateway (its health checks kept the replica UP while "
        "15 of its completions failed: 15 http_5xx)"
    )


# -- oom-kill's warm-up reason names its fix -----------------------------------------------------

OOM_FIG = {"restart_s": 2.0, "warmup_ratio": 3.0, "interruption_s": 0.0}


def test_the_warmup_reason_names_the_fix() -> None:
    rows = rows_of(
        "oom-kill", moved(steady(T0, T0 + 35)), {**OOM_FIG, "warmup_ratio": 41.1}, OOM_GROUND
    )
    assert rows["warmup_ratio"]["result"] == "fail"
    assert rows["_verdict"].reasons == [
        "first-request TTFT / steady-state TTFT: 41.1x > 10x; fix: warm the engine before its "
        "/health says ready (in the lab: engine_args: {warmup_requests: 0}) (warmup_ratio)"
    ]
    # a row without a fix of its own reads as before
    rows = rows_of(
        "oom-kill", moved(steady(T0, T0 + 35)), {**OOM_FIG, "restart_s": 31.0}, OOM_GROUND
    )
    assert rows["_verdict"].reasons == [
        "restart (death to first request served): 31 s > 30 s (restart_s)"
    ]


# -- interruption_sustained with nothing interrupted ---------------------------------------------


def test_sustained_reads_unmeasured_when_nothing_was_interrupted() -> None:
    nothing = {**OOM_FIG, "failed_requests": 0, "interruption_sustained": True}
    rows = rows_of(
        "oom-kill",
        moved(steady(T0, T0 + 35)),
        {**nothing, "first_failure_at": None},
        OOM_GROUND,
    )
    row = rows["interruption_sustained"]
    assert (row["result"], row["value"]) == ("unmeasured", None)
    assert row["note"] == (
        "unmeasured: no interruption observed (no failed request after the fault): nothing was "
        "seen to be sustained again"
    )
    assert rows["_verdict"].state == "passed"  # not a key figure: the drill still answers
    # the figures without first_failure_at: their failed request count says so
    rows = rows_of("oom-kill", moved(steady(T0, T0 + 35)), nothing, OOM_GROUND)
    assert rows["interruption_sustained"]["result"] == "unmeasured"
    # an interruption that was seen to end is judged
    seen = {**nothing, "failed_requests": 2, "first_failure_at": T0 + 10.1, "interruption_s": 0.4}
    rows = rows_of("oom-kill", moved(steady(T0, T0 + 35)), seen, OOM_GROUND)
    assert (rows["interruption_sustained"]["result"], rows["interruption_sustained"]["value"]) == (
        "pass",
        1.0,
    )


def test_sustained_reads_unmeasured_on_a_cluster_without_failures() -> None:
    """No drill figure (a cluster): the shared computation over the records; with no failure
    after the fault it has nothing to sustain; with one, the row is judged."""
    rows = rows_of("oom-kill", moved(steady(T0, T0 + 35)), {"restart_s": 2.0}, OOM_GROUND)
    assert rows["interruption_sustained"]["result"] == "unmeasured"
    assert rows["interruption_s"]["value"] == 0.0
    records = moved(steady(T0, T0 + 35))
    records[105] = rec(
        records[105]["sent_at"], False, replica="r0", error_class="reset"
    )  # one lost at T0+10.5
    rows = rows_of("oom-kill", records, {"restart_s": 2.0}, OOM_GROUND, overrides=LOSS_OFF)
    assert rows["interruption_sustained"]["result"] == "pass"


# -- a hypothesis probe that repeats a failed row is listed once ---------------------------------


def test_an_after_hypothesis_line_that_repeats_a_failed_row_is_not_listed_twice() -> None:
    """Found by a new-user trial: network-jitter's reasons ended with the after-hypothesis's
    ``duplicate_generations = 27`` line, the first reason again."""
    fig = {"duplicate_generations": 27, "extra_generations": 27, "retries": 30}
    dup = (
        "after",
        "duplicate-generations-within-budget: duplicate_generations = 27 (<= 0.0 required, "
        "449 requests)",
    )
    other = ("after", "all-replicas-in-service: replicas_in_service = 2 (3 expected)")
    rows = rows_of(
        "network-jitter",
        steady(T0, T0 + 35),
        fig,
        JITTER_GROUND,
        lab_events=UP,
        overrides=LOSS_OFF,
        hypothesis_failures=[dup, other],
    )
    reasons = rows["_verdict"].reasons
    assert sum("duplicate_generations" in r for r in reasons) == 1, reasons
    assert reasons[0].startswith("duplicate generations: 27 > 0 (duplicate_generations)")
    assert (
        "steady-state hypothesis after the fault deviated: all-replicas-in-service: "
        "replicas_in_service = 2 (3 expected)"
    ) in reasons
