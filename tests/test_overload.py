"""Overload is the service's failure (issue 20, items 1, 2 and their tests of item 7).

Unit level, on synthetic records (unix seconds) and the judge:

- an overload without scale-out (the service hangs, the in-flight cap fills, due requests are
  recorded ``not_sent``) is FAILED, naming the timeouts and the requests not sent; the spike's
  ground truth counts those as due, in agreement with the load's own summary;
- a client pinned short of CPU (its own lag from the kernel's receive stamp to its handling, its
  run-queue wait) is INCONCLUSIVE, naming the client and its CPU; the requests it did not send are
  then not counted against the service;
- failed outranks inconclusive when the evidence does not depend on the client (timeouts with a
  lagging client): the client's reason is listed beside;
- a service that answers nothing during the load's warm-up is FAILED before the fault (exit 1);
  a target that refuses every connection is the tool's error;
- latency is timed from the intended send, with the actual send beside it.

The end-to-end check (a sim engine hanging from its first request, ``drill run`` exits 1) is in
``test_cli_input_errors.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import InterruptExecution

from chaoslib_infer.controls import load as load_control
from chaoslib_infer.drills.traffic_spike import figures as spike_figures
from chaoslib_infer.load.client import write_inflight
from chaoslib_infer.load.clientside import client_cpu, client_figures, read_run_summary
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.inflight import not_sent_record
from chaoslib_infer.load.records import RecordWriter
from chaoslib_infer.measure.figkit import DrillContext
from chaoslib_infer.measure.metrics import window_stats
from chaoslib_infer.verdict import DrillFacts, exit_code, judge_drill, timeline
from chaoslib_infer.verdict.policy import VerdictPolicy

T0 = 1_800_000_000.0
CAP = 64
OOM_GROUND = {
    "fault_at": T0 + 20,
    "replica": "r0",
    "oom_kills": 1,
    "death_cause": "oom",
    "replica_serving_again_at": T0 + 22,
}
OOM_FIG = {
    "restart_s": 2.0,
    "warmup_ratio": 3.0,
    "interruption_s": 0.0,
    "interruption_sustained": 1,
}
#: the spike: 20 s of baseline at 10 req/s, 15 s at 36 req/s, 15 s back at 10 req/s
SPIKE_AT, SPIKE_END, END = T0 + 20, T0 + 35, T0 + 50


def rec(sent: float, ok: bool = True, e2e: float = 0.3, lag: float = 0.0005) -> dict[str, Any]:
    """A kernel-timed record sent on schedule; ``lag``: the client's own read lag."""
    chunks = [sent + 0.05, sent + e2e] if ok else []
    return {
        "request_id": f"q{sent:.4f}",
        "attempt": 1,
        "final": True,
        "intended_at": sent,
        "sent_at": sent,
        "end_at": sent + e2e,
        "first_token_at": chunks[0] if ok else None,
        "first_byte_at": chunks[0] if ok else None,
        "chunk_times": chunks,
        "chunk_times_loop": [t + lag for t in chunks],
        "time_source": "kernel",
        "ok": ok,
        "error_class": None if ok else "timeout_ttft",
        "error": None if ok else "no output within 10.0 s",
        "status": 200 if ok else None,
        "replica": "r1" if ok else None,
        "output_tokens": 2 if ok else 0,
    }


def overload(lag: float = 0.0005, hang_every: int = 3) -> list[dict[str, Any]]:
    """Baseline, then a spike the service does not carry: after its first 2 s the replicas hang
    (every ``hang_every``-th request sent times out at 10 s) and the cap is full for the rest
    (``not_sent``, 64 in flight); then the service is back."""
    out = [rec(T0 + i / 10, lag=lag) for i in range(200)]
    for i in range(15 * 36):
        t = SPIKE_AT + i / 36
        if t < SPIKE_AT + 2:
            out.append(rec(t, lag=lag))
        elif i % hang_every == 0:
            out.append(rec(t, ok=False, e2e=10.0, lag=lag))
        else:
            out.append(not_sent_record(f"n{i}", t, t + 0.0002, CAP, CAP))
    out += [rec(SPIKE_END + i / 10, lag=lag) for i in range(150)]
    return out


