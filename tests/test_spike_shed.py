"""traffic-spike judges the common SLOs with shedding as its own class (issue 20, item 4).

A fast 429/503 during the spike is a shed: left out of availability, error and timeout rates,
judged by its own budget (``shed_share_fault``) and answer time (``shed_p99_s``). Every other
failure counts in every window; a 429/503 outside the spike is a failure; a defect present from
the first request is the baseline's; errors after the spike fail the after window; the
experiment's hypotheses never fail a sane shed. Synthetic records (unix seconds), expected
figures counted from the records by hand, never by the functions under test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaoslib_infer.activities.slo import shed_check, slo_check
from chaoslib_infer.drills.traffic_spike import shed as sh
from chaoslib_infer.evidence.verdicts import hypothesis_failures
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.metrics import window_stats
from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.policy import VerdictPolicy
from chaoslib_infer.verdict.state import ALSO_FAILED

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000.0
FAULT_AT, SPIKE_END, LOAD_END = T0 + 10, T0 + 20, T0 + 35
GROUND = {"fault_at": FAULT_AT, "spike_end_at": SPIKE_END}
FIGURES = {"requests_during_spike": 200, "recovery_s": 5.0, "scale_out_s": 2.0}


STRICT = VerdictPolicy("strict")


def rec(sent: float, status: int = 200, took: float = 0.3, **kw: Any) -> dict[str, Any]:
    """One attempt sent at ``sent``, answered ``status`` after ``took`` seconds."""
    ok = status == 200
    out = {
        "request_id": f"q{sent:.3f}",
        "attempt": 1,
        "final": True,
        "intended_at": sent,
        "sent_at": sent,
        "end_at": sent + took,
        "first_token_at": sent + 0.01 if ok else None,
        "chunk_times": [sent + 0.01, sent + took] if ok else [],
        "ok": ok,
        "status": status,
        "error_class": None if ok else ("http_429" if status == 429 else "http_5xx"),
        "replica": "r0",
    }
    out.update(kw)
    return out


def load(spike_rate: float = 20.0) -> list[dict[str, Any]]:
    """10 req/s, ``spike_rate`` req/s during the spike, 10 req/s after: all answered 200."""
    out = [rec(T0 + i / 10) for i in range(100)]
    out += [rec(FAULT_AT + i / spike_rate) for i in range(int(10 * spike_rate))]
    out += [rec(SPIKE_END + i / 10) for i in range(150)]
    return out


def answer(records: list[dict[str, Any]], a: float, b: float, every: int = 1, **kw: Any) -> int:
    """Answer every ``every``-th record sent in ``[a, b)`` with ``rec(..., **kw)``; the count."""
    hit = [i for i, r in enumerate(records) if a <= r["sent_at"] < b][::every]
    for i in hit:
        records[i] = rec(records[i]["sent_at"], **kw)
    return len(hit)


def judge(records: list[dict[str, Any]], overrides: dict[str, Any] | None = None) -> Any:
    # the SLO rows judged as SLOs (strict); the default policy judges the fault by its budget
    facts = DrillFacts("traffic-spike", records, dict(FIGURES), dict(GROUND), policy=STRICT)
    return judge_drill(facts, overrides)


def in_fault_window(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By hand: sent in the spike, or sent before it and still in flight at its start."""
    return [
        r
        for r in records
        if FAULT_AT <= r["sent_at"] < SPIKE_END or r["sent_at"] < FAULT_AT < r["end_at"]
    ]


def rows(verdict: Any) -> dict[str, dict[str, Any]]:
    return {r["criterion"]: r for r in verdict.rows}


# ---- the verdict -------------------------------------------------------------------------------
def test_a_sane_429_shed_passes_on_its_own_budget() -> None:
    records = load()
    shed = answer(records, FAULT_AT + 2, FAULT_AT + 8, every=4, status=429, took=0.004)
    v = judge(records)
    assert v.state == "passed", v.reasons
    assert v.reasons == []
    got = rows(v)
    window = in_fault_window(records)
    assert shed == 30 and len(window) == 202  # 200 of the spike, 2 in flight at its start
    assert got["shed_share_fault"]["value"] == pytest.approx(30 / 202)
    assert (
        got["shed_share_fault"]["result"] == "pass" and got["shed_share_fault"]["threshold"] == 0.25
    )
    assert got["shed_p99_s"]["value"] == pytest.approx(0.004, rel=1e-3)
    # the shed requests are left out of the common SLOs; nothing else failed
    for name in ("availability", "availability_fault", "availability_after"):
        assert got[name]["value"] == 1.0 and got[name]["result"] == "pass", name
    assert got["error_rate"]["value"] == 0.0 and got["non_shed_failures_fault"]["value"] == 0.0
    # one sane 429 alone: passed too
    records = load()
    answer(records, FAULT_AT + 5, FAULT_AT + 5.01, status=429, took=0.004)
    assert judge(records).state == "passed"


