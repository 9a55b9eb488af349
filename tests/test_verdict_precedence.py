"""Precedence that keeps evidence, and one judge (issue 29, items 6 and 7).

Synthetic records through the real judge (``tests/verdictkit.py``):

- a failed baseline is listed first, and every other failed row after it, never instead of them;
- a deviated hypothesis after the fault, and every failed row measured from ground truth, fail
  the drill whatever else is inconclusive (a short baseline), the inconclusive reason beside;
- a client that fell behind in the warm-up is inconclusive naming the client, not a defect of
  the service, and the probes (the SLO probe, the drill-criteria probe) leave out its own
  not-sent requests;
- the in-run drill-criteria probe and the final verdict read node-loss's sustained service the
  same way (the probe waits for the drill's own 10 s settling window), and where a probe and
  the verdict still differ the evidence says which is final and why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from test_verdict import OOM_FIG, facts
from verdictkit import OOM_GROUND, T0, rec, steady

from chaoslib_infer.activities.criteria import drill_criteria, settle_s
from chaoslib_infer.activities.slo import slo_check
from chaoslib_infer.evidence.figures import drill_figures
from chaoslib_infer.evidence.render import render_drill
from chaoslib_infer.evidence.verdicts import PROBE_DIFFERS, drill_verdict, probe_differences
from chaoslib_infer.load.inflight import not_sent_record
from chaoslib_infer.verdict import DrillFacts, exit_code, judge_drill
from chaoslib_infer.verdict.state import (
    ALSO_FAILED,
    ALSO_INCONCLUSIVE,
    BEFORE_FAULT,
    CLIENT_INDEPENDENT,
    SCHEDULE_DEPENDENT,
    WARMUP_LAG,
)

#: oom-kill's restart threshold is 30 s: a replica back after 40 s breaks it (ground truth)
SLOW_RESTART = {**OOM_FIG, "restart_s": 40.0}
RESTART_REASON = "restart (death to first request served): 40 s > 30 s (restart_s)"
#: an after-hypothesis SLO probe that deviated, as evidence/verdicts.py words it
AFTER_LINE = "slo-availability: availability = 0.6 (>= 0.999 required, 80 logical requests)"


def late(records: list[dict[str, Any]], lag: float = 2.0) -> list[dict[str, Any]]:
    """``records`` sent ``lag`` s after they were due: the client's own schedule lag."""
    return [{**r, "intended_at": r["sent_at"] - lag} for r in records]


def test_a_failed_baseline_is_listed_first_and_every_other_failed_row_after_it() -> None:
    """Issue 29: a failed baseline returned early and hid every other failed row."""
    records = steady(T0, T0 + 30)
    for r in records[::10]:  # 10 % failures throughout, the baseline included
        r.update(ok=False, error_class="http_5xx")
    v = judge_drill(facts("oom-kill", records, SLOW_RESTART, OOM_GROUND))
    assert v.state == "failed"
    assert v.reasons[0].startswith(f"{BEFORE_FAULT} (not blamed on the fault): availability ")
    rest = v.reasons[1:]  # each listed, not blamed on the fault alone
    assert all(r.startswith(ALSO_FAILED) for r in rest), rest
    assert ALSO_FAILED + RESTART_REASON in rest
    assert any(r.endswith("(availability_fault)") for r in rest), rest
    failing = [r["criterion"] for r in v.rows if r["result"] == "fail"]
    for name in failing:  # every failed row is named, none hidden by the baseline's reason
        assert any(f"({name})" in r for r in rest), (name, rest)
    # the same service with a healthy baseline: the rows alone, no defect before the fault
    healthy_before = [r if r["sent_at"] >= T0 + 10 else {**r, **rec(r["sent_at"])} for r in records]
    v = judge_drill(facts("oom-kill", healthy_before, SLOW_RESTART, OOM_GROUND))
    assert v.state == "failed" and not v.reasons[0].startswith(BEFORE_FAULT)
    assert RESTART_REASON in v.reasons