def spike_facts(records: list[dict[str, Any]], **kw: Any) -> DrillFacts:
    due = [r for r in records if SPIKE_AT <= r["intended_at"] < SPIKE_END]
    figures = {
        "requests_during_spike": len(due),
        "not_sent_during_spike": sum(1 for r in due if r.get("not_sent")),
        "phase_rates": [
            {"phase": 0, "planned_rps": 10.0, "duration_s": 20.0, "scheduled": 200},
            {"phase": 1, "planned_rps": 36.0, "duration_s": 15.0, "scheduled": 540},
            {"phase": 2, "planned_rps": 10.0, "duration_s": 15.0, "scheduled": 150},
        ],
        "recovery_s": 4.0,
        "scale_out_s": None,
    }
    ground = {"fault_at": SPIKE_AT, "spike_end_at": SPIKE_END}
    kw.setdefault("policy", VerdictPolicy("strict"))  # the SLO rows judged as today's tests pin
    return DrillFacts("traffic-spike", records, figures, ground, **kw)


def rows_of(v: Any) -> dict[str, dict[str, Any]]:
    return {r["criterion"]: r for r in v.rows}


def test_overload_without_scale_out_fails_naming_timeouts_and_requests_not_sent() -> None:
    records = overload()
    not_sent = sum(1 for r in records if r.get("not_sent"))
    timeouts = sum(1 for r in records if r["error_class"] == "timeout_ttft")
    assert (not_sent, timeouts) == (312, 156)
    v = judge_drill(spike_facts(records))
    assert v.state == "failed", v.reasons
    assert exit_code([v.state]) == 1
    rows = rows_of(v)
    assert rows["not_sent"]["value"] == not_sent and rows["not_sent"]["result"] == "fail"
    assert rows["timeouts_fault"]["value"] == timeouts
    assert (
        "timeouts during the spike (shed must be 429/503): 156 > 0; failed: 156 timeout_ttft "
        "(timeouts_fault)"
    ) in v.reasons
    assert "requests not sent (the in-flight cap was full): 312 > 0 (not_sent)" in v.reasons
    # the client kept up: nothing inconclusive, and the spike counts what was due, sent or not
    assert rows["client_lag_p99_s"]["result"] == "pass"
    assert rows["send_lag_p99_s"]["result"] == "pass"
    assert not any(r.startswith("also inconclusive") for r in v.reasons)
    assert v.notes[0] == (
        "fault: 540 requests due during the spike of 540 planned: 228 sent, 312 not sent "
        "(in-flight cap full)"
    )


def test_the_spike_counts_requests_not_sent_as_due_in_agreement_with_the_load_log(
    tmp_path: Path,
) -> None:
    """The issue's "108 sent of 1080 planned": requests the full cap kept back were planned and
    due; the figure, the ground truth's reason and the load's own summary agree."""
    records = overload()
    phases = [
        {"index": k, "rate_rps": r, "duration_s": d, "start_at": a, "end_at": a + d}
        for k, (d, r, a) in enumerate([(20, 10, T0), (15, 36, SPIKE_AT), (15, 10, SPIKE_END)])
    ]
    in_spike = [r for r in records if SPIKE_AT <= r["intended_at"] < SPIKE_END]
    ns = sum(1 for r in in_spike if r.get("not_sent"))
    phases[1].update(scheduled=540, sent=len(in_spike) - ns, not_sent=ns)
    summary = {"run_id": "ab12", "phases": phases, "stopped": False, "max_concurrency": CAP}
    summary.update(max_in_flight=CAP, cap_fill=1.0, client_cpu_share=0.05)
    (tmp_path / "load.log").write_text("load t=5s sent=50\n" + json.dumps(summary) + "\n")
    fault = {"kind": "traffic-spike", "fault_at": SPIKE_AT, "spike_end_at": SPIKE_END}
    ctx = DrillContext(tmp_path, records, [{**fault, "spike_phase": 1}], [], [])
    fig, ground = spike_figures.compute(ctx)
    assert fig["requests_during_spike"] == 540 == phases[1]["sent"] + phases[1]["not_sent"]
    assert fig["not_sent_during_spike"] == 312
    assert fig["phase_rates"][1]["scheduled"] == 540 and fig["phase_rates"][1]["not_sent"] == 312
    tl = timeline("traffic-spike", ground, fig)
    assert tl.confirmed is True and "228 sent, 312 not sent" in tl.why
    # the load's cap and its fill reach the evidence
    assert client_figures(read_run_summary(tmp_path / "load.log")) == {
        "load_cap": CAP,
        "load_max_in_flight": CAP,
        "load_cap_fill": 1.0,
        "client_cpu_share": 0.05,
    }
    # a client that truly fell short of the plan still reads as it did
    short = {**fig, "requests_during_spike": 108, "not_sent_during_spike": 0}
    tl = timeline("traffic-spike", ground, short)
    assert tl.confirmed is False
    assert tl.why == "the spike did not reach its rate (108 due of 540 planned)"


