"""Verdicts that can fail: each criterion breaks on a service with the weakness and holds on one
without it; residue, unconfirmed faults, thin traffic and baseline defects get their own states.

Pure functions over synthetic records (unix seconds); the lab-level checks are in
``test_verdict_lab.py``.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from verdictkit import JITTER_GROUND, OOM_GROUND, T0, rec, steady

from chaoslib_infer.drills.network_jitter.figures import generation_counts, wasted_tokens
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.bundle import junit_xml
from chaoslib_infer.load.client import cut_off_record, write_inflight
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.inflight import (
    cut_off_timeouts,
    in_flight_timeouts,
    judged_records,
    read_inflight,
)
from chaoslib_infer.measure.metrics import cut_off_count, window_stats
from chaoslib_infer.plan import load_plan
from chaoslib_infer.verdict import DrillFacts, criteria_for, exit_code, judge_drill, parse_override
from chaoslib_infer.verdict.blame import strip_blame
from chaoslib_infer.verdict.confirm import faulted_names
from chaoslib_infer.verdict.policy import VerdictPolicy
from chaoslib_infer.verdict.state import ALSO_FAILED
from chaoslib_infer.verdict.timeline import timeline


def felt(drill: str, records: list[dict[str, Any]], ground: dict[str, Any]) -> list[dict[str, Any]]:
    """``records`` as a fault that reached the traffic leaves them (verdict/confirm.py): the
    faulted replicas' successful requests of the fault window (at least 5 s) answered by a replica the
    fault spared (the gateway moved them). network-jitter and traffic-spike: unchanged (the
    jitter is confirmed by the shim's applied delay, the spike by its rate)."""
    hit = set(faulted_names(drill, ground))
    at = ground.get("fault_at") or ground.get("cut_done_at")
    if drill in ("network-jitter", "traffic-spike") or not hit or at is None:
        return records
    end = timeline(drill, ground, {}).fault_end
    end = max(end if end is not None else at, at + 5.0)
    spare = next((r for r in ("r1", "r2", "r0") if r not in hit), None)
    return [
        {**r, "replica": spare}
        if r.get("ok") and r.get("replica") in hit and at <= float(r.get("sent_at") or 0) < end
        else r
        for r in records
    ]


def facts(
    drill: str,
    records: list[dict[str, Any]],
    figures: dict[str, Any],
    ground: dict[str, Any],
    **kw: Any,
) -> DrillFacts:
    """The drill's facts, its records as a fault that reached the traffic leaves them
    (:func:`felt`)."""
    records = felt(drill, records, ground)
    # these tests pin the zero-loss rule of the strict policy (every SLO row judged over the
    # fault window and the whole drill); the default policy: tests/test_budget.py
    kw.setdefault("policy", VerdictPolicy("strict"))
    return DrillFacts(drill=drill, records=records, figures=figures, ground=ground, **kw)


OOM_FIG = {
    "restart_s": 2.0,
    "warmup_ratio": 3.0,
    "interruption_s": 0.0,
    "interruption_sustained": True,
}


def test_healthy_oom_drill_passes() -> None:
    v = judge_drill(facts("oom-kill", steady(T0, T0 + 30), OOM_FIG, OOM_GROUND))
    assert v.state == "passed", v.reasons
    assert v.reasons == []
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["restart_s"]["result"] == "pass"
    assert rows["health_disagreement_s"]["result"] == "unmeasured"  # no threshold, no value


def test_failures_during_the_fault_fail_the_drill_with_figure_value_threshold() -> None:
    records = steady(T0, T0 + 30)
    for r in records:
        if T0 + 10 <= r["sent_at"] < T0 + 11:
            r.update(ok=False, error_class="reset", status=None)
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND))
    assert v.state == "failed"
    assert any(
        r.startswith("requests lost to the fault: 10 (fault-window availability): 0.8")
        and "< 0.999" in r
        for r in v.reasons
    )


def test_fault_not_confirmed_by_ground_truth_is_inconclusive() -> None:
    ground = {**OOM_GROUND, "oom_kills": 0, "death_cause": "sigkill"}
    v = judge_drill(facts("oom-kill", steady(T0, T0 + 30), OOM_FIG, ground))
    assert v.state == "inconclusive"
    assert "no kernel OOM kill recorded" in v.reasons[0]


def test_too_little_traffic_is_inconclusive() -> None:
    v = judge_drill(facts("oom-kill", steady(T0, T0 + 30, rate=1.0), OOM_FIG, OOM_GROUND))
    assert v.state == "inconclusive"
    assert any("baseline holds 10 requests" in r for r in v.reasons)


def test_residue_fails_whatever_else_held() -> None:
    v = judge_drill(
        facts("oom-kill", steady(T0, T0 + 30), OOM_FIG, OOM_GROUND, residue=["lab: hog h1 on r0"])
    )
    assert v.state == "failed"
    assert v.reasons == ["fault left behind after the rollbacks: lab: hog h1 on r0"]


def test_defect_before_the_fault_is_not_blamed_on_it() -> None:
    records = steady(T0, T0 + 30)
    for r in records[::10]:  # 10 % failures throughout, the baseline included
        r.update(ok=False, error_class="http_5xx")
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND))
    assert v.state == "failed"
    # the defect first, said to be there before the fault; the rows the drill failed follow it,
    # never hidden by it (issue 29; tests/test_verdict_precedence.py)
    assert v.reasons[0].startswith(
        "the service did not meet its SLOs before the fault (not blamed on the fault): "
    )
    assert len(v.reasons) > 1 and all(r.startswith(ALSO_FAILED) for r in v.reasons[1:])


def test_request_in_flight_at_the_fault_belongs_to_the_fault_window() -> None:
    records = steady(T0, T0 + 30)
    # sent just before the fault, cut by it: not a baseline defect
    records.append(rec(T0 + 9.95, ok=False, e2e=0.1, error_class="reset", rid="cut"))
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND))
    assert v.state == "failed"
    assert not v.reasons[0].startswith("the service did not meet")
    assert any("(availability_fault)" in r for r in v.reasons)


HANG_GROUND = {
    "fault_at": T0 + 10,
    "replica": "r0",
    "mode": "freeze",
    "ejected_at": None,
    "thawed_at": T0 + 25,
    "hung_sessions": 0,
}


def _hang(ejected: bool) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    records = steady(T0, T0 + 35)
    hung = 0
    for r in records:
        frozen = T0 + 10 <= r["sent_at"] < (T0 + 11 if ejected else T0 + 25)
        if r["replica"] == "r0" and frozen:
            r.update(ok=False, error_class="timeout_ttft", end_at=r["sent_at"] + 10.0)
            hung += 1
    fig = {"hung_requests": hung, "ejection_s": 1.0 if ejected else None}
    ground = {**HANG_GROUND, "ejected_at": (T0 + 11) if ejected else None}
    return records, fig, ground


def test_hanging_replica_behind_a_gateway_that_never_ejects_it_fails() -> None:
    records, fig, ground = _hang(ejected=False)
    v = judge_drill(facts("upstream-timeout", records, fig, ground))
    assert v.state == "failed"
    text = "\n".join(v.reasons)
    assert "requests that hung until the client gave up" in text
    assert "longest wait of a request in the fault window: 10 s > 5 s" in text
    assert "ejection of the frozen replica" not in text  # unmeasured, not a failure line
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["ejection_s"]["result"] == "unmeasured"


