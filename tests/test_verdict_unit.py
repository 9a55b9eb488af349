"""One unit, and attribution at the injection (issue 20, items 3 and 5).

The steady-state probes and the criteria judge logical requests (a request with its client
retries; it fails only when its final attempt failed), with attempts beside; what retries cost
is judged in every drill that retried; an attempt crossing the injection goes to the fault when
it was healthy then, to the baseline when it was already overdue. Synthetic records (unix
seconds) through the real probe, figure and judge code.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_verdict import GOOD, JITTER_GROUND, felt

from chaoslib_infer.activities.slo import logical_window, slo_check
from chaoslib_infer.evidence.figures import common_figures
from chaoslib_infer.evidence.verdicts import hypothesis_failures
from chaoslib_infer.lab.requestlog import RequestLogEntry, gateway_retries
from chaoslib_infer.load.records import RecordWriter
from chaoslib_infer.measure.metrics import window_stats
from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.attribution import ALLOWANCE_FLOOR_S, assign, ttft_allowance
from chaoslib_infer.verdict.blame import strip_blame
from chaoslib_infer.verdict.judge import NO_RETRY
from chaoslib_infer.verdict.policy import VerdictPolicy

REPLICAS = ("r0", "r1", "r2")


def attempt(
    rid: str,
    sent: float,
    *,
    n: int = 1,
    final: bool = True,
    ok: bool = True,
    e2e: float = 0.3,
    replica: str = "r1",
    error_class: str | None = None,
    first_token: float | None = 0.01,
) -> dict[str, Any]:
    """One attempt record (contracts.md section 3); ``first_token`` in s after the send."""
    ft = sent + first_token if first_token is not None else None
    return {
        "request_id": rid,
        "attempt": n,
        "final": final,
        "intended_at": sent,
        "sent_at": sent,
        "end_at": sent + e2e,
        "first_token_at": ft,
        "first_byte_at": ft,
        "chunk_times": [ft, sent + e2e] if ft is not None else [],
        "ok": ok,
        "error_class": None if ok else (error_class or "reset"),
        "status": 200 if (ok or ft is not None) else None,
        "replica": replica,
        "output_tokens": 24 if ok else 0,
    }


def steady(t0: float, t1: float, rate: float = 10.0) -> list[dict[str, Any]]:
    """Healthy requests every ``1/rate`` s, round robin over three replicas."""
    n = int((t1 - t0) * rate)
    return [
        attempt(f"q{i}", t0 + i / rate, replica=REPLICAS[i % 3]) for i in range(n)
    ]  # fmt: skip


def gen(rid: str, t: float, replica: str, prompt: int, completion: int) -> list[dict[str, Any]]:
    """A generation's two ledger lines (start, end) on ``replica``."""
    base = {"replica": replica, "request_id": rid, "pid": 1}
    return [
        {"t": t, "event": "generation", **base},
        {
            "t": t + 0.2,
            "event": "generation_end",
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "outcome": "done",
            **base,
        },
    ]