def test_fast_500s_from_the_first_request_are_a_baseline_defect_not_the_spikes() -> None:
    for status in (500, 503):  # a 503 with no overload to shed is a failure too
        records = load()
        failed = answer(records, T0, LOAD_END, every=20, status=status, took=0.01)
        v = judge(records)
        assert v.state == "failed", (status, v.reasons)
        # the baseline's reason first: 5 of its 98 requests failed (2 more were in flight at the
        # spike's start); the rows the drill failed follow it, never hidden by it (issue 29)
        base = [r for r in records if r["sent_at"] < FAULT_AT and r["end_at"] <= FAULT_AT]
        assert sum(not r["ok"] for r in base) == 5 and len(base) == 98 and failed == 23
        assert any("(availability_after)" in r for r in v.reasons[1:]), v.reasons
        assert all(r.startswith(ALSO_FAILED) for r in v.reasons[1:]), v.reasons
        assert v.reasons[0].startswith(
            "the service did not meet its SLOs before the fault (not blamed on the fault): "
            f"availability (baseline): {1 - 5 / 98:.4g} < 0.999; 5 failed of 98: fails at 2 or "
            "more failed of 98 (false alarm 0.45 % at the SLO, bound 5 %); catches a 2 % defect "
            "only 59 % of the time at n=98; 194 needed for 90 % (availability)"
        ), v.reasons


def test_500s_after_the_spike_fail_though_recovery_once_saw_a_good_run() -> None:
    records = load()
    # slow for 2 s after the spike, back in its bands for 6 s, then 500 to everything
    answer(records, SPIKE_END, SPIKE_END + 2, took=3.0)
    answer(records, SPIKE_END + 8, LOAD_END, status=500, took=0.01)
    base = window_stats(records, end=FAULT_AT)
    recovery = mfig.recovery(records, SPIKE_END, base)
    assert recovery == 2.0  # the recovery figure saw the good run and stopped looking
    facts = DrillFacts(
        "traffic-spike", records, {**FIGURES, "recovery_s": recovery}, GROUND, policy=STRICT
    )
    v = judge_drill(facts)
    got = rows(v)
    assert got["recovery_s"]["result"] == "pass"
    assert v.state == "failed"
    after = [r for r in records if r["sent_at"] >= SPIKE_END + 5]  # the after window, by hand
    assert len(after) == 100 and sum(not r["ok"] for r in after) == 70
    assert (
        "availability after the spike (a 429/503 counts as a failure): 0.3 < 0.999; 70 failed "
        "of 100: fails at 2 or more failed of 100 (false alarm 0.46 % at the SLO, bound 5 %); "
        "catches a 2 % defect only 60 % of the time at n=100; 194 needed for 90 %; failed: 70 "
        "http_5xx (500) (availability_after)"
    ) in v.reasons
    assert (  # 70 of 450, their class named (issue 30)
        "availability (whole drill): 0.8444 < 0.999; failed: 70 http_5xx (500) (availability)"
    ) in v.reasons


def test_a_slow_429_is_no_shed_and_every_other_failure_counts() -> None:
    records = load()
    answer(records, FAULT_AT + 2, FAULT_AT + 3, status=429, took=3.0)  # 20 slow refusals
    answer(records, FAULT_AT + 4, FAULT_AT + 4.5, status=None, took=0.01, error_class="reset")
    v = judge(records)
    got = rows(v)
    assert v.state == "failed"
    assert got["non_shed_failures_fault"]["value"] == 30.0  # 20 slow 429s + 10 resets
    assert got["shed_share_fault"]["value"] == 0.0
    assert got["availability_fault"]["value"] == pytest.approx(1 - 30 / 202)
    assert "P99 time to a shed answer (429/503): 3 s > 1 s (shed_p99_s)" in v.reasons
    # with the shed answer time not judged, any 429/503 is a shed: only the resets count
    got = rows(judge(records, {"shed_p99_s": "off"}))
    assert got["non_shed_failures_fault"]["value"] == 10.0
    assert got["shed_share_fault"]["value"] == pytest.approx(20 / 202)


def test_the_shed_budget_breaks_and_is_overridden_like_every_criterion() -> None:
    records = load()
    shed = answer(records, FAULT_AT, SPIKE_END, every=2, status=503, took=0.02)
    assert shed == 100
    v = judge(records)
    assert v.state == "failed"
    assert v.reasons == [
        f"share of the spike's requests shed as a fast 429/503: {100 / 202:.4g} > 0.25 "
        "(shed_share_fault)"
    ]
    assert judge(records, {"shed_share_fault": 0.6}).state == "passed"
    off = judge(records, {"shed_share_fault": "off"})
    assert off.state == "passed" and rows(off)["shed_share_fault"]["result"] == "not judged"