def test_fail_fast_gateway_passes_upstream_timeout() -> None:
    records = steady(T0, T0 + 35)
    for r in records:  # the frozen replica's requests are answered 503 at once and retried
        if r["replica"] == "r0" and T0 + 10 <= r["sent_at"] < T0 + 10.3:
            r.update(replica="r1")
    fig = {"hung_requests": 0, "ejection_s": 0.3, "hung_sessions_max": 1}
    ground = {**HANG_GROUND, "ejected_at": T0 + 10.3, "hung_sessions": 1}
    v = judge_drill(facts("upstream-timeout", records, fig, ground))
    assert v.state == "passed", v.reasons


@pytest.mark.parametrize(
    ("dups", "measured", "state"),
    [(0, True, "passed"), (3, True, "failed"), (0, False, "inconclusive")],
)
def test_duplicate_generations_judged_and_unmeasured_without_a_ledger(
    dups: int, measured: bool, state: str
) -> None:
    fig = {
        "duplicate_generations": dups,
        "extra_generations": dups,
        "retries": dups,
        "duplicate_causes": {"client_gave_up": dups} if dups else {},
    }
    v = judge_drill(
        facts("network-jitter", steady(T0, T0 + 30), fig, JITTER_GROUND, ledger_measured=measured)
    )
    assert v.state == state, v.reasons
    if state == "failed":
        assert strip_blame(v.reasons[0]) == "duplicate generations: 3 > 0 (duplicate_generations)"
        # the requests' own evidence: its attempt timeout gave up while the engine went on
        assert "; BLAME: client (3 requests: its attempt timeout gave up" in v.reasons[0]
    if state == "inconclusive":
        assert "duplicate generations is unmeasured" in v.reasons[0]
        rows = {r["criterion"]: r for r in v.rows}
        assert rows["duplicate_generations"]["value"] is None  # never 0


def _waste(ledger: list[dict[str, Any]], ids: set[str]) -> dict[str, Any]:
    """:func:`wasted_tokens` for the requests ``ids`` (the generation counts as compute() has them)."""
    counts = generation_counts(ledger)
    return wasted_tokens(ledger, {rid: n for rid, n in counts.items() if rid in ids})


def _gen(rid: str, t: float) -> dict[str, Any]:
    return {"t": t, "event": "generation", "replica": "r1", "request_id": rid, "pid": 1}


def _end(rid: str, t: float, prompt: int, completion: int) -> dict[str, Any]:
    return {
        "t": t,
        "event": "generation_end",
        "replica": "r1",
        "request_id": rid,
        "pid": 1,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "outcome": "done",
    }


def test_wasted_tokens_from_the_ledger_fail_the_jitter_drill_and_read_unmeasured_without_ends() -> (
    None
):
    # "a" ran twice: cut after 5 tokens (the client gave up), then in full (32): the cut one is
    # waste, its prefill included; "b" ran once; "x" is another client's
    ledger = [
        _gen("a", T0 + 1), _end("a", T0 + 2, 10, 5),
        _gen("a", T0 + 3), _end("a", T0 + 4, 10, 32),
        _gen("b", T0 + 1), _end("b", T0 + 2, 10, 32),
        _gen("x", T0 + 1), _gen("x", T0 + 2), _end("x", T0 + 3, 99, 99),
    ]  # fmt: skip
    waste = _waste(ledger, {"a", "b"})
    assert (waste["wasted_tokens"], waste["wasted_completion_tokens"]) == (15, 5)
    fig = {"duplicate_generations": 1, "extra_generations": 1, "retries": 1, **waste}
    v = judge_drill(
        facts("network-jitter", steady(T0, T0 + 30), fig, JITTER_GROUND),
        {"duplicate_generations": "off", "extra_generations": "off"},
    )
    assert v.state == "failed"
    assert [strip_blame(r) for r in v.reasons] == [
        "tokens of generations paid twice (prompt + completion): 15 > 0 (wasted_tokens)"
    ]
    # a budget that covers them passes
    ok = judge_drill(
        facts("network-jitter", steady(T0, T0 + 30), fig, JITTER_GROUND),
        {"duplicate_generations": "off", "extra_generations": "off", "wasted_tokens": 20},
    )
    assert ok.state == "passed", ok.reasons
    # no duplicates: 0 tokens wasted, measured
    assert _waste(ledger, {"b"})["wasted_tokens"] == 0
    # an engine that writes no end lines: unmeasured, never 0
    starts_only = [e for e in ledger if e["event"] == "generation"]
    assert _waste(starts_only, {"b"})["wasted_tokens"] is None
    # a duplicated request whose generation has no end (its process was killed): unmeasured
    killed = [e for e in ledger if not (e["event"] == "generation_end" and e["t"] == T0 + 2)]
    w = _waste(killed, {"a", "b"})
    assert w["wasted_tokens"] is None and w["duplicate_generations_without_end"] == 1
    v = judge_drill(
        facts("network-jitter", steady(T0, T0 + 30), {**fig, **w}, JITTER_GROUND),
        {"duplicate_generations": "off", "extra_generations": "off"},
    )
    row = next(r for r in v.rows if r["criterion"] == "wasted_tokens")
    assert (row["value"], row["result"]) == (None, "unmeasured")
    assert v.state == "passed"  # not the key criterion: the row says unmeasured, never PASS


def test_threshold_override_and_off() -> None:
    fig = {"duplicate_generations": 3, "extra_generations": 3, "retries": 3}
    base = facts("network-jitter", steady(T0, T0 + 30), fig, JITTER_GROUND)
    v = judge_drill(base, {"duplicate_generations": 5, "extra_generations": "off"})
    assert v.state == "passed", v.reasons
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["extra_generations"]["result"] == "not judged"
    assert rows["retries"]["result"] == "not judged"
    with pytest.raises(ValueError, match="unknown criterion"):
        criteria_for("network-jitter", {"restart_s": 1})
    assert parse_override("oom-kill:restart_s=20") == ("oom-kill", "restart_s", 20.0)
    assert parse_override("restart_s=off") == (None, "restart_s", None)
    with pytest.raises(ValueError):
        parse_override("restart_s=soon")


def test_client_behind_schedule_is_inconclusive() -> None:
    records = steady(T0, T0 + 30)
    for r in records:
        r["intended_at"] = r["sent_at"] - 2.0
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND))
    assert v.state == "inconclusive"
    assert "the client fell behind its schedule" in v.reasons[0]


def test_service_ending_smaller_than_it_began_fails() -> None:
    v = judge_drill(facts("oom-kill", steady(T0, T0 + 30), OOM_FIG, OOM_GROUND, serving=(3, 2)))
    assert v.state == "failed"
    assert v.reasons[0].startswith("serving replicas after the drill / before it: 0.667x < 1x")