def test_a_client_short_of_cpu_is_inconclusive_naming_the_client_and_its_cpu() -> None:
    """The client read what the service sent 0.3 s late and waited for a CPU most of the run: its
    own cap filled (``not_sent``) but that is not the service's failure; the drill cannot say."""
    records = overload(lag=0.3, hang_every=10**9)  # the service hangs nothing
    client = {"client_cpu_share": 0.2, "client_runq_wait_share": 0.75}
    v = judge_drill(spike_facts(records, client=client))
    assert v.state == "inconclusive", v.reasons
    assert exit_code([v.state]) == 3
    assert v.reasons == [
        "the client fell behind its schedule (it read late): client lag P99 (kernel receive to "
        "handling): 0.3 s > 0.1 s (client_lag_p99_s); its CPU: busy 20% of one core, waiting "
        "for a CPU 75% of the run; latencies are suspect"
    ]
    rows = rows_of(v)
    assert rows["not_sent"]["result"] == "n/a" and rows["not_sent"]["value"] == 468
    assert rows["not_sent"]["note"] == (
        "the client itself fell behind (its lag P99 0.3 s): 468 requests not sent, not counted "
        "against the service"
    )
    assert rows["timeout_rate_fault"]["result"] == "pass"  # judged without the client's own
    # a client late to send (the scheduler's own lag) says so
    late = overload(hang_every=10**9)
    for r in late:
        r["intended_at"] = r["sent_at"] - 2.0
    v = judge_drill(spike_facts(late))
    assert v.state == "inconclusive"
    assert v.reasons[0].startswith("the client fell behind its schedule (it sent late): ")


def test_a_client_starved_far_past_its_timeouts_gives_up_on_its_own_lag_inconclusive() -> None:
    """Measured with the load in a cgroup of 2 % of a core against a healthy server (150 req/s):
    read lag P99 4.5 s, send lag P99 6.3 s, 98 % of the run waiting for a CPU, and 86 % of the
    attempts timed out on the client's own clock. Those timeouts are not the service's: left out
    (counted in the rows' notes); what the service answered (all 200) passes; inconclusive."""
    records = [rec(T0 + i / 10, lag=4.5) for i in range(500)]
    for r in records[::3]:  # the client gave up on a third of the replies already sent
        r.update(ok=False, error_class="timeout_ttft", status=200, chunk_times=[])
        r.update(chunk_times_loop=[], first_token_at=None)
    client = {"client_cpu_share": 0.02, "client_runq_wait_share": 0.98}
    ground = {**OOM_GROUND}
    for i, r in enumerate(records):  # r0 served before its OOM kill; r1 alone after it
        if r["ok"] and r["sent_at"] < ground["fault_at"]:
            r["replica"] = ("r0", "r1")[i % 2]
    strict = VerdictPolicy("strict")  # the zero-loss rule: a 5xx fails the drill below
    v = judge_drill(DrillFacts("oom-kill", records, OOM_FIG, ground, client=client, policy=strict))
    assert v.state == "inconclusive", v.reasons
    assert len(v.reasons) == 1
    assert v.reasons[0].startswith(
        "the client fell behind its schedule (it read late): client lag P99 (kernel receive to "
        "handling): 4.5 s > 0.1 s (client_lag_p99_s); its CPU: busy 2% of one core, waiting "
        "for a CPU 98% of the run"
    )
    rows = rows_of(v)
    for name in ("timeout_rate", "timeout_rate_fault"):
        assert rows[name]["result"] == "n/a" and rows[name]["value"] is None
        assert rows[name]["note"] == (
            "the client itself fell behind (its lag P99 4.5 s): 167 timed-out attempts left "
            "out (it may have given up on replies already sent)"
        )
    assert rows["availability"]["value"] == 1.0  # what the service answered
    # a 5xx the service sent is its own, whatever the client's lag: failed, the client beside
    for r in records[202:262:3]:  # 20 in the fault window (none of them a timeout)
        r.update(ok=False, error_class="http_5xx", status=503)
    v = judge_drill(DrillFacts("oom-kill", records, OOM_FIG, ground, client=client, policy=strict))
    assert v.state == "failed"
    assert v.reasons[0] == (  # 313/333
        "availability (whole drill): 0.9399 < 0.999; failed: 20 http_5xx (503) (availability)"
    )
    assert v.reasons[-1].startswith("also inconclusive: the client fell behind its schedule")