def ledger_for(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine ledger of ``records``: one generation per attempt that reached a replica and
    produced a first token (a reset stream was generating when it was cut: 4 tokens, the full
    answer 24); 10 prompt tokens each."""
    out: list[dict[str, Any]] = []
    for r in records:
        if r["first_token_at"] is not None:
            out += gen(r["request_id"], r["sent_at"], r["replica"], 10, 24 if r["ok"] else 4)
    return out


def hide_resets(records: list[dict[str, Any]], a: float, b: float) -> set[str]:
    """Reset every stream on r0 sent in ``[a, b)`` after its first token, and retry it 0.2 s
    later on r1, where it succeeds; returns the reset request ids."""
    reset: set[str] = set()
    for r in list(records):
        if r["replica"] == "r0" and a <= r["sent_at"] < b:
            r.update(ok=False, error_class="reset", final=False, end_at=r["sent_at"] + 0.1)
            r["chunk_times"] = [r["first_token_at"]]
            records.append(attempt(r["request_id"], r["end_at"] + 0.2, n=2, replica="r1"))
            reset.add(r["request_id"])
    return reset


def write_run(run_dir: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Write ``records`` as a run's ``records.jsonl``; the probes' configuration."""
    with RecordWriter(run_dir / "records.jsonl") as w:
        for r in records:
            w.write(r)
    return {"infer_run_dir": str(run_dir)}


def journal_of(outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A journal whose after-hypothesis holds the SLO probes' real outputs (tolerance
    ``$.passed``), its before-hypothesis empty."""
    probes = [
        {
            "activity": {"name": f"{metric}-meets-slo"},
            "output": out,
            "tolerance_met": bool(out["passed"]),
        }
        for metric, out in outputs.items()
    ]
    return {"steady_states": {"before": {"probes": []}, "after": {"probes": probes}}}


# -- 3. one unit -------------------------------------------------------------------------------


def test_retries_that_hide_resets_fail_on_their_cost_with_rows_and_reasons_that_agree(
    tmp_path: Path,
) -> None:
    t0 = time.time() - 40.0  # the probes judge the last window_s seconds of wall time
    records = steady(t0, t0 + 35)
    reset = hide_resets(records, t0 + 10, t0 + 20)
    assert len(reset) == 33
    ledger = ledger_for(records)
    # what the attempts alone read: the failures the retries hid
    assert window_stats(records)["availability"] == pytest.approx(350 / 383)

    # the probes: logical requests, attempts beside; the hypothesis holds
    conf = write_run(tmp_path, records)
    outputs = {
        m: slo_check(m, window_s=60, configuration=conf)
        for m in ("availability", "error_rate", "timeout_rate")
    }
    avail = outputs["availability"]
    assert (avail["value"], avail["requests"], avail["passed"]) == (1.0, 350, True)
    assert avail["unit"] == "logical requests"
    assert avail["attempts"] == 383 and avail["attempt_value"] == pytest.approx(350 / 383)
    assert avail["retries"] == 33
    assert hypothesis_failures(journal_of(outputs)) == []

    # the verdict: failed on what the retries cost, every availability row 1.0
    fig = {**common_figures(records, ledger), "retries": 33}
    assert (fig["duplicate_generations"], fig["extra_generations"]) == (33, 33)
    assert fig["wasted_tokens"] == 33 * (10 + 4)  # the cut generations, prefill included
    ground = {**JITTER_GROUND, "fault_at": t0 + 10, "cleared_at": t0 + 20}
    v = judge_drill(
        DrillFacts(
            "network-jitter",
            records,
            fig,
            ground,
            hypothesis_failures=hypothesis_failures(journal_of(outputs)),
        )
    )
    assert v.state == "failed"
    assert [strip_blame(r) for r in v.reasons] == [
        "duplicate generations: 33 > 0 (duplicate_generations)",
        "generations paid twice (extra): 33 > 0 (extra_generations)",
        "tokens of generations paid twice (prompt + completion): 462 > 0 (wasted_tokens)",
    ]
    # their streams failed at the client, which re-sent them, while the engine's ledger shows
    # no fault on them: the mechanism the records show (issue 30), not "the client gave up"
    assert all(
        "; BLAME: gateway or network (33 requests: their stream failed" in r for r in v.reasons
    ), v.reasons
    rows = {r["criterion"]: r for r in v.rows}
    for name in ("availability", "availability_fault"):  # shown; the budget judges the loss
        assert (rows[name]["value"], rows[name]["result"]) == (1.0, "not judged")
    assert (rows["budget_cost_s"]["value"], rows["budget_share"]["result"]) == (0.0, "pass")
    assert (rows["retries"]["value"], rows["retries"]["result"]) == (33, "not judged")
    # the fault window: the requests first sent in it and those crossing the injection, each
    # with every attempt
    crossing = sum(1 for r in records if r["sent_at"] < t0 + 10 < r["end_at"])
    assert v.windows["fault"]["requests"] == 100 + crossing
    assert v.windows["fault"]["attempts"] == 133 + crossing


def test_a_baseline_whose_attempts_were_retried_and_succeeded_is_no_defect(
    tmp_path: Path,
) -> None:
    t0 = time.time() - 40.0
    records = steady(t0, t0 + 35)
    # 3 resets before the fault, each refused before generating (no first token) and retried
    for r in [r for r in records if r["replica"] == "r0" and r["sent_at"] < t0 + 9][:3]:
        r.update(ok=False, error_class="reset", final=False, end_at=r["sent_at"] + 0.05)
        r.update(first_token_at=None, first_byte_at=None, chunk_times=[], status=None)
        records.append(attempt(r["request_id"], r["end_at"] + 0.2, n=2, replica="r1"))
    ledger = ledger_for(records)

    before = slo_check("availability", window_s=60, configuration=write_run(tmp_path, records))
    assert before["passed"] is True and before["value"] == 1.0
    assert before["attempt_value"] == pytest.approx(350 / 353)

    fig = {**common_figures(records, ledger), **GOOD["oom-kill"][1]}
    ground = {**GOOD["oom-kill"][0], "fault_at": t0 + 10, "replica_serving_again_at": t0 + 12}
    v = judge_drill(DrillFacts("oom-kill", felt("oom-kill", records, ground), fig, ground))
    assert v.state == "passed", v.reasons
    rows = {r["criterion"]: r for r in v.rows}
    # the retries are judged for their cost: nothing was generated twice
    assert (rows["duplicate_generations"]["value"], rows["duplicate_generations"]["result"]) == (
        0,
        "pass",
    )
    assert rows["retries"]["value"] == 3


def test_a_request_awaiting_its_retry_has_no_outcome_yet() -> None:
    t0 = 1_800_000_000.0
    records = steady(t0, t0 + 10)
    first = records[5]
    first.update(ok=False, error_class="reset", final=False)
    stats = logical_window(records, t0, t0 + 10)
    assert stats["pending_retries"] == 1 and stats["requests"] == 99
    assert stats["availability"] == 1.0 and stats["attempts"]["availability"] == 0.99
    # its retry failed too, and was the last allowed: a failure in both units
    records.append(attempt(first["request_id"], first["end_at"] + 0.2, n=2, ok=False))
    stats = logical_window(records, t0, t0 + 10)
    assert stats["pending_retries"] == 0 and stats["requests"] == 100
    assert stats["availability"] == 0.99 and stats["retries"] == 1


def test_the_hypothesis_line_names_the_unit_and_shows_attempts_beside() -> None:
    out = {
        "metric": "availability",
        "value": 0.98,
        "op": ">=",
        "threshold": 0.999,
        "passed": False,
        "requests": 100,
        "unit": "logical requests",
        "attempts": 104,
        "attempt_value": 0.9423,
    }
    assert hypothesis_failures(journal_of({"availability": out})) == [
        (
            "after",
            "availability-meets-slo: availability = 0.98 (>= 0.999 required, 100 logical "
            "requests; attempts: 0.9423 over 104)",
        )
    ]


@pytest.mark.parametrize("drill", sorted(GOOD))
def test_retry_cost_is_judged_in_every_drill_that_retried(drill: str) -> None:
    t0 = 1_800_000_000.0
    ground, good = GOOD[drill]
    records = felt(drill, steady(t0, t0 + 35), ground)
    plain = judge_drill(
        DrillFacts(drill, records, {**good, **common_figures(records, ledger_for(records))}, ground)
    )
    assert plain.state == "passed", plain.reasons
    rows = {r["criterion"]: r for r in plain.rows}
    if drill != "network-jitter":  # nobody retried: nothing to cost
        assert (rows["duplicate_generations"]["result"], rows["retries"]["note"]) == (
            "n/a",
            NO_RETRY,
        )
    # the gateway retried one request that was already generating: generated twice for one
    # client attempt (HAProxy's log says so; the client saw nothing)
    ledger = ledger_for(records) + gen("q7", t0 + 1.0, "r2", 10, 24)
    fig = {**good, **common_figures(records, ledger), "gateway_retries": 1}
    assert fig["retry_amplification"] == 2.0 and fig["retries"] == 0
    v = judge_drill(DrillFacts(drill, records, fig, ground))
    assert v.state == "failed", (drill, v.reasons)
    reasons = [strip_blame(r) for r in v.reasons]
    assert "duplicate generations: 1 > 0 (duplicate_generations)" in reasons
    assert (
        "upstream generations per client attempt (gateway retries): 2x > 1x (retry_amplification)"
        in reasons
    )
    # the gateway alone re-sent it: blamed on the gateway, never on the client
    assert all("; BLAME: gateway (" in r for r in v.reasons), v.reasons


def test_gateway_retries_from_the_haproxy_log() -> None:
    def entry(rid: str | None, retries: str) -> RequestLogEntry:
        return RequestLogEntry(1.0, "r0", 200, 0, 0, 1, 5, 10, "----", retries, rid, "POST /")

    log = [entry("a", "0"), entry("a", "+2"), entry("b", "1"), entry("c", "-"), entry(None, "3")]
    assert gateway_retries(log, {"a", "b", "c"}) == 3
    assert gateway_retries(log, {"c"}) == 0


# -- 5. attribution at the injection -----------------------------------------------------------

T0 = 1_800_000_000.0
NODE_GROUND = {
    **GOOD["node-loss"][0],
    "fault_at": T0 + 10,
    "replicas_killed_at": T0 + 10,
    "replica_serving_again_at": T0 + 14,
}
NODE_FIG = GOOD["node-loss"][1]


def cut_by_node_loss(records: list[dict[str, Any]]) -> set[str]:
    """Streams on r0 still in flight at the node loss (T0 + 10), first token already come:
    reset by it; returns their ids."""
    cut = set()
    for r in records:
        if r["replica"] == "r0" and r["sent_at"] < T0 + 10 < r["end_at"]:
            r.update(ok=False, error_class="reset", end_at=T0 + 10.05)
            cut.add(r["request_id"])
    return cut


def slow_streams(records: list[dict[str, Any]]) -> None:
    """Every request streams for 2 s (its first token after 10 ms): at any instant ~20 are in
    flight."""
    for r in records:
        r["end_at"] = r["sent_at"] + 2.0
        r["chunk_times"] = [r["first_token_at"], r["end_at"]]


def hang_on(records: list[dict[str, Any]], replica: str) -> set[str]:
    """Every request ``replica`` takes hangs without a first token until the client's 10 s
    first-token timeout; returns their ids."""
    hung = set()
    for r in records:
        if r["replica"] == replica:
            r.update(ok=False, error_class="timeout_ttft", end_at=r["sent_at"] + 10.0)
            r.update(first_token_at=None, first_byte_at=None, chunk_times=[], status=None)
            hung.add(r["request_id"])
    return hung


def on_wire_at_injection(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["sent_at"] < T0 + 10 < r["end_at"]]


def test_the_streams_a_node_loss_cuts_stay_the_faults() -> None:
    records = steady(T0, T0 + 35)
    slow_streams(records)
    cut = cut_by_node_loss(records)
    assert len(cut) == 7  # r0's streams sent in the 2 s before the loss
    on_wire = on_wire_at_injection(records)
    assert len(on_wire) == 19  # sent 8.1 .. 9.9 s, 2 s streams
    # the default policy: the 7 cut streams cost 0.7 s of full outage (by hand: 1 s buckets of
    # intended send time aligned on the injection; [8, 9) s holds 3 cut of 10 sent, [9, 10) s
    # 4 of 10; equal to 7 failures at 10 requests/s), 0.027 % of the 2,592 s monthly budget
    v = judge_drill(DrillFacts("node-loss", records, NODE_FIG, NODE_GROUND))
    rows = {r["criterion"]: r for r in v.rows}
    assert v.state == "passed", v.reasons
    assert rows["budget_cost_s"]["value"] == pytest.approx(0.7)
    assert rows["budget_share"]["value"] == pytest.approx(0.7 / 2592)
    assert rows["budget_share"]["result"] == "pass"
    assert rows["availability_fault"]["label"].startswith("requests lost to the fault: 7 ")
    for name in ("availability", "availability_fault", "timeout_rate_fault", "error_rate"):
        assert rows[name]["result"] == "not judged", name
        assert rows[name]["note"].startswith("not judged under policy default: "), name
    # the strict policy: no request may be lost to the fault
    strict = VerdictPolicy("strict")
    v = judge_drill(DrillFacts("node-loss", records, NODE_FIG, NODE_GROUND, policy=strict))
    assert v.state == "failed"
    assert not any("before the fault" in r for r in v.reasons), v.reasons
    assert (
        v.reasons[0] == "availability (whole drill): 0.98 < 0.999; failed: 7 reset (availability)"
    )
    fault_n = 50 + len(on_wire)  # first sent in the 5 s fault window, and the crossing ones
    fault_avail = f"{(fault_n - 7) / fault_n:.4g}"
    assert (
        f"requests lost to the fault: 7 (fault-window availability): {fault_avail} < 0.999; "
        "failed: 7 reset (availability_fault)"
    ) in v.reasons
    crossed = v.windows["fault"]["crossed_injection"]
    assert (crossed["attempts"], crossed["to_fault"], crossed["to_baseline"]) == (19, 19, 0)
    assert v.windows["baseline"]["requests"] == 100 - 19
    assert v.windows["fault"]["requests"] == fault_n
    assert any(n.startswith("crossed the injection: 19 attempts in flight") for n in v.notes)


def test_a_hang_present_from_the_start_is_a_baseline_defect_not_the_faults() -> None:
    records = steady(T0, T0 + 35)
    slow_streams(records)
    hung = hang_on(records, "r2")
    cut = cut_by_node_loss(records)
    v = judge_drill(DrillFacts("node-loss", records, NODE_FIG, NODE_GROUND))
    assert v.state == "failed"
    # the baseline defect first; the hang goes on after the fault too, so the after window
    # fails as well: listed after it as what the defect may account for, never instead of it
    assert len(v.reasons) == 2, v.reasons
    assert v.reasons[1].startswith("also failed") and "(slo_after)" in v.reasons[1], v.reasons
    assert v.reasons[0].startswith(
        "the service did not meet its SLOs before the fault (not blamed on the fault): "
        "availability (baseline): 0.6353 < 0.999; 31 failed of 85: fails at 2 or more failed "
        "of 85 (false alarm 0.34 % at the SLO, bound 5 %); catches a 2 % defect only 51 % of "
        "the time at n=85; 194 needed for 90 % (availability); timeout rate (baseline)"
    ), v.reasons
    # by hand: r2's hung attempts sent at 0.2, 0.5 ... 9.8 s all wait at the injection; those
    # sent before 9.5 s wait longer than the allowance (its floor: the baseline's TTFT tail is
    # 10 ms) and stay in the baseline; those sent at 9.5 and 9.8 s go to the fault with the
    # streams in flight on r0 (7, cut) and r1 (6, fine)
    on_wire = on_wire_at_injection(records)
    overdue = [r for r in on_wire if r["request_id"] in hung and r["sent_at"] < T0 + 9.5]
    assert (len(on_wire), len(overdue)) == (46, 31)
    crossed = v.windows["fault"]["crossed_injection"]
    assert crossed["allowance_s"] == ALLOWANCE_FLOOR_S
    assert (crossed["attempts"], crossed["to_baseline"], crossed["to_fault"]) == (46, 31, 15)
    assert len(cut) == 7
    # the baseline: its 100 requests but the 15 the fault took; 31 of them hung (54 / 85 ok)
    assert v.windows["baseline"]["requests"] == 85


def test_the_allowance_follows_the_baselines_own_ttft_tail() -> None:
    records = steady(T0, T0 + 20)
    for r in records:  # a slow model: every first token after 1 s
        r.update(first_token_at=r["sent_at"] + 1.0, end_at=r["sent_at"] + 1.5)
    allowance, p99 = ttft_allowance(records, T0 + 10, 10.0)
    assert p99 == pytest.approx(1.0, rel=1e-3) and allowance == pytest.approx(2.0, rel=1e-3)
    assert ttft_allowance([], T0 + 10, 10.0) == (ALLOWANCE_FLOOR_S, None)
    assert ttft_allowance(records, T0 + 10, 1.5)[0] == 1.5  # never past the judging deadline
    windows = {"drill": (T0, T0 + 30), "baseline": (T0, T0 + 10), "fault": (T0 + 10, T0 + 20)}
    waiting = [
        attempt("queued", T0 + 8.5, ok=False, e2e=3.0, first_token=None),  # 1.5 s <= 2 s
        attempt("stuck", T0 + 7.0, ok=False, e2e=5.0, first_token=None),  # 3 s > 2 s
        attempt("backoff", T0 + 9.0, ok=False, e2e=0.5, final=False, first_token=None),
        attempt("backoff", T0 + 10.2, n=2),
    ]
    got = assign(waiting, windows, T0 + 10, allowance)
    assert {r["request_id"] for r in got.windows["fault"]} == {"queued", "backoff"}
    assert {r["request_id"] for r in got.windows["baseline"]} == {"stuck"}
    assert len(got.windows["fault"]) == 3  # the request with both its attempts
    assert got.crossed["to_fault"] == 1 and got.crossed["to_baseline"] == 1
    assert got.crossed["between_attempts"] == 1