def test_never_recovered_fails_traffic_spike() -> None:
    ground = {"fault_at": T0 + 10, "spike_end_at": T0 + 20}
    fig = {"requests_during_spike": 100, "recovery_s": None, "scale_out_s": 2.0}
    v = judge_drill(facts("traffic-spike", steady(T0, T0 + 30), fig, ground))
    assert v.state == "failed"  # measured, and never back in the bands: a failure, never 0
    assert v.reasons == [
        "back inside the baseline bands after the spike: never back inside the baseline bands "
        "before the load ended (recovery_s)"
    ]
    del fig["recovery_s"]  # no drill figure (a cluster): the shared computation over the records
    v = judge_drill(facts("traffic-spike", steady(T0, T0 + 30), fig, ground))
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["recovery_s"]["value"] == 0.0 and v.state == "passed", v.reasons
    fig["recovery_s"] = 80.0  # a slow one fails
    v = judge_drill(facts("traffic-spike", steady(T0, T0 + 30), fig, ground))
    assert v.state == "failed"
    assert "back inside the baseline bands after the spike: 80 s > 60 s" in v.reasons[0]


def test_spike_shed_without_any_scale_out_fails_and_a_carried_spike_is_n_a() -> None:
    ground = {"fault_at": T0 + 10, "spike_end_at": T0 + 20}
    fig = {"requests_during_spike": 100, "recovery_s": 2.0, "scale_out_s": None}
    records = steady(T0, T0 + 30)
    v = judge_drill(facts("traffic-spike", records, fig, ground))
    rows = {r["criterion"]: r for r in v.rows}
    assert v.state == "passed" and rows["scale_out_s"]["result"] == "n/a"
    for r in records:
        if T0 + 12 <= r["sent_at"] < T0 + 13:
            r.update(ok=False, error_class="http_429", status=429, end_at=r["sent_at"] + 0.01)
    v = judge_drill(facts("traffic-spike", records, fig, ground))
    assert v.state == "failed"
    assert v.reasons == [
        "scale-out (trigger to serving): never scaled out while 10 requests failed during the "
        "spike (scale_out_s)"
    ]


def test_recovery_counts_from_the_first_impact() -> None:
    records = steady(T0, T0 + 40)
    for r in records:  # the damage starts 4 s after the fault and lasts 6 s
        if T0 + 14 <= r["sent_at"] < T0 + 20:
            r.update(ok=False, error_class="http_5xx")
    base = window_stats(records, T0, T0 + 10)
    assert mfig.recovery(records, T0 + 10, base) == pytest.approx(10.0)
    # never back in band before the data ends: None, not 0
    for r in records:
        if r["sent_at"] >= T0 + 14:
            r.update(ok=False, error_class="http_5xx")
    assert mfig.recovery(records, T0 + 10, base) is None


def test_interruption_keeps_pending_failures_open_and_reports_sustained() -> None:
    records = steady(T0, T0 + 30)
    # two requests hung on a frozen replica, visible only at the client's 10 s timeout
    records += [rec(T0 + 10.0, ok=False, e2e=10.0, error_class="timeout_ttft", rid="h1")]
    records += [rec(T0 + 11.0, ok=False, e2e=10.0, error_class="timeout_ttft", rid="h2")]
    records += [rec(T0 + 9.0, ok=False, e2e=2.0, error_class="reset", rid="f0")]
    intr = mfig.interruption(records, T0 + 10)
    assert intr["first_failure_at"] == pytest.approx(T0 + 11.0)
    assert intr["last_failure_at"] == pytest.approx(T0 + 21.0)
    assert intr["sustained"] is True
    short = [r for r in records if r["sent_at"] < T0 + 12]
    assert mfig.interruption(short, T0 + 10)["sustained"] is False


def test_hang_is_seen_before_the_client_gives_up(tmp_path: Path) -> None:
    """The issue's reproduction: one replica of three hanging; ended records read 1.0."""
    now = T0 + 20
    ended = [r for r in steady(T0 + 12, T0 + 20) if r["replica"] != "r0"]
    on_wire = {(f"h{i}", 1): (T0 + 8 + i * 0.3, T0 + 8 + i * 0.3) for i in range(8)}
    path = tmp_path / "inflight.json"
    write_inflight(path, on_wire)
    inflight = read_inflight(path)
    assert len(inflight) == 8
    naive = window_stats(ended, T0 + 8, now)
    assert naive["availability"] == 1.0
    judged = window_stats(judged_records(ended, inflight, now, deadline_s=10.0), T0 + 8, now)
    assert judged["timeouts"] == len(in_flight_timeouts(inflight, ended, now, 10.0)) > 0
    assert judged["availability"] < 0.9


def test_cut_off_attempts_are_recorded_counted_and_left_out_of_the_rates() -> None:
    records = steady(T0, T0 + 10)
    records.append(cut_off_record("c1", 1, T0 + 9.9, T0 + 9.9, T0 + 10.2))
    assert cut_off_count(records) == 1
    assert window_stats(records)["availability"] == 1.0
    assert records[-1]["in_flight_s"] == pytest.approx(0.3)


def test_a_cut_off_attempt_past_the_deadline_is_judged_as_a_timeout() -> None:
    """An attempt hung until the load stopped was cut off (outcome unknown): past the judging
    deadline it is a timeout in the verdict, never dropped from the P99 and the timeout rate."""
    records = steady(T0, T0 + 35)
    hung = cut_off_record("c1", 1, T0 + 11.05, T0 + 11.05, T0 + 35.0)  # 24 s on the wire
    young = cut_off_record("c2", 1, T0 + 34.5, T0 + 34.5, T0 + 35.0)  # 0.5 s: still unknown
    records += [hung, young]
    judged = cut_off_timeouts(records, 10.0)
    assert judged[-2]["error_class"] == "timeout_total" and not judged[-2]["cut_off"]
    assert judged[-2]["in_flight_at_judging"] and judged[-2]["cut_off_at_stop"]
    assert judged[-1]["cut_off"] and judged[-1]["error_class"] == "cut_off"
    assert records[-2]["cut_off"]  # the records themselves are left as written
    assert window_stats(judged)["timeouts"] == 1 and cut_off_count(judged) == 1
    assert judged_records(records, [], T0 + 40, 10.0)[-2]["error_class"] == "timeout_total"
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND))
    rows = {r["criterion"]: r for r in v.rows}
    assert v.state == "failed"
    assert v.windows["drill"]["requests"] == 351  # the hung one in, the young one out
    assert rows["timeout_rate_fault"]["value"] == pytest.approx(1 / v.windows["fault"]["requests"])
    assert rows["timeout_rate"]["value"] == pytest.approx(1 / 351)
    assert any(r.endswith("(timeout_rate_fault)") for r in v.reasons), v.reasons
    # a longer judging deadline leaves it cut off (outcome unknown): no timeout is counted
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND, deadline_s=30.0))
    assert v.state == "passed", v.reasons
    # a hang that outlasts the load is a hung request of upstream-timeout
    records, fig, ground = _hang(ejected=True)
    records.append(cut_off_record("c3", 1, T0 + 12.05, T0 + 12.05, T0 + 35.0))
    v = judge_drill(facts("upstream-timeout", records, {**fig, "hung_requests": 0}, ground))
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["hung_requests"]["value"] == 1.0 and rows["hung_requests"]["result"] == "fail"


def test_exit_codes() -> None:
    assert exit_code(["passed", "passed"]) == 0
    assert exit_code(["passed", "failed", "inconclusive"]) == 1
    assert exit_code(["passed", "error"]) == 2
    assert exit_code(["passed", "inconclusive"]) == 3
    assert exit_code(["aborted"]) == 130
    assert exit_code([]) == 3