def test_timeouts_fail_the_drill_even_with_a_lagging_client_listed_beside() -> None:
    """A client 0.3 s late on its reads cannot turn a 10 s wait into a timeout: the timeouts of
    a hung spike stay the service's."""
    records = overload(lag=0.3)
    v = judge_drill(spike_facts(records, client={"client_cpu_share": 0.99}))
    assert v.state == "failed", v.reasons
    assert (
        "timeouts during the spike (shed must be 429/503): 156 > 0; failed: 156 timeout_ttft "
        "(timeouts_fault)"
    ) in v.reasons
    assert not any("(not_sent)" in r for r in v.reasons)  # the client's, not the service's
    client = [
        r
        for r in v.reasons
        if r.startswith("also inconclusive: the client fell behind its schedule (it read late): ")
    ]
    assert len(client) == 1 and "busy 99% of one core" in client[0], v.reasons
    # a latency failure alone depends on the client's schedule: inconclusive, not failed
    slow = [rec(T0 + i / 10, e2e=12.0 if i % 5 == 0 else 0.3, lag=0.3) for i in range(500)]
    v = judge_drill(spike_facts(slow))
    assert v.state == "inconclusive"
    assert rows_of(v)["p99_e2e_s"]["result"] == "fail"


def test_a_service_that_answers_nothing_during_the_warm_up_fails_before_the_fault() -> None:
    """Every request hung from the first: the load stopped them (``cut_off``, past the deadline:
    timeouts); the method never ran (the hypothesis before deviated)."""
    from chaoslib_infer.load.client import cut_off_record

    records = [cut_off_record(f"h{i}", 1, T0 + i / 8, T0 + i / 8, T0 + 30) for i in range(160)]
    line = "nothing answered in 18 s: 144 requests sent, 144 still in flight"
    hyp = [("before", "slo-availability: availability = 0.0 (>= 0.999 required, 80 requests)")]
    v = judge_drill(
        DrillFacts("upstream-timeout", records, {}, {}, warmup=line, hypothesis_failures=hyp)
    )
    assert v.state == "failed" and exit_code([v.state]) == 1
    assert v.reasons[0] == f"the service did not meet its SLOs before the fault ({line})"
    assert v.reasons[1] == (
        "the service did not meet its SLOs before the fault (not blamed on the fault): " + hyp[0][1]
    )
    # no record at all (every request still in flight when judged): still the service's failure
    v = judge_drill(DrillFacts("upstream-timeout", [], {}, {}, warmup=line))
    assert (v.state, v.reasons) == (
        "failed",
        [f"the service did not meet its SLOs before the fault ({line})"],
    )