def test_a_deviated_after_hypothesis_fails_the_drill_beside_a_short_baseline() -> None:
    """Issue 29: with any inconclusive reason, a deviated after-hypothesis was dropped (a third
    of the streams cut read INCONCLUSIVE, exit 3)."""
    records = steady(
        T0 + 8, T0 + 30
    )  # 18 requests judged before the fault (2 cross it): too few (< 50)
    hyp = [("after", AFTER_LINE)]
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND, hypothesis_failures=hyp))
    assert v.state == "failed" and exit_code([v.state]) == 1, v.reasons
    assert v.reasons[0] == f"steady-state hypothesis after the fault deviated: {AFTER_LINE}"
    assert v.reasons[-1] == (
        f"{ALSO_INCONCLUSIVE}baseline holds 18 requests (< 50): too few to see a defect of a few "
        "percent"
    )
    # without the deviation the short baseline alone is inconclusive
    v = judge_drill(facts("oom-kill", records, OOM_FIG, OOM_GROUND))
    assert v.state == "inconclusive"
    # a client that fell behind measured the after-hypothesis's SLO itself: inconclusive, and
    # the deviation is kept among the reasons, never dropped
    v = judge_drill(facts("oom-kill", late(records), OOM_FIG, OOM_GROUND, hypothesis_failures=hyp))
    assert v.state == "inconclusive", v.reasons
    assert f"steady-state hypothesis after the fault deviated: {AFTER_LINE}" in v.reasons
    assert any(
        r.startswith("the client fell behind its schedule (it sent late)") for r in v.reasons
    )


def test_rows_measured_from_ground_truth_beat_an_unrelated_inconclusive_reason() -> None:
    """A replica back after 40 s is a failure whatever the baseline held; the short baseline is
    listed beside it."""
    assert {
        "restart_s",
        "replacement_serving_s",
        "all_serving_s",
        "health_disagreement_s",
        "max_wait_s",
        "instances_held",
    } <= CLIENT_INDEPENDENT
    records = steady(T0 + 8, T0 + 30)
    v = judge_drill(facts("oom-kill", records, SLOW_RESTART, OOM_GROUND))
    assert v.state == "failed", v.reasons
    assert v.reasons[0] == RESTART_REASON
    assert v.reasons[-1].startswith(f"{ALSO_INCONCLUSIVE}baseline holds 18 requests (< 50)")
    # a row timed by the client (the interruption) stays behind the inconclusive reason, listed
    slow = {**OOM_FIG, "interruption_s": 25.0}
    v = judge_drill(facts("oom-kill", records, slow, OOM_GROUND))
    assert v.state == "inconclusive", v.reasons
    assert any(r.endswith("(interruption_s)" + SCHEDULE_DEPENDENT) for r in v.reasons), v.reasons