def test_junit_reads_failed_inconclusive_and_error_as_ci_does() -> None:
    summary = {
        "plan": "p",
        "drills": [
            {"name": "a", "status": "passed", "reasons": []},
            {"name": "b", "status": "failed", "reasons": ["duplicate generations: 3 > 0"]},
            {"name": "c", "status": "inconclusive", "reasons": ["fault not confirmed"]},
            {"name": "d", "status": "error", "reasons": ["activity x crashed"]},
        ],
    }
    root = ET.fromstring(junit_xml(summary))
    # inconclusive is no pass: a <failure> by default (a gate reads <skipped> as green)
    assert (root.get("failures"), root.get("skipped"), root.get("errors")) == ("2", "0", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    fail = cases["b"].find("failure")
    assert fail is not None and fail.get("message") == "duplicate generations: 3 > 0"
    grey = cases["c"].find("failure")
    assert grey is not None and grey.get("type") == "inconclusive"
    assert grey.get("message") == "inconclusive: fault not confirmed"
    assert cases["c"].find("skipped") is None
    assert cases["d"].find("error") is not None
    assert cases["a"].find("failure") is None
    # the documented option (--junit-inconclusive=skipped, or recorded in the summary)
    for root in (
        ET.fromstring(junit_xml(summary, "skipped")),
        ET.fromstring(junit_xml({**summary, "junit_inconclusive": "skipped"})),
    ):
        assert (root.get("failures"), root.get("skipped"), root.get("errors")) == ("1", "1", "1")
        cases = {c.get("name"): c for c in root.iter("testcase")}
        skipped = cases["c"].find("skipped")
        assert skipped is not None and skipped.get("message") == "inconclusive: fault not confirmed"
        assert cases["c"].find("failure") is None
    # the argument outranks the recorded choice; anything else is refused
    root = ET.fromstring(junit_xml({**summary, "junit_inconclusive": "skipped"}, "failure"))
    assert root.get("skipped") == "0" and root.get("failures") == "2"
    with pytest.raises(ValueError, match="expected one of failure, skipped"):
        junit_xml(summary, "ignore")


def test_plan_criteria_are_validated(tmp_path: Path) -> None:
    exp = Path(__file__).resolve().parent.parent / "experiments" / "oom-kill.yaml"
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        json.dumps(
            {
                "criteria": {"availability": 0.99},
                "drills": [
                    {"name": "oom-kill", "experiment": str(exp), "criteria": {"restart_s": 5}}
                ],
            }
        ),
        encoding="utf-8",
    )
    spec = load_plan(plan).drills[0]
    assert spec.criteria == {"availability": 0.99, "restart_s": 5}
    plan.write_text(
        json.dumps(
            {"drills": [{"name": "oom-kill", "experiment": str(exp), "criteria": {"dups": 1}}]}
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="unknown criterion 'dups'"):
        load_plan(plan)


def test_stop_condition_sees_a_hang_before_the_client_gives_up() -> None:
    from chaoslib_infer.safety.guard import StopConditions, Tracker, hung_samples

    c = StopConditions(availability_floor=0.5, window_s=5.0, for_s=0.0, min_requests=3)
    now = T0 + 20
    ended = [(T0 + 19.0, True)]
    # four requests on the wire for 7 s: the client's 10 s first-token timeout has not fired yet
    inflight = [{"request_id": f"h{i}", "sent_at": T0 + 13.0} for i in range(4)]
    assert Tracker(c).check(ended, now) is None  # the ended records alone are too few to judge
    trip = Tracker(c).check([*ended, *hung_samples(inflight, now, c.hang_s)], now)
    assert trip is not None and trip.guard == "availability_floor"
    assert trip.value == pytest.approx(0.2)
    # young attempts are not hangs
    assert hung_samples([{"request_id": "y", "sent_at": now - 1.0}], now, c.hang_s) == []


def test_health_disagreement_from_the_gateway_health_view() -> None:
    """A replica whose completions fail while the gateway's health checks keep it UP fails the
    drill; one ejected at once passes."""

    def run(down_after_s: float) -> dict[str, Any]:
        records = steady(T0, T0 + 35)
        for r in records:
            if r["replica"] == "r0" and T0 + 10 <= r["sent_at"] < T0 + 25:
                r.update(ok=False, error_class="http_5xx", status=503)
        events = [
            {"event": "lb_state", "t": T0 + 1, "servers": {"r0": "UP", "r1": "UP", "r2": "UP"}},
            {
                "event": "lb_state",
                "t": T0 + 10 + down_after_s,
                "servers": {"r0": "DOWN", "r1": "UP", "r2": "UP"},
            },
        ]
        v = judge_drill(
            facts(
                "upstream-timeout",
                records,
                {"hung_requests": 0, "ejection_s": down_after_s},
                {**HANG_GROUND, "ejected_at": T0 + 10 + down_after_s},
                lab_events=events,
            ),
            {"availability": "off", "availability_fault": "off", "error_rate": "off"},
        )
        return {r["criterion"]: r for r in v.rows}["health_disagreement_s"]

    late = run(12.0)
    assert late["result"] == "fail" and late["value"] >= 10.0
    early = run(0.2)
    assert early["result"] == "pass" and early["value"] <= 1.0


#: a confirmed fault of each drill (ground truth) and figures that meet every criterion
GOOD: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "node-loss": (
        {
            "fault_at": T0 + 10,
            "node": "n0",
            "lost_replica_names": ["r0"],
            "replicas_killed_at": T0 + 10,
            "replica_serving_again_at": T0 + 14,
        },
        {"interruption_s": 1.0, "interruption_sustained": True, "replacement_serving_s": 4.0},
    ),
    "oom-kill": (OOM_GROUND, OOM_FIG),
    "network-jitter": (
        JITTER_GROUND,
        {"duplicate_generations": 0, "extra_generations": 0, "retries": 0},
    ),
    "traffic-spike": (
        {"fault_at": T0 + 10, "spike_end_at": T0 + 20},
        {"requests_during_spike": 100, "recovery_s": 5.0, "scale_out_s": 2.0},
    ),
    "upstream-timeout": (
        {**HANG_GROUND, "ejected_at": T0 + 10.3, "hung_sessions": 1},
        {"hung_requests": 0, "ejection_s": 0.3},
    ),
    "simultaneous-restarts": (
        {
            "fault_at": T0 + 10,
            "replicas": ["r0", "r1"],
            "survivors": ["r2"],
            "all_serving_at": T0 + 13,
        },
        {"all_serving_s": 3.0, "interruption_s": 0.5, "interruption_sustained": True},
    ),
    "quota-cut": (
        {
            "fault_at": T0 + 10,
            "cut_done_at": T0 + 10.2,
            "quota": 2,
            "stopped": ["r2"],
            "instances_serving_during_cut": 2,
            "lift_started_at": T0 + 22,
        },
        {"planned_instances": 2, "instances_held": 2},
    ),
}