# ---- the classes on logical requests -------------------------------------------------------
def test_a_shed_is_a_logical_request_whose_final_attempt_was_refused_fast() -> None:
    retried_ok = [
        rec(T0, status=503, took=0.01, request_id="a", final=False),
        rec(T0 + 1, request_id="a", attempt=2),
    ]
    shed_after_reset = [
        rec(T0, status=None, took=0.01, request_id="b", final=False, error_class="reset"),
        rec(T0 + 1, status=429, took=0.01, request_id="b", attempt=2),
    ]
    slow = [rec(T0, status=429, took=2.0, request_id="c")]
    no_id = [rec(T0 + 2, status=429, took=0.01, request_id=None)]
    cut = [rec(T0 + 3, status=429, took=0.01, request_id="d", cut_off=True)]
    records = retried_ok + shed_after_reset + slow + no_id + cut
    assert len(sh.shed_ids(records, 1.0)) == 2  # b and the record without an id
    assert sh.shed_counts(records, 1.0) == (2, 4)  # the cut-off attempt is no request
    assert sh.shed_counts(records, 1.0, T0 + 1.5) == (1, 1)  # by the first send: no_id only
    assert sh.shed_share(records, None) == 3 / 4  # any 429/503: the slow one too
    assert sh.non_shed_failures(records, 1.0) == 1  # the slow 429
    kept = sh.without_shed(records, 1.0)
    assert sorted(str(r["request_id"]) for r in kept) == ["a", "a", "c", "d"]
    assert sh.shed_answer_p99_s(records) == pytest.approx(2.0, rel=1e-3)
    assert sh.shed_answer_p99_s(retried_ok[1:]) is None


# ---- the experiment's hypotheses ---------------------------------------------------------------
def _run_dir(tmp_path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"infer_run_dir": str(tmp_path)}


def _recent(n_ok: int, refusals: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """``n_ok`` successes over the last 20 s, then ``(status, took)`` refusals."""
    now = time.time()
    out = [rec(now - 25 + i * 20 / n_ok) for i in range(n_ok)]
    out += [rec(now - 4 - i * 0.01, status=s, took=t) for i, (s, t) in enumerate(refusals)]
    return out


def test_the_hypothesis_never_fails_a_sane_shed(tmp_path: Path) -> None:
    conf = _run_dir(tmp_path, _recent(200, [(429, 0.004)] * 3))
    # three sane 429s fail the availability probe without shedding as a class (3 of 203 reach
    # its binomial test's 2 failures)
    plain = slo_check("availability", window_s=30, configuration=conf)
    assert plain["passed"] is False and plain["test"]["fails_at"] == 2
    for metric in ("availability", "error_rate", "timeout_rate"):
        row = slo_check(metric, window_s=30, configuration=conf, shed=True)
        assert row["passed"] is True and row["shed_requests"] == 3, (metric, row)
        assert row["requests"] == 200
    sane = shed_check(window_s=30, configuration=conf)
    assert sane["passed"] is True and sane["reasons"] == []
    assert sane["value"] == pytest.approx(3 / 203) and sane["shed"] == 3
    assert sane["requests"] == 203 and sane["threshold"] == 0.25


def test_the_hypothesis_fails_an_insane_shed_and_names_it(tmp_path: Path) -> None:
    # 100 fast refusals of 200 requests, and three 429s that took 2 s (no shed: failures)
    conf = _run_dir(tmp_path, _recent(97, [(503, 0.01)] * 100 + [(429, 2.0)] * 3))
    row = slo_check("availability", window_s=30, configuration=conf, shed=True)
    assert row["passed"] is False and row["value"] == pytest.approx(97 / 100)
    out = shed_check(window_s=30, configuration=conf)
    assert out["passed"] is False
    assert out["reasons"] == [
        "shed share 0.5 > 0.25 (100 of 200 requests shed as a fast 429/503)",
        "shed answer P99 2 s > 1 s",  # 3 of the 103 refusals took 2 s
    ]
    # the journal's reason for the deviated probe names both
    journal = {
        "steady_states": {
            "after": {
                "probes": [
                    {
                        "activity": {"name": "shed-is-sane"},
                        "tolerance_met": False,
                        "output": out,
                    }
                ]
            }
        }
    }
    assert hypothesis_failures(journal) == [("after", "shed-is-sane: " + "; ".join(out["reasons"]))]
    # thresholds overridden like the criteria's (infer_criteria)
    conf["infer_criteria"] = "traffic-spike:shed_share_fault=0.6,traffic-spike:shed_p99_s=3"
    assert shed_check(window_s=30, configuration=conf)["passed"] is True


@pytest.mark.parametrize(
    "path", ["experiments/traffic-spike.yaml", "experiments/k8s/traffic-spike.yaml"]
)
def test_the_traffic_spike_experiments_judge_shedding_as_its_own_class(path: str) -> None:
    exp = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    probes = {p["name"]: p["provider"] for p in exp["steady-state-hypothesis"]["probes"]}
    for name in ("availability-meets-slo", "error-rate-meets-slo", "timeout-rate-meets-slo"):
        assert probes[name]["arguments"].get("shed") is True, name
    assert probes["shed-is-sane"]["func"] == "shed_check"
    assert probes["shed-is-sane"]["module"] == "chaoslib_infer.activities.slo"
    # the hypothesis window still covers the spike (15 s) and its settling
    assert int(exp["configuration"]["window_s"]) >= 15 or path.startswith("experiments/k8s")


def test_no_other_experiment_leaves_a_shed_out() -> None:
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        if path.stem == "traffic-spike":
            continue
        text = path.read_text(encoding="utf-8")
        assert "shed: true" not in text and "shed_check" not in text, path