def test_a_client_lagging_in_the_warm_up_is_inconclusive_naming_the_client() -> None:
    """The hypothesis before the fault deviated (the method never ran: no fault) on a P99 the
    client measured while it sent 2 s late: the client's, not a defect of the service."""
    records = steady(T0, T0 + 25, rate=8.0)
    line = "slo-p99: p99_e2e_s = 2.31 (<= 2.0 required, 200 logical requests)"
    hyp = [("before", line)]
    v = judge_drill(DrillFacts("oom-kill", late(records), {}, {}, hypothesis_failures=hyp))
    assert v.state == "inconclusive" and exit_code([v.state]) == 3, v.reasons
    assert v.reasons[0].startswith(
        f"{WARMUP_LAG} (it sent late): client schedule lag P99: 2 s > 1 s (send_lag_p99_s)"
    )
    assert v.reasons[0].endswith(f"not blamed on it: {line}")
    assert not any(BEFORE_FAULT in r for r in v.reasons)
    assert not any("baseline holds" in r for r in v.reasons)  # no fault: not another reason
    # the same deviation with a client that kept up: the service's defect before the fault
    v = judge_drill(DrillFacts("oom-kill", records, {}, {}, hypothesis_failures=hyp))
    assert (v.state, v.reasons) == ("failed", [f"{BEFORE_FAULT} (not blamed on the fault): {line}"])
    # a probe that did not measure through the client stays the service's defect, lag or not
    gone = [("before", "replicas-in-service: 2 (3 expected; missing: r2)")]
    v = judge_drill(DrillFacts("oom-kill", late(records), {}, {}, hypothesis_failures=gone))
    assert v.state == "failed"
    assert v.reasons[0] == f"{BEFORE_FAULT} (not blamed on the fault): {gone[0][1]}"
    assert v.reasons[-1].startswith(f"{ALSO_INCONCLUSIVE}the client fell behind its schedule")


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _unsent(records: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Every ``every``-th request kept back by a full in-flight cap (``not_sent``)."""
    return [
        not_sent_record(r["request_id"], r["intended_at"], r["sent_at"], 64, 64)
        if i % every == 0
        else r
        for i, r in enumerate(records)
    ]


def test_the_slo_probe_leaves_out_the_not_sent_requests_of_a_client_that_fell_behind(
    tmp_path: Path,
) -> None:
    now = time.time()
    base = _unsent(steady(now - 9.5, now - 0.5), every=10)  # 90 requests, 9 not sent
    for name, records, passed, left in (
        ("kept-up", base, False, None),  # the service held every slot: its failure
        ("late", late(base), True, 9),  # the client's own cap: left out, named
    ):
        run = tmp_path / name
        run.mkdir()
        _write(run / "records.jsonl", records)
        out = slo_check("availability", 10.0, {"infer_run_dir": str(run)})
        assert out["passed"] is passed, out
        assert out.get("not_sent_left_out") == left
        if left:
            assert out["value"] == 1.0 and out["requests"] == 81
            assert out["client_fell_behind"] == [
                "client schedule lag P99: 2 s > 1 s (send_lag_p99_s)"
            ]


def test_the_criteria_probe_leaves_out_the_not_sent_requests_of_a_client_that_fell_behind(
    tmp_path: Path,
) -> None:
    fault_at = T0 + 10
    base = steady(T0, T0 + 30)
    base = [
        not_sent_record(r["request_id"], r["intended_at"], r["sent_at"], 64, 64)
        if fault_at <= r["sent_at"] < fault_at + 3 and i % 2 == 0
        else r
        for i, r in enumerate(base)
    ]
    for name, records, state in (("kept-up", base, "failed"), ("late", late(base), "inconclusive")):
        run = tmp_path / name
        run.mkdir()
        fault = {"kind": "oom-kill", "replica": "r0", "fault_at": fault_at}
        (run / "faults.jsonl").write_text(json.dumps(fault) + "\n")
        _write(run / "records.jsonl", records)
        cfg = {
            "infer_run_dir": str(run),
            "infer_lab_dir": str(tmp_path / "no-lab"),
            "infer_verdict_policy": "strict",
        }
        out = drill_criteria("oom-kill", None, cfg)
        assert out["state"] == state, out
        assert out["passed"] is (state != "failed")
        if state == "failed":
            assert "availability_fault" in out["failed_criteria"]
        else:
            assert any(
                r.startswith("the client fell behind its schedule (it sent") for r in out["reasons"]
            )


NODE_FAULT_AT = T0 + 20


def _node_loss_run(run: Path, until: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A node-loss run folder whose records end at ``T0 + until``: r0 lost at T0 + 20, every
    request failing for 2 s (the gateway had not ejected it yet), then served by the survivors.
    Returns the probe's configuration and the records."""
    records = steady(T0, T0 + until)
    for r in records:
        if NODE_FAULT_AT <= r["sent_at"] < NODE_FAULT_AT + 2:
            r.update(ok=False, error_class="reset", status=None, chunk_times=[])
        elif r["sent_at"] >= NODE_FAULT_AT and r["replica"] == "r0":
            r["replica"] = "r1"
    run.mkdir(exist_ok=True)
    fault = {"kind": "node-loss", "fault_at": NODE_FAULT_AT, "replicas": ["r0"], "node": "n0"}
    (run / "faults.jsonl").write_text(json.dumps(fault) + "\n")
    _write(run / "records.jsonl", records)
    return {"infer_run_dir": str(run), "infer_lab_dir": str(run / "no-lab")}, records


def test_the_probe_and_the_verdict_read_node_loss_sustained_service_alike(tmp_path: Path) -> None:
    """Issue 29: a default game day's node-loss read "PASSED (hypothesis before: held, after:
    DID NOT HOLD)" while every row of its after table passed: the probe judged
    ``interruption_sustained`` once the records reached 5 s past the last failure, node-loss's
    figures time it over 10 s (``SETTLE_S``): 0 < 1 in the probe, 1 in the verdict."""
    assert settle_s("node-loss") == 10.0 and settle_s("oom-kill") == 5.0
    run = tmp_path / "run"
    # the last failure ends at T0 + 22.3; records to T0 + 29.3: past 5 s, short of 10 s
    cfg, _ = _node_loss_run(run, 29.0)
    early = drill_criteria("node-loss", "interruption_sustained", cfg)
    assert early["result"] != "fail" and early["passed"] is True, early
    cfg, records = _node_loss_run(run, 45.0)  # the whole run: 23 s past the last failure
    probe = drill_criteria("node-loss", "interruption_sustained", cfg)
    figures, ground = drill_figures(run, [], [])
    verdict = judge_drill(DrillFacts("node-loss", records, figures, ground))
    row = next(r for r in verdict.rows if r["criterion"] == "interruption_sustained")
    assert (probe["result"], probe["value"]) == (row["result"], row["value"]) == ("pass", 1.0)
    # a service failing a quarter of its requests to the end of the run: the probe cannot see
    # service sustained again yet and leaves that row to the verdict, but both fail the
    # interruption (25 s so far, > 10 s)
    cfg, records = _node_loss_run(run, 45.0)
    for r in records[::4]:
        if r["sent_at"] >= NODE_FAULT_AT:
            r.update(ok=False, error_class="reset", status=None, chunk_times=[])
    _write(run / "records.jsonl", records)
    probe = drill_criteria("node-loss", None, cfg)
    figures, ground = drill_figures(run, [], [])
    verdict = judge_drill(DrillFacts("node-loss", records, figures, ground))
    rows = {r["criterion"]: r["result"] for r in verdict.rows}
    assert "interruption_s" in probe["failed_criteria"] and rows["interruption_s"] == "fail"
    assert "interruption_sustained" not in probe["failed_criteria"]
    assert rows["interruption_sustained"] == "fail"


def _journal(output: dict[str, Any]) -> dict[str, Any]:
    probe = {
        "activity": {"name": "drill-criteria-hold"},
        "output": output,
        "tolerance_met": bool(output.get("passed")),
    }
    return {
        "status": "deviated",
        "deviated": True,
        "steady_states": {
            "before": {"steady_state_met": True, "probes": []},
            "after": {"steady_state_met": False, "probes": [probe]},
        },
    }


def test_the_evidence_says_the_verdict_is_final_where_the_probe_differed(tmp_path: Path) -> None:
    cfg, records = _node_loss_run(tmp_path / "run", 45.0)
    figures, ground = drill_figures(tmp_path / "run", [], [])
    ground["replicas_killed_at"] = {"r0": NODE_FAULT_AT}  # the lab's record of the loss
    said = "service sustained after the interruption: 0 < 1 (interruption_sustained)"
    out = {"passed": False, "state": "failed", "reasons": [said], "judged": True}
    for given in ({**out, "failed_criteria": ["interruption_sustained"]}, out):  # older: reasons
        journal = _journal(given)
        v = drill_verdict("node-loss", tmp_path, journal, records, figures, ground, [], True)
        assert v.state == "passed", v.reasons
        notes = [n for n in v.notes if n.startswith(PROBE_DIFFERS)]
        assert notes == [
            "in-run probe drill-criteria-hold (hypothesis after the fault) failed "
            "interruption_sustained, which the verdict reads pass (1): the probe judged the "
            "records written by its own time, while the run went on; the verdict judged every "
            "record of the run and is final"
        ]
    # the evidence shows it under the verdict, beside "hypothesis ... after: DID NOT HOLD"
    entry = {
        "name": "node-loss",
        "status": v.state,
        "reasons": v.reasons,
        "verdict": v.as_dict(),
        "hypothesis": {"before": True, "after": False},
        "experiment": "x.yaml",
        "started_at": "a",
        "ended_at": "b",
        "figures": {},
        "ground_truth": {},
    }
    drill = tmp_path / "drill"
    drill.mkdir()
    md, html = render_drill(drill, entry, {"kind": "lab"}, "t", {"before": [], "after": []}, [], [])
    head = md.read_text().splitlines()[2:4]
    assert head[0] == "- Verdict: **PASSED** (hypothesis before: held, after: DID NOT HOLD)"
    assert head[1] == f"- Note: {notes[0]}"
    assert f'<p class="note">{notes[0]}</p>' in html.read_text()
    # a probe the verdict agrees with: nothing to explain
    failing = [
        {**r, "ok": False, "error_class": "reset"} if r["sent_at"] >= NODE_FAULT_AT else r
        for r in records
    ]
    journal = _journal({**out, "failed_criteria": ["interruption_sustained"]})
    v = judge_drill(
        DrillFacts("node-loss", failing, {**figures, "interruption_sustained": False}, ground)
    )
    assert v.state == "failed"
    assert probe_differences(journal, v) == []


def test_the_criteria_probe_of_a_drill_without_interruption_sustained_never_names_it(
    tmp_path: Path,
) -> None:
    """The probe leaves ``interruption_sustained`` to the verdict only in the drills that judge
    it: upstream-timeout has none, and its probe raised "unknown criterion
    'interruption_sustained'" (read as "hypothesis after deviated: drill-criteria-hold: None")
    when the records stopped within the settling window of the last failure."""
    cfg, _ = _node_loss_run(tmp_path / "run", 24.0)  # 1.7 s past the last failure
    out = drill_criteria("upstream-timeout", None, cfg)
    assert out["judged"] is True and "interruption_sustained" not in out["failed_criteria"], out