#: one broken value per drill criterion read from the figures or ground truth
BREAK: list[tuple[str, str, str, Any]] = [
    ("node-loss", "figures", "interruption_s", 11.0),
    ("node-loss", "figures", "interruption_sustained", False),
    ("node-loss", "figures", "replacement_serving_s", 61.0),
    ("oom-kill", "figures", "restart_s", 31.0),
    ("oom-kill", "figures", "warmup_ratio", 11.0),
    ("oom-kill", "figures", "interruption_s", 10.5),
    ("oom-kill", "figures", "interruption_sustained", False),
    ("network-jitter", "figures", "duplicate_generations", 1),
    ("network-jitter", "figures", "extra_generations", 1),
    ("traffic-spike", "figures", "scale_out_s", 30.5),
    ("traffic-spike", "figures", "recovery_s", 61.0),
    ("upstream-timeout", "figures", "hung_requests", 1),
    ("upstream-timeout", "figures", "ejection_s", 5.5),
    ("simultaneous-restarts", "figures", "all_serving_s", 61.0),
    ("simultaneous-restarts", "figures", "interruption_s", 12.0),
    # one of the quota's two replicas served during the cut (HAProxy's log): 0.5x
    ("quota-cut", "ground", "instances_serving_during_cut", 1),
]


@pytest.mark.parametrize("drill", sorted(GOOD))
def test_each_drill_passes_when_it_meets_its_criteria(drill: str) -> None:
    ground, fig = GOOD[drill]
    v = judge_drill(facts(drill, steady(T0, T0 + 35), dict(fig), dict(ground)))
    assert v.state == "passed", (drill, v.reasons)
    assert not [r for r in v.rows if r["result"] == "fail"]


@pytest.mark.parametrize(("drill", "where", "name", "value"), BREAK)
def test_each_drill_criterion_fails_with_its_reason(
    drill: str, where: str, name: str, value: Any
) -> None:
    ground, fig = (dict(x) for x in GOOD[drill])
    (fig if where == "figures" else ground)[name] = value
    v = judge_drill(facts(drill, steady(T0, T0 + 35), fig, ground))
    assert v.state == "failed", (drill, name, v.reasons)
    criterion = "instances_held" if name == "instances_serving_during_cut" else name
    assert any(strip_blame(r).endswith(f"({criterion})") for r in v.reasons), v.reasons
    # the same break with the criterion turned off is no longer a failure
    v_off = judge_drill(facts(drill, steady(T0, T0 + 35), fig, ground), {criterion: "off"})
    assert v_off.state == "passed", v_off.reasons


def test_a_load_that_could_not_start_is_an_error_not_an_abort() -> None:
    v = judge_drill(
        facts(
            "oom-kill",
            [],
            {},
            {},
            journal_status="aborted",
            errors=["the load could not run: no request to http://x succeeded during warm-up"],
        )
    )
    assert v.state == "error"
    assert v.reasons == ["the load could not run: no request to http://x succeeded during warm-up"]
    # a real interruption stays an abort
    v = judge_drill(facts("oom-kill", [], {}, {}, journal_status="aborted"))
    assert v.state == "aborted" and v.reasons == ["stopped: the run was interrupted"]


def test_a_console_that_went_away_does_not_stop_the_run() -> None:
    """``chaos-infer gameday | head``: writes to the closed pipe raise; progress is dropped so
    the rollbacks and the lab's take-down still run (seen in a rehearsal: a runner whose stdout
    closed left its lab up)."""
    from chaoslib_infer.gameday import redacting_progress

    seen: list[str] = []

    def console(msg: str) -> None:
        if len(seen) >= 1:
            raise BrokenPipeError(32, "Broken pipe")
        seen.append(msg)

    say = redacting_progress(console, ["sk-test-secret-123456"])
    say("lab: up with sk-test-secret-123456")
    say("drill oom-kill: FAILED")  # raises inside: swallowed
    say("lab: taking down")  # dropped, never raises
    assert seen == ["lab: up with [REDACTED]"]


def test_a_lagging_client_makes_the_drill_inconclusive() -> None:
    """Kernel receive stamps against the loop's handling time: a client 0.3 s behind its own
    socket cannot vouch for its chunk times or its schedule."""

    def kernel(records: list[dict[str, Any]], lag: float) -> list[dict[str, Any]]:
        for r in records:
            r["time_source"] = "kernel"
            r["chunk_times_loop"] = [t + lag for t in r["chunk_times"]]
        return records

    ok = judge_drill(facts("oom-kill", kernel(steady(T0, T0 + 30), 0.002), OOM_FIG, OOM_GROUND))
    rows = {r["criterion"]: r for r in ok.rows}
    assert ok.state == "passed" and rows["client_lag_p99_s"]["result"] == "pass"
    late = judge_drill(facts("oom-kill", kernel(steady(T0, T0 + 30), 0.3), OOM_FIG, OOM_GROUND))
    assert late.state == "inconclusive"
    assert late.reasons[0].startswith(
        "the client fell behind its schedule (it read late): client lag P99 (kernel receive to "
        "handling): 0.3"
    )
    loop = judge_drill(facts("oom-kill", steady(T0, T0 + 30), OOM_FIG, OOM_GROUND))
    assert {r["criterion"]: r for r in loop.rows}["client_lag_p99_s"]["result"] == "unmeasured"


def test_a_closed_loop_load_leaves_the_schedule_lag_unmeasured_never_passed() -> None:
    """Locust's users send when the previous reply is in (intended_at == sent_at): a lag of 0
    measured nothing. The open-loop client's row passes on the same records; Locust's reads
    unmeasured with the reason, and the closed-loop warning is a note of the verdict."""
    recs = steady(T0, T0 + 30)
    open_loop = judge_drill(facts("oom-kill", recs, OOM_FIG, OOM_GROUND))
    assert {r["criterion"]: r for r in open_loop.rows}["send_lag_p99_s"]["result"] == "pass"
    note = "Locust users are closed loop, not an open-loop schedule"
    closed = judge_drill(facts("oom-kill", recs, OOM_FIG, OOM_GROUND, closed_loop=note))
    row = {r["criterion"]: r for r in closed.rows}["send_lag_p99_s"]
    assert row["result"] == "unmeasured" and row["value"] is None
    assert row["note"] is not None and "closed-loop" in row["note"]
    assert f"load: {note}" in closed.notes
    assert closed.state == "passed"  # the note qualifies the figures; it does not void them


def test_a_lost_load_worker_makes_the_drill_inconclusive_naming_it() -> None:
    line = "Locust worker pid 4242 died during the drill (found dead at +12.0 s)"
    v = judge_drill(facts("oom-kill", steady(T0, T0 + 30), OOM_FIG, OOM_GROUND, load_lost=[line]))
    assert v.state == "inconclusive"
    assert v.reasons == [f"the load was not what was planned: {line}"]
    assert f"load: {line}" in v.notes
    # 5xx answers do not depend on the load's schedule: failed outranks it, and the lost worker
    # is listed beside
    bad = steady(T0, T0 + 30)
    for r in bad[150:160]:
        r.update(ok=False, error_class="http_5xx", status=503)
    v = judge_drill(facts("oom-kill", bad, OOM_FIG, OOM_GROUND, load_lost=[line]))
    assert v.state == "failed"
    assert v.reasons[0] == (  # the failures it counts named by class (issue 30)
        "availability (whole drill): 0.9667 < 0.999; failed: 10 http_5xx (503) (availability)"
    )
    assert v.reasons[-1] == f"also inconclusive: the load was not what was planned: {line}"