def _records_file(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        for r in records:
            w.write(r)
    return path


def test_warmup_finding_tells_the_tool_from_the_service(tmp_path: Path) -> None:
    path = _records_file(tmp_path, [])
    assert load_control.warmup_finding(path, 8.2) == (
        True,
        "the load sent nothing in 8 s (see load.log)",
    )
    refused = [{**rec(T0 + i, ok=False), "error_class": "connect"} for i in range(5)]
    tool, line = load_control.warmup_finding(_records_file(tmp_path, refused), 8.0)
    assert (
        tool
        and line
        == "every attempt failed to connect (nothing answered in 8 s: 5 requests sent, 5 connect)"
    )
    # hung: nothing ended yet, everything on the wire
    _records_file(tmp_path, [])
    on_wire = {(f"h{i}", 1): (T0 + i, T0 + i) for i in range(7)}
    write_inflight(tmp_path / "inflight.json", on_wire)
    assert load_control.warmup_finding(path, 18.4) == (
        False,
        "nothing answered in 18 s: 7 requests sent, 7 still in flight",
    )
    # answered, but with 5xx
    (tmp_path / "inflight.json").unlink()
    failed = [{**rec(T0 + i, ok=False), "error_class": "http_5xx", "status": 500} for i in range(4)]
    assert load_control.warmup_finding(_records_file(tmp_path, failed), 2.0) == (
        False,
        "nothing succeeded in 2 s: 4 requests sent, 4 http_5xx",
    )


def test_start_load_runs_on_for_a_hung_service_and_stops_for_an_unreachable_one(
    tmp_path: Path,
) -> None:
    with FakeServer(replica="hung") as srv:
        conf = {"infer_base_url": srv.url + "/delay=600", "infer_run_dir": str(tmp_path / "h")}
        try:
            out = load_control.start_load(
                rate_rps=10.0, warmup_s=3.0, max_duration_s=20, baseline_requests=0,
                configuration=conf,
            )  # fmt: skip
        finally:
            load_control.stop_load(conf, grace_s=5)
    assert out["warmup"].startswith("nothing answered in 3 s: ")
    assert "still in flight" in out["warmup"]
    doc = json.loads((tmp_path / "h" / "warmup.json").read_text())
    assert doc["finding"] == out["warmup"] and doc["warmup_s"] == 3.0
    assert not (tmp_path / "h" / load_control.LOAD_ERROR_FILE).exists()
    conf = {"infer_base_url": "http://127.0.0.1:1", "infer_run_dir": str(tmp_path / "d")}
    with pytest.raises(InterruptExecution, match="every attempt failed to connect"):
        load_control.start_load(
            rate_rps=10.0, warmup_s=3.0, max_duration_s=20, baseline_requests=0,
            configuration=conf,
        )  # fmt: skip
    assert not (tmp_path / "d" / "warmup.json").exists()


def test_latency_is_timed_from_the_intended_send_with_the_actual_send_beside() -> None:
    """Coordinated omission corrected: a request sent 0.5 s late by the client waited 0.5 s more
    than its service time; the not-sent one counts against availability."""
    late = rec(T0, e2e=1.0)
    late["intended_at"] = T0 - 0.5
    recs = [late, rec(T0 + 1, e2e=1.0), not_sent_record("n", T0 + 2, T0 + 2, 4, 4)]
    s = window_stats(recs)
    assert s["p99_e2e_s"] == pytest.approx(1.5, rel=1e-3)
    assert s["p99_e2e_from_send_s"] == pytest.approx(1.0, rel=1e-3)
    assert s["p99_ttft_s"] == pytest.approx(0.55, rel=1e-3)
    assert s["p99_ttft_from_send_s"] == pytest.approx(0.05, rel=1e-3)
    assert (s["requests"], s["ok"], s["not_sent"]) == (3, 2, 1)
    assert s["availability"] == pytest.approx(2 / 3)
    assert s["errors_by_class"]["not_sent"]["count"] == 1


def test_client_cpu_share_and_run_queue_wait() -> None:
    got = client_cpu((1.0, 2.0), (3.0, 5.0), 4.0)
    assert got == {
        "client_cpu_s": 2.0,
        "client_cpu_share": 0.5,
        "client_runq_wait_s": 3.0,
        "client_runq_wait_share": 0.75,
    }
    assert client_cpu((1.0, None), (3.0, None), 4.0)["client_runq_wait_share"] is None