def test_locust_json_with_a_lost_worker_reaches_ground_truth_verdict_and_evidence(
    tmp_path: Path,
) -> None:
    """The Locust control's ``locust.json`` (note, workers_lost) in a drill folder: the evidence
    carries the note and the lost worker (ground truth, verdict notes and reason, evidence.md),
    the drill is inconclusive, the schedule lag unmeasured."""
    from chaoslib_infer.gameday_evidence import drill_evidence
    from chaoslib_infer.load.records import RecordWriter
    from chaoslib_infer.locust.control import CO_NOTE, LOCUST_FILE

    drill_dir = tmp_path / "oom-kill"
    drill_dir.mkdir()
    with RecordWriter(drill_dir / "records.jsonl") as w:
        for r in steady(T0, T0 + 30):
            w.write(r)
    (drill_dir / LOCUST_FILE).write_text(
        json.dumps(
            {
                "engine": "locust", "locustfile": "lf.py", "users": 8, "processes": 2,
                "note": CO_NOTE, "worker_pids": [4242, 4243],
                "workers_lost": [{"pid": 4242, "found_dead_at": T0 + 12.5}],
            }
        )
    )  # fmt: skip
    target = {"kind": "url", "url": "http://127.0.0.1:1", "engine": "unknown", "replicas": 0}
    entry = drill_evidence(
        "oom-kill", "experiments/oom-kill.yaml", "OOM kill", drill_dir, {}, None, target,
        T0, T0 + 30, kind="oom-kill",
    )  # fmt: skip
    load = entry["ground_truth"]["load"]
    assert load["note"] == CO_NOTE and [w["pid"] for w in load["workers_lost"]] == [4242]
    assert entry["status"] == "inconclusive"
    (reason,) = [r for r in entry["reasons"] if "pid 4242" in r]
    assert reason.startswith("the load was not what was planned: Locust worker pid 4242")
    assert "+12.5 s from the drill start" in reason
    assert f"load: {CO_NOTE}" in entry["verdict"]["notes"]
    rows = {r["criterion"]: r for r in entry["verdict"]["rows"]}
    assert rows["send_lag_p99_s"]["result"] == "unmeasured"
    evidence = (drill_dir / "evidence.md").read_text(encoding="utf-8")
    assert CO_NOTE in evidence and "pid 4242" in evidence
    # no locust.json: the built-in client's drill has neither
    (drill_dir / LOCUST_FILE).unlink()
    entry = drill_evidence(
        "oom-kill", "experiments/oom-kill.yaml", "OOM kill", drill_dir, {}, None, target,
        T0, T0 + 30, kind="oom-kill",
    )  # fmt: skip
    assert "load" not in entry["ground_truth"]
    assert not any(n.startswith("load: ") for n in entry["verdict"]["notes"])


def test_a_recovery_that_missed_its_deadline_fails_the_drill_not_errors_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method probe raising ServiceFinding, run by chaoslib itself: the journal reads
    ``deviated``, the finding is the verdict's reason, and a plain ActivityFailed stays an error."""
    from chaoslib.experiment import run_experiment

    from chaoslib_infer.evidence.journal import drill_status, method_findings
    from chaoslib_infer.evidence.verdicts import drill_verdict

    (tmp_path / "waits_mod.py").write_text(
        "from chaoslib.exceptions import ActivityFailed\n"
        "from chaoslib_infer.errors import ServiceFinding\n"
        "def ok():\n    return True\n"
        "def never_back():\n"
        "    raise ServiceFinding('replica r0 did not serve a request within 60 s of the fault')\n"
        "def broken():\n    raise ActivityFailed('no oom-kill fault recorded in this run')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def journal(func: str) -> dict[str, Any]:
        probe = {"type": "python", "module": "waits_mod", "func": "ok"}
        experiment = {
            "version": "1.0.0",
            "title": "t",
            "description": "t",
            "steady-state-hypothesis": {
                "title": "up",
                "probes": [{"type": "probe", "name": "up", "tolerance": True, "provider": probe}],
            },
            "method": [
                {
                    "type": "probe",
                    "name": "wait-for-replica-serving-again",
                    "provider": {**probe, "func": func},
                }
            ],
        }
        return dict(run_experiment(experiment))

    finding = journal("never_back")
    assert drill_status(finding) == "deviated"
    assert method_findings(finding) == [
        "wait-for-replica-serving-again: replica r0 did not serve a request within 60 s of "
        "the fault"
    ]
    v = drill_verdict(
        name="oom-kill",
        drill_dir=tmp_path,
        journal=finding,
        records=felt("oom-kill", steady(T0, T0 + 30), OOM_GROUND),
        figures=OOM_FIG,
        ground=OOM_GROUND,
        lab_events=[],
        ledger_measured=True,
    )
    assert v.state == "failed"
    assert v.reasons == [
        "during the fault: wait-for-replica-serving-again: replica r0 did not serve a request "
        "within 60 s of the fault"
    ]
    tool = journal("broken")
    assert drill_status(tool) == "error"
    assert method_findings(tool) == []


def _mutate(
    records: list[dict[str, Any]],
    a: float,
    b: float,
    pick: Any = None,
    e2e: float | None = None,
    **update: Any,
) -> list[dict[str, Any]]:
    """Records sent in ``[T0 + a, T0 + b)`` (those ``pick`` keeps) get ``update``; ``e2e`` sets
    their end; a failure loses its output."""
    for r in records:
        if not (T0 + a <= r["sent_at"] < T0 + b) or (pick is not None and not pick(r)):
            continue
        r.update(update)
        if e2e is not None:
            r["end_at"] = r["sent_at"] + e2e
        if update.get("ok") is False:
            r.update(first_token_at=None, first_byte_at=None, chunk_times=[])
    return records


_FAIL = {"ok": False, "e2e": 0.01}
#: the common rates every failure of a window also breaks
_SLO_RATES = ("availability", "availability_fault", "error_rate")

#: criteria read from the records: (drill, ground update, mutation, criterion, also off: the
#: criteria the same records break too, turned off so the reason is the criterion's own)
RECORD_BREAK: list[Any] = [
    pytest.param(
        "traffic-spike",
        {},
        {"a": 12, "b": 13, **_FAIL, "status": 500, "error_class": "http_5xx"},
        "non_shed_failures_fault",
        _SLO_RATES,
        id="spike-answered-with-fast-500s",
    ),
    pytest.param(
        "traffic-spike",
        {},
        {"a": 12, "b": 13, **_FAIL, "status": 502, "error_class": "http_5xx"},
        "non_shed_failures_fault",
        _SLO_RATES,
        id="spike-answered-with-fast-502s",
    ),
    pytest.param(
        "traffic-spike",
        {},
        {"a": 12, "b": 13, **_FAIL, "status": None, "error_class": "reset"},
        "non_shed_failures_fault",
        _SLO_RATES,
        id="spike-answered-with-resets",
    ),
    pytest.param(
        "traffic-spike",
        {},
        {
            "a": 12,
            "b": 12.1,
            "ok": False,
            "e2e": 10.0,
            "status": 200,
            "error_class": "timeout_ttft",
        },
        "non_shed_failures_fault",
        ("timeouts_fault", "timeout_rate_fault", *_SLO_RATES),
        id="spike-answered-with-a-timeout",
    ),
    pytest.param(
        "traffic-spike",
        {},
        # 429s that kept the user waiting 3 s: the shed P99 breaks (and, with it judged, they
        # are no shed: failures; off, every 429/503 is a shed again)
        {"a": 12, "b": 13, "ok": False, "e2e": 3.0, "status": 429, "error_class": "http_429"},
        "shed_p99_s",
        (),
        id="spike-answered-with-slow-429s",
    ),
    pytest.param(
        "traffic-spike",
        {},
        # 4 s of the 10 s spike shed: 40 % of its requests, over the 25 % budget
        {"a": 12, "b": 16, **_FAIL, "status": 429, "error_class": "http_429"},
        "shed_share_fault",
        (),
        id="spike-shed-beyond-its-budget",
    ),
    pytest.param(
        "traffic-spike",
        {},
        # the service answers 500 to everything from 2 s after the spike's end
        {"a": 22, "b": 35, **_FAIL, "status": 500, "error_class": "http_5xx"},
        "availability_after",
        (*_SLO_RATES, "slo_after", "recovery_s"),
        id="spike-followed-by-fast-500s",
    ),
    pytest.param(
        "traffic-spike",
        {},
        # fast 503s after the spike are no shed: no overload is left to shed (two: the after
        # window's ~100 requests fail at 2 failures; one is within 99.9 %, "Windows with
        # stated error rates")
        {"a": 30, "b": 30.2, **_FAIL, "status": 503, "error_class": "http_5xx"},
        "availability_after",
        (*_SLO_RATES, "slo_after"),
        id="spike-followed-by-a-fast-503",
    ),
    pytest.param(
        "oom-kill",
        {},
        # one request of the fault window hangs until the client's first-token timeout
        {
            "a": 10,
            "b": 10.1,
            "ok": False,
            "e2e": 10.0,
            "status": 200,
            "error_class": "timeout_ttft",
        },
        "timeout_rate_fault",
        ("availability", "availability_fault", "error_rate"),
        id="timeout-in-the-fault-window",
    ),
    pytest.param(
        "oom-kill",
        {},
        # successful but slow: 5 of the fault window's requests take 12 s
        {"a": 11, "b": 11.5, "e2e": 12.0},
        "p99_e2e_fault_s",
        ("p99_e2e_s",),
        id="slow-in-the-fault-window",
    ),
    pytest.param(
        "oom-kill",
        {},
        # every request after the drill takes 1 s against the baseline's 0.3 s
        {"a": 20, "b": 35, "e2e": 1.0},
        "p99_after_vs_baseline",
        ("recovery_s",),  # never back inside the baseline's latency band either
        id="slower-after-the-drill",
    ),
    pytest.param(
        "oom-kill",
        {},
        # one 500 after the fault, out of its window: 1 of 350 requests
        {"a": 25, "b": 25.1, **_FAIL, "status": 500, "error_class": "http_5xx"},
        "error_rate",
        ("availability",),
        id="an-error-after-the-fault",
    ),
    pytest.param(
        "simultaneous-restarts",
        {"replicas": ["r0"], "survivors": ["r1", "r2"]},
        # r1 survives but gets nothing: r2 carries the whole fault window
        {"a": 10, "b": 15, "replica": "r2"},
        "max_survivor_share",
        (),
        id="one-survivor-carries-everything",
    ),
]


@pytest.mark.parametrize(
    ("drill", "ground_update", "mutation", "criterion", "also_off"), RECORD_BREAK
)
def test_each_criterion_read_from_the_records_fails_with_its_reason(
    drill: str,
    ground_update: dict[str, Any],
    mutation: dict[str, Any],
    criterion: str,
    also_off: tuple[str, ...],
) -> None:
    ground, fig = dict(GOOD[drill][0]), dict(GOOD[drill][1])
    ground.update(ground_update)
    records = _mutate(steady(T0, T0 + 35), **mutation)
    off = dict.fromkeys(also_off, "off")
    v = judge_drill(facts(drill, records, fig, ground), off)
    assert v.state == "failed", (drill, criterion, v.reasons)
    rows = {r["criterion"]: r for r in v.rows}
    assert rows[criterion]["result"] == "fail"
    mine = [r for r in v.reasons if r.endswith(f"({criterion})")]
    assert len(mine) == 1, v.reasons
    c = next(c for c in criteria_for(drill) if c.name == criterion)
    # the reason names the figure, its value and its threshold
    assert mine[0].startswith(f"{c.label}: ")
    fails = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[c.op]
    assert f" {fails} " in mine[0]
    assert rows[criterion]["value"] is not None and rows[criterion]["threshold"] == c.threshold
    # the same records with the criterion turned off are no longer a failure
    v_off = judge_drill(facts(drill, records, fig, ground), {**off, criterion: "off"})
    assert v_off.state == "passed", v_off.reasons


def test_spike_shed_as_fast_429_and_503_passes_and_only_those_are_shed() -> None:
    ground, fig = (dict(x) for x in GOOD["traffic-spike"])
    records = steady(T0, T0 + 35)
    _mutate(records, 12, 12.5, **_FAIL, status=429, error_class="http_429")
    _mutate(records, 12.5, 13, **_FAIL, status=503, error_class="http_5xx")
    v = judge_drill(facts("traffic-spike", records, fig, ground))
    assert v.state == "passed", v.reasons
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["non_shed_failures_fault"]["value"] == 0.0
    assert rows["shed_p99_s"]["result"] == "pass"
    # fast 500s are no shed answer: the shed P99 has nothing to time, and the drill fails
    records = _mutate(steady(T0, T0 + 35), 12, 13, **_FAIL, status=500, error_class="http_5xx")
    v = judge_drill(facts("traffic-spike", records, fig, ground))
    rows = {r["criterion"]: r for r in v.rows}
    assert rows["shed_p99_s"]["result"] == "n/a"
    assert v.state == "failed"
    # every other failure counts against the common SLOs too: 10 of the 350 requests, 10 of the
    # fault window's 102 (the spike's 100 and 2 in flight at its start)
    assert v.reasons == [
        "failures during the spike not shed as a fast 429/503 (resets, other 5xx, timeouts): "
        "10 > 0 (non_shed_failures_fault)",
        "availability (whole drill): 0.9714 < 0.999; failed: 10 http_5xx (500) (availability)",
        "requests lost to the fault: 10 (fault-window availability): 0.902 < 0.999; failed: 10 "
        "http_5xx (500) (availability_fault)",
        "error rate (whole drill): 0.02857 >= 0.001; failed: 10 http_5xx (500) (error_rate)",
    ]


def test_survivors_sharing_the_load_pass_max_survivor_share() -> None:
    ground, fig = (dict(x) for x in GOOD["simultaneous-restarts"])
    ground.update(replicas=["r0"], survivors=["r1", "r2"])
    # the restarting r0's requests go to r2: r1 and r2 share the fault window 1:2
    records = _mutate(
        steady(T0, T0 + 35), 10, 15, pick=lambda r: r["replica"] == "r0", replica="r2"
    )
    v = judge_drill(facts("simultaneous-restarts", records, fig, ground))
    rows = {r["criterion"]: r for r in v.rows}
    assert v.state == "passed", v.reasons
    assert rows["max_survivor_share"]["result"] == "pass"
    assert rows["max_survivor_share"]["value"] == pytest.approx(2 / 3, abs=0.02)


def test_one_criterion_probe_refuses_unknown_and_whole_drill_criteria(tmp_path: Path) -> None:
    from chaoslib_infer.activities.criteria import drill_criteria

    cfg = {"infer_run_dir": str(tmp_path / "run"), "infer_lab_dir": str(tmp_path / "no-lab")}
    with pytest.raises(ValueError, match="unknown criterion 'nope'; fault-window ones: .*hung"):
        drill_criteria("upstream-timeout", "nope", cfg)
    # judged over the whole drill: complete only at the end of the run, never a probe's answer
    with pytest.raises(ValueError, match="'duplicate_generations' is judged over the drill"):
        drill_criteria("network-jitter", "duplicate_generations", cfg)
    # a fault-window criterion before any fault: nothing to judge yet, the probe passes
    assert drill_criteria("upstream-timeout", "hung_requests", cfg) == {
        "passed": True,
        "state": "no fault yet",
        "reasons": [],
        "judged": False,
        "criterion": "hung_requests",
        "value": None,
        "threshold": None,
        "result": "no fault yet",
    }


def test_criteria_overrides_keep_only_this_drills_items_and_reach_the_duplicates_probe(
    tmp_path: Path,
) -> None:
    from chaoslib_infer.activities.criteria import drill_criteria
    from chaoslib_infer.drills.network_jitter.probes import duplicates_check
    from chaoslib_infer.verdict import overrides_for

    text = "restart_s=20,network-jitter:wasted_tokens=5,oom-kill:warmup_ratio=off"
    assert overrides_for(text, "oom-kill") == {"restart_s": 20.0, "warmup_ratio": None}
    assert overrides_for(text, "network-jitter") == {"restart_s": 20.0, "wasted_tokens": 5.0}
    cfg = {
        "infer_run_dir": str(tmp_path / "run"),
        "infer_lab_dir": str(tmp_path / "lab"),
        "infer_criteria": "network-jitter:wasted_tokens=5",
    }
    # another drill's item is skipped (one shared value serves every drill's probes)
    out = drill_criteria("oom-kill", "restart_s", cfg)
    assert out["result"] == "no fault yet" and out["value"] is None and out["criterion"]
    with pytest.raises(ValueError, match="unknown drill 'nope-drill'"):
        drill_criteria("nope-drill", None, cfg)
    # the operator's duplicate budget (plan, --criterion) replaces the experiment's default 0
    (tmp_path / "lab").mkdir()
    ledger = [_gen("a", T0), _gen("a", T0 + 1), _gen("b", T0)]
    (tmp_path / "lab" / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger))
    (tmp_path / "run" / "records.jsonl").write_text(
        "".join(json.dumps(rec(T0 + i, rid=r)) + "\n" for i, r in enumerate("ab"))
    )
    cfg["infer_criteria"] = ""
    assert duplicates_check(0, cfg)["passed"] is False  # 1 duplicate > 0
    cfg["infer_criteria"] = "duplicate_generations=1"
    got = duplicates_check(0, cfg)
    assert (got["value"], got["threshold"], got["passed"]) == (1, 1.0, True)
    cfg["infer_criteria"] = "network-jitter:duplicate_generations=off"
    got = duplicates_check(0, cfg)
    assert (got["threshold"], got["passed"]) == (None, True)


def test_the_duplicates_probe_fails_closed_when_nobody_measured_them(tmp_path: Path) -> None:
    """A ledger without a generation line of this run's requests measured no duplicate: the probe
    reads unmeasured, never 0, and does not pass its budget; the verdict, not a hypothesis line,
    then says what that makes the drill (inconclusive: its key row is unmeasured too)."""
    from chaoslib_infer.drills.network_jitter.probes import duplicates_check
    from chaoslib_infer.evidence.verdicts import hypothesis_failures

    (tmp_path / "lab").mkdir()
    (tmp_path / "run").mkdir()
    ledger = [_gen("other", T0), _gen("other", T0 + 1)]  # another client's requests only
    (tmp_path / "lab" / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger))
    (tmp_path / "run" / "records.jsonl").write_text(
        "".join(json.dumps(rec(T0 + i, rid=r)) + "\n" for i, r in enumerate("ab"))
    )
    cfg = {"infer_run_dir": str(tmp_path / "run"), "infer_lab_dir": str(tmp_path / "lab")}
    got = duplicates_check(0, cfg)
    assert (got["value"], got["threshold"], got["result"], got["passed"]) == (
        None,
        0.0,
        "unmeasured",
        False,
    )
    assert got["reasons"] == [
        "duplicate generations unmeasured: the engine ledger holds no generation line of this "
        "run's 2 requests (duplicate_generations)"
    ]
    journal = {
        "steady_states": {
            "after": {
                "steady_state_met": False,
                "probes": [
                    {
                        "activity": {"name": "duplicate-generations-within-budget"},
                        "tolerance_met": False,
                        "output": got,
                    }
                ],
            }
        }
    }
    assert hypothesis_failures(journal) == []
    v = judge_drill(
        facts(
            "network-jitter",
            steady(T0, T0 + 30),
            {"duplicate_generations": None, "retries": 0},
            JITTER_GROUND,
        )
    )
    assert v.state == "inconclusive", v.reasons
    assert v.reasons == [
        "duplicate generations is unmeasured on this target (duplicate_generations): the drill "
        "cannot answer its question"
    ]
    # no budget: nothing judged, nothing failed
    cfg["infer_criteria"] = "network-jitter:duplicate_generations=off"
    got = duplicates_check(0, cfg)
    assert (got["value"], got["result"], got["passed"]) == (None, "unmeasured", True)


def test_a_second_chaos_run_in_the_same_run_dir_sets_the_old_fault_log_aside(
    tmp_path: Path,
) -> None:
    from chaoslib_infer.activities.criteria import drill_criteria
    from chaoslib_infer.controls.load import before_experiment_control

    run = tmp_path / "run"
    run.mkdir()
    old = json.dumps({"kind": "oom-kill", "replica": "r1", "fault_at": T0}) + "\n"
    (run / "faults.jsonl").write_text(old)
    cfg = {"infer_run_dir": str(run), "infer_lab_dir": str(tmp_path / "no-lab")}
    # the load refuses a bad argument, but only after the earlier run's log is set aside
    with pytest.raises(Exception, match="unknown argument"):
        before_experiment_control({}, cfg, nonsense=1)
    assert not (run / "faults.jsonl").exists()
    (kept,) = run.glob("faults.*.jsonl")
    assert kept.read_text() == old  # the earlier evidence is kept
    assert drill_criteria("oom-kill", "restart_s", cfg)["state"] == "no fault yet"


def test_override_values_refused_and_kept() -> None:
    from chaoslib_infer.verdict import overrides_for

    assert parse_override("restart_s=OFF") == (None, "restart_s", None)
    assert parse_override("restart_s=0") == (None, "restart_s", 0.0)
    for bad, fragment in (
        ("restart_s=", "empty value"),
        ("restart_s=none", "write 'off'"),
        ("restart_s=-3", "negative"),
    ):
        with pytest.raises(ValueError, match=fragment):
            parse_override(bad)
    with pytest.raises(ValueError, match="negative"):
        criteria_for("oom-kill", {"restart_s": -1})
    # the experiment's infer_criteria: a conflict in one scope is refused, across scopes not
    with pytest.raises(ValueError, match="restart_s given twice with different values: 2 and 3"):
        overrides_for("restart_s=2,restart_s=3", "oom-kill")
    assert overrides_for("restart_s=2,oom-kill:restart_s=3", "oom-kill") == {"restart_s": 3.0}
