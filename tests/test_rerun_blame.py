"""Re-runs the fault caused against duplicates the client caused, and the blame of each failed
row (``docs/definitions.md``, "Re-runs and duplicates", "Blame"): pure functions over synthetic
records, fault lines, ledgers and lab events (unix seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.figures import common_figures
from chaoslib_infer.lab.gateways import nginx
from chaoslib_infer.lab.gateways.figures import gateway_figures
from chaoslib_infer.measure.faultcut import fault_cut, taken_pods, taken_replicas
from chaoslib_infer.measure.figures import duplicates
from chaoslib_infer.measure.rerun import (
    fault_cut_lost,
    frozen_completed,
    rerun_figures,
    rerun_split,
)
from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.blame import blame_of
from chaoslib_infer.verdict.state import reason

FAULT_AT = 100.0


def _rec(rid: str, attempt: int, replica: str | None, sent: float, end: float, **kw: Any) -> dict:
    ok = kw.pop("ok", False)
    return {
        "request_id": rid,
        "attempt": attempt,
        "replica": replica,
        "sent_at": sent,
        "end_at": end,
        "ok": ok,
        "status": 200,
        **kw,
    }


def _gen(rid: str, replica: str, t: float, pid: int) -> dict:
    return {"t": t, "event": "generation", "replica": replica, "request_id": rid, "pid": pid}


def _end(rid: str, replica: str, t: float, pid: int, outcome: str = "done", ct: int = 20) -> dict:
    return {
        "t": t,
        "event": "generation_end",
        "replica": replica,
        "request_id": rid,
        "pid": pid,
        "prompt_tokens": 30,
        "completion_tokens": ct,
        "outcome": outcome,
    }


KILL = [{"kind": "oom-kill", "replica": "r0", "fault_at": FAULT_AT}]
DEATH = [{"t": FAULT_AT, "event": "exit", "replica": "r0", "pid": 10, "cause": "oom"}]


def _killed_and_retried() -> tuple[list[dict], list[dict]]:
    """Request a: in flight on r0 when the kernel killed it (no end line), retried on r1."""
    records = [
        _rec("a", 1, "r0", 99.5, 100.01, error_class="reset"),
        _rec("a", 2, "r1", 100.02, 100.5, ok=True, error_class=None),
        _rec("b", 1, "r1", 99.0, 99.4, ok=True, error_class=None),
    ]
    ledger = [
        _gen("a", "r0", 99.51, 10),
        _gen("a", "r1", 100.03, 11),
        _end("a", "r1", 100.5, 11),
        _gen("b", "r1", 99.01, 11),
        _end("b", "r1", 99.4, 11),
    ]
    return records, ledger


def test_a_killed_replicas_cut_stream_retried_is_a_rerun_not_a_duplicate() -> None:
    records, ledger = _killed_and_retried()
    cuts = fault_cut(records, taken_replicas(KILL), ledger, DEATH)
    assert [(c.request_id, c.attempt, c.replica, c.pid) for c in cuts] == [("a", 1, "r0", 10)]
    assert cuts[0].spent_tokens is None  # the killed process wrote no end line
    fig = rerun_split(records, ledger, cuts)
    assert fig["rerun_generations"] == 1 and fig["rerun_requests"] == 1
    assert fig["fault_cut_generations"] == 1 and fig["fault_cut_attempts"] == 1
    assert fig["fault_wasted_tokens"] is None  # unmeasured, never 0
    assert fig["fault_wasted_prompt_tokens"] == 30  # the re-run prefilled the same prompt
    assert fig["duplicate_generations"] == 0 and fig["extra_generations"] == 0
    assert fig["wasted_tokens"] == 0
    assert fault_cut_lost(records, cuts) == 0  # retried and served
    assert fault_cut_lost(records[:1], cuts) == 1  # never retried: lost to the cut
    assert duplicates(records, ledger) == 1  # every generation counted: the re-run among them
    assert rerun_split(records, ledger, cuts)["duplicate_generations"] == 0
    assert rerun_figures(records, ledger, KILL, DEATH)["duplicates"] == 0


def test_the_common_figures_count_duplicates_once_with_the_faults_reruns_left_out() -> None:
    """The evidence's duplicate figures are the re-run split's (measure/rerun.py), counted once
    for every drill: the re-run of the stream the kill cut is the fault's, the client's third
    send of a request still generating is its duplicate, and the verdict's rows read so."""
    records, ledger = _killed_and_retried()
    records.append(_rec("a", 3, "r2", 100.2, 100.6, ok=True, error_class=None))
    ledger += [_gen("a", "r2", 100.21, 12), _end("a", "r2", 100.6, 12, ct=10)]
    fig = common_figures(records, ledger, KILL, DEATH)
    assert (fig["rerun_generations"], fig["duplicates"], fig["duplicate_generations"]) == (1, 1, 1)
    assert (fig["extra_generations"], fig["wasted_tokens"]) == (1, 40)  # the re-run not among them
    assert fig["retries"] == 2 and fig["generations_per_attempt"] == 1.0
    ground = {"fault_at": FAULT_AT, "replica": "r0", "oom_kills": 1}
    v = judge_drill(DrillFacts("oom-kill", records, fig, ground, lab_events=DEATH))
    rows = {r["criterion"]: r for r in v.rows}
    assert (rows["extra_generations"]["result"], rows["duplicate_generations"]["result"]) == (
        "fail",
        "fail",
    )
    assert reason(rows["extra_generations"]) == (  # the client sent a again while its second
        # attempt was still open: a hedge, the mechanism its records show
        "generations paid twice (extra): 1 > 0 (extra_generations); BLAME: client (1 requests: "
        "it sent them again while its earlier attempt was still open: hedge only before the "
        "first token, and cancel the attempt it drops)"
    )
    assert rows["duplicate_generations"]["note"] == (
        "1 re-runs of generations the fault aborted are the fault's cost, not counted "
        "(rerun_generations)"
    )
    # without the client's third send: the re-run alone costs the client nothing
    records, ledger = _killed_and_retried()
    fig = common_figures(records, ledger, KILL, DEATH)
    v = judge_drill(DrillFacts("oom-kill", records, fig, ground, lab_events=DEATH))
    rows = {r["criterion"]: r for r in v.rows}
    assert (rows["duplicate_generations"]["result"], rows["duplicate_generations"]["value"]) == (
        "pass",
        0.0,
    )
    assert (rows["extra_generations"]["result"], rows["wasted_tokens"]["result"]) == (
        "pass",
        "pass",
    )


def test_a_rerun_and_a_client_duplicate_of_one_request_are_told_apart() -> None:
    records, ledger = _killed_and_retried()
    # the client also sent a a third time while its second attempt was still generating
    records.append(_rec("a", 3, "r2", 100.2, 100.6, ok=True, error_class=None))
    ledger += [_gen("a", "r2", 100.21, 12), _end("a", "r2", 100.6, 12, ct=10)]
    fig = rerun_figures(records, ledger, KILL, DEATH)
    assert fig["rerun_generations"] == 1
    assert fig["duplicate_generations"] == 1 and fig["extra_generations"] == 1
    assert fig["wasted_tokens"] == 40  # the smaller of the two finished generations: 30 + 10


def test_a_slowed_replicas_stream_retried_while_it_finished_is_a_duplicate() -> None:
    """network-jitter: the replica is slowed, not taken; the client gave up after 1 s and the
    engine finished the generation anyway (or found the client gone: cancelled)."""
    jitter = [{"kind": "network-jitter", "replica": "r0", "fault_at": FAULT_AT}]
    records = [
        _rec("a", 1, "r0", 100.5, 101.5, error_class="timeout_attempt", status=200),
        _rec("a", 2, "r1", 101.5, 102.0, ok=True, error_class=None),
        _rec("c", 1, "r0", 99.8, 101.0, error_class="timeout_idle", status=200),
        _rec("c", 2, "r1", 101.0, 101.4, ok=True, error_class=None),
    ]
    ledger = [
        _gen("a", "r0", 100.5, 10),
        _end("a", "r0", 103.0, 10),
        _gen("a", "r1", 101.5, 11),
        _end("a", "r1", 102.0, 11),
        _gen("c", "r0", 99.8, 10),
        _end("c", "r0", 101.2, 10, outcome="cancelled", ct=5),
        _gen("c", "r1", 101.0, 11),
        _end("c", "r1", 101.4, 11),
    ]
    assert fault_cut(records, taken_replicas(jitter), ledger) == []
    # even if the slowed replica were named as taken, its generations ended in a live process
    assert fault_cut(records, {"r0": FAULT_AT}, ledger) == []
    fig = rerun_figures(records, ledger, jitter)
    assert fig["rerun_generations"] == 0 and fig["fault_cut_generations"] == 0
    assert fig["duplicate_generations"] == 2 and fig["extra_generations"] == 2
    assert fig["wasted_tokens"] == 35 + 50  # c: 30 + 5 (cancelled); a: 30 + 20 (both done)


FREEZE = [
    {
        "kind": "upstream-timeout",
        "replica": "r0",
        "fault_at": FAULT_AT,
        "hold_s": 15.0,
        "phase": "injected",
    },
    {"kind": "upstream-timeout", "replica": "r0", "phase": "held", "held_until": 110.0},
]


def _frozen_and_retried() -> tuple[list[dict], list[dict]]:
    """a: streaming on r0 when it froze (4 tokens received), the client's idle timeout gave up
    and it re-ran on r1; the thawed engine found the client gone at its first step (cancelled
    10 ms after the thaw). q: sent to the frozen r0 (no first byte), re-run on r2; queued in
    the frozen socket, r0 started it at the thaw and cancelled it at once."""
    records = [
        _rec("a", 1, "r0", 99.9, 102.0, error_class="timeout_idle", output_tokens=4),
        _rec("a", 2, "r1", 102.1, 102.5, ok=True, error_class=None),
        _rec("q", 1, None, 101.0, 104.0, error_class="timeout_ttft", status=None),
        _rec("q", 2, "r2", 104.1, 104.5, ok=True, error_class=None),
    ]
    ledger = [
        _gen("a", "r0", 99.95, 10),
        _gen("a", "r1", 102.1, 11),
        _end("a", "r1", 102.5, 11),
        _end("a", "r0", 110.01, 10, outcome="cancelled", ct=5),  # one token after the thaw
        _gen("q", "r2", 104.1, 12),
        _end("q", "r2", 104.5, 12),
        _gen("q", "r0", 110.005, 10),  # queued in the frozen socket: generated at the thaw
        _end("q", "r0", 110.02, 10, outcome="cancelled", ct=0),
    ]
    return records, ledger


def test_a_stream_the_freeze_cut_and_the_client_reran_is_a_rerun_not_a_duplicate() -> None:
    """Issue 30 item 1: the well-run reference's two upstream-timeout "duplicates" were streams
    in flight on the frozen replica, retried by the client's idle timeout and ended
    ``cancelled`` by the thawed engine at its first step: the fault's re-runs."""
    records, ledger = _frozen_and_retried()
    fig = rerun_figures(records, ledger, FREEZE)
    assert (fig["rerun_generations"], fig["rerun_requests"]) == (2, 2)
    assert fig["fault_cut_attempts"] == 2 and fig["fault_cut_lost"] == 0
    assert fig["fault_wasted_tokens"] == 35 + 30  # a: prompt + 5 tokens; q: its prompt
    assert (fig["duplicate_generations"], fig["extra_generations"]) == (0, 0)
    assert fig["wasted_tokens"] == 0
    assert fig["frozen_completed"] == 0
    assert fig["duplicate_causes"] == {}


def test_the_thaw_is_the_labs_cleared_event_not_the_end_of_the_hold() -> None:
    """Measured on the well-run reference (issue 30): the action's hold ended at +15.1 s
    (``held_until``), the replica stayed frozen until the rollback thawed it (the lab's
    ``cleared`` event at +19.3 s); the engine started the request queued in its socket at
    +19.12 s, 160 ms before that event was stamped, and cancelled it at once (0 tokens): the
    freeze's cut, re-run by the client, not "the client gave up while the engine went on"."""
    faults = [
        {"kind": "upstream-timeout", "replica": "r0", "fault_at": FAULT_AT, "hold_s": 15.0},
        {"kind": "upstream-timeout", "replica": "r0", "phase": "held", "held_until": 115.1},
    ]
    events = [
        {
            "t": 119.28,
            "event": "fault",
            "kind": "upstream-timeout",
            "replica": "r0",
            "phase": "cleared",
        }
    ]
    records = [
        _rec("f", 1, None, 102.1, 105.1, error_class="timeout_ttft", status=None),
        _rec("f", 2, "r1", 105.3, 105.8, ok=True, error_class=None),
    ]
    ledger = [
        _gen("f", "r1", 105.35, 11),
        _end("f", "r1", 105.8, 11),
        _gen("f", "r0", 119.117, 10),
        _end("f", "r0", 119.122, 10, outcome="cancelled", ct=0),
    ]
    fig = rerun_figures(records, ledger, faults, events)
    assert (fig["rerun_generations"], fig["duplicate_generations"]) == (1, 0)
    assert fig["frozen_completed"] == 0 and fig["generations_after_client_left"] == 1
    # read with the hold's end as the thaw (no lab event), the same lines were a duplicate
    assert rerun_figures(records, ledger, faults)["duplicate_causes"] == {"client_gave_up": 1}


def test_a_frozen_generation_that_went_on_after_the_thaw_is_a_duplicate() -> None:
    """The thawed engine went on producing tokens nobody got: ``done`` at the thaw, or
    ``cancelled`` seconds later: duplicates (``frozen_completed``), whose waste is the tokens
    made after the thaw, not the prompt and the tokens made before the freeze."""
    records, ledger = _frozen_and_retried()
    ledger[3] = _end("a", "r0", 110.3, 10, outcome="done", ct=20)  # 16 tokens after the thaw
    ledger[7] = _end("q", "r0", 112.0, 10, outcome="cancelled", ct=9)  # 2 s of tokens
    fig = rerun_figures(records, ledger, FREEZE)
    assert (fig["rerun_generations"], fig["fault_cut_attempts"]) == (0, 0)
    assert (fig["duplicate_generations"], fig["frozen_completed"]) == (2, 2)
    assert fig["wasted_tokens"] == 16 + 9  # post-thaw tokens only
    assert fig["duplicate_causes"] == {"frozen_resumed": 2}
    assert frozen_completed(records, ledger, FREEZE) == 2
    # the grace: a cancel 0.4 s after the thaw is still the engine's first look at the client
    ledger[7] = _end("q", "r0", 110.4, 10, outcome="cancelled", ct=1)
    fig = rerun_figures(records, ledger, FREEZE)
    assert (fig["rerun_generations"], fig["frozen_completed"]) == (1, 1)
    assert frozen_completed(records, ledger, KILL) is None  # no replica frozen


def test_a_stream_the_engines_own_fault_reset_and_the_client_retried_is_a_rerun() -> None:
    """Issue 30: a replica resetting streams it generated (``reset_after_k``), retried by the
    client, is the engine fault's re-run; a ``stall`` the engine finished after the client
    gave up is a duplicate (the engine went on), one it cancelled on resuming a re-run."""
    records = [
        _rec("a", 1, "r0", 100.0, 100.2, error_class="reset"),
        _rec("a", 2, "r1", 100.21, 100.6, ok=True, error_class=None),
    ]
    fault = {"t": 100.001, "event": "fault", "mode": "reset_after_k", "replica": "r0"}
    ledger = [
        {**fault, "request_id": "a", "pid": 10},
        _gen("a", "r0", 100.002, 10),
        _end("a", "r0", 100.2, 10, ct=3),  # the engine's "done": its k tokens, then the reset
        _gen("a", "r1", 100.22, 11),
        _end("a", "r1", 100.6, 11),
    ]
    fig = rerun_figures(records, ledger, [])
    assert (fig["rerun_generations"], fig["duplicate_generations"]) == (1, 0)
    assert fig["fault_wasted_tokens"] == 33
    # without the engine's fault line the same two generations are a duplicate
    assert rerun_figures(records, ledger[1:], [])["duplicate_generations"] == 1
    stall = [{**ledger[0], "mode": "stall"}, *ledger[1:]]
    records[0]["error_class"] = "timeout_idle"
    assert rerun_figures(records, stall, [])["duplicate_generations"] == 1  # it finished: done
    stall[2] = _end("a", "r0", 103.0, 10, outcome="cancelled", ct=3)
    assert rerun_figures(records, stall, [])["rerun_generations"] == 1


def test_duplicate_causes_name_the_mechanism_each_request_shows() -> None:
    base = [
        _rec("g", 1, "r0", 100.0, 101.0, ok=True, error_class=None),  # one client attempt
        _rec("h", 1, "r0", 100.0, 101.0, ok=True, error_class=None),  # hedged: open at 100.5
        _rec("h", 2, "r1", 100.5, 100.9, ok=True, error_class=None),
        _rec("t", 1, "r0", 100.0, 101.0, error_class="timeout_total"),
        _rec("t", 2, "r1", 101.0, 101.4, ok=True, error_class=None),
        _rec("s", 1, "r0", 100.0, 100.5, error_class="truncated"),
        _rec("s", 2, "r1", 100.5, 100.9, ok=True, error_class=None),
    ]
    ledger = []
    for rid, (a, b) in {"g": (100.0, 100.4), "h": (100.0, 100.5), "t": (100.0, 101.0)}.items():
        ledger += [_gen(rid, "r0", a, 10), _end(rid, "r0", 102.0, 10)]
        ledger += [_gen(rid, "r1", b, 11), _end(rid, "r1", 102.0, 11)]
    ledger += [_gen("s", "r0", 100.0, 10), _end("s", "r0", 102.0, 10)]
    ledger += [_gen("s", "r1", 100.5, 11), _end("s", "r1", 100.9, 11)]
    fig = rerun_figures(base, ledger, [])
    assert fig["duplicate_causes"] == {
        "gateway_resent": 1,
        "client_hedged": 1,
        "client_gave_up": 1,
        "stream_failed": 1,
    }
    assert rerun_figures(base, [], [])["duplicate_causes"] is None  # no ledger: unmeasured


def test_no_ledger_is_unmeasured_never_zero() -> None:
    records, _ = _killed_and_retried()
    fig = rerun_figures(records, [], KILL, DEATH)
    for key in (
        "rerun_generations",
        "fault_cut_generations",
        "fault_wasted_tokens",
        "duplicate_generations",
        "extra_generations",
        "wasted_tokens",
        "duplicates",
    ):
        assert fig[key] is None, key
    assert fig["fault_cut_attempts"] is None  # nothing shows the generation was aborted
    assert fig["fault_cut_lost"] is None
    # a deleted pod (Kubernetes, no ledger): its process died, its stream is fault-cut
    pods = taken_pods([{"pod": "r0", "deleted_at": FAULT_AT}, {"pod": "x"}])
    assert pods == {"r0": FAULT_AT}
    cuts = fault_cut(records, pods, [], process_died=True)
    assert [(c.request_id, c.pid, c.generation_at) for c in cuts] == [("a", None, None)]
    assert rerun_split(records, [], cuts)["rerun_generations"] is None
    fig = rerun_figures(records, [], [], killed=pods)
    assert fig["fault_cut_attempts"] == 1 and fig["fault_cut_lost"] == 0  # retried, served
    assert fig["rerun_generations"] is None  # no ledger: the re-runs are not known


def test_what_is_not_fault_cut() -> None:
    records, ledger = _killed_and_retried()
    taken = taken_replicas(KILL)
    # sent after the fault: it never ran on the killed replica
    late = [_rec("d", 1, "r0", 100.2, 101.0, error_class="reset")]
    assert fault_cut(late, taken, ledger, DEATH) == []
    # a failure class the fault does not cause (a 5xx answer)
    wrong = [_rec("a", 1, "r0", 99.5, 100.01, error_class="http_5xx")]
    assert fault_cut(wrong, taken, ledger, DEATH) == []
    # a replica the fault did not take
    other = [_rec("a", 1, "r1", 99.5, 100.01, error_class="reset")]
    assert fault_cut(other, taken, ledger, DEATH) == []
    # the generation finished before the process died: not aborted
    done = [*ledger, _end("a", "r0", 99.99, 10)]
    assert fault_cut(records, taken, done, DEATH) == []
    # a cancelled end line in a process that then died (a graceful stop): aborted
    stopped = [*ledger, _end("a", "r0", 99.99, 10, outcome="cancelled", ct=7)]
    cuts = fault_cut(records, taken, stopped, DEATH)
    assert [c.spent_tokens for c in cuts] == [37]
    assert rerun_split(records, stopped, cuts)["fault_wasted_tokens"] == 37
    # faults that do not take a replica, and lines other than the injection
    assert taken_replicas([{"kind": "upstream-timeout", "replica": "r0", "fault_at": 1.0}]) == {}
    nodes = [
        {"kind": "node-loss", "replicas": ["r0", "r1"], "fault_at": 5.0},
        {"kind": "node-loss", "phase": "cleared", "replicas": ["r2"], "fault_at": 9.0},
    ]
    assert taken_replicas(nodes) == {"r0": 5.0, "r1": 5.0}


def test_a_dropped_nodes_silent_stream_without_replica_header_is_found_in_the_ledger() -> None:
    nodes = [{"kind": "node-loss", "replicas": ["r0"], "fault_at": FAULT_AT}]
    records = [
        _rec("a", 1, None, 99.9, 103.0, error_class="timeout_ttft", status=None),
        _rec("a", 2, "r1", 103.0, 103.5, ok=True, error_class=None),
    ]
    ledger = [_gen("a", "r0", 99.95, 10), _gen("a", "r1", 103.01, 11), _end("a", "r1", 103.5, 11)]
    death = [{"t": 100.02, "event": "exit", "replica": "r0", "pid": 10}]
    fig = rerun_figures(records, ledger, nodes, death)
    assert fig["rerun_generations"] == 1 and fig["duplicate_generations"] == 0


def test_a_generation_finished_into_a_dropped_nodes_cut_link_is_a_rerun_not_a_duplicate() -> None:
    """The engine wrote its last token and a ``done`` end line after its node's link was cut:
    the answer never crossed the link (the client's stream went silent and was retried). The
    fault aborted that generation for the client; only a ``done`` by the fault's time counts as
    finished (a re-send of that one would be a duplicate)."""
    nodes = [{"kind": "node-loss", "replicas": ["r0"], "fault_at": FAULT_AT}]
    records = [
        _rec("a", 1, "r0", 99.0, 102.0, error_class="timeout_idle"),
        _rec("a", 2, "r1", 102.0, 102.5, ok=True, error_class=None),
    ]
    ledger = [
        _gen("a", "r0", 99.01, 10),
        _end("a", "r0", 100.03, 10),  # finished 30 ms after the cut, before the kill
        _gen("a", "r1", 102.01, 11),
        _end("a", "r1", 102.5, 11),
    ]
    fig = rerun_figures(records, ledger, nodes)  # no exit event: the kill is not recorded
    assert (fig["rerun_generations"], fig["duplicate_generations"]) == (1, 0)
    assert (fig["fault_cut_generations"], fig["fault_wasted_tokens"]) == (1, 50)
    # the same line stamped before the cut: the engine had finished, the re-send is a duplicate
    ledger[1] = _end("a", "r0", 99.98, 10)
    fig = rerun_figures(records, ledger, nodes)
    assert (fig["rerun_generations"], fig["duplicate_generations"]) == (0, 1)


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_streams_cut_200_counts_the_gateways_cuts_not_the_faults(tmp_path: Path) -> None:
    lab, drill = tmp_path / "lab", tmp_path / "drill"
    lab.mkdir()
    drill.mkdir()
    (lab / "gateway.json").write_text(json.dumps({"gateway": "nginx"}))
    (lab / nginx.SERVERS_FILE).write_text(json.dumps({"127.0.0.1:1": "r0", "127.0.0.1:2": "r1"}))
    (lab / nginx.ACCESS_LOG).write_text("")
    records, ledger = _killed_and_retried()
    # e: cut by the gateway's own timeout on r1, which the fault did not take
    records.append(_rec("e", 1, "r1", 99.0, 101.0, error_class="truncated"))
    ledger += [_gen("e", "r1", 99.01, 11), _end("e", "r1", 101.0, 11, outcome="cancelled")]
    _jsonl(lab / "ledger.jsonl", ledger)
    _jsonl(lab / "events.jsonl", DEATH)
    _jsonl(drill / "records.jsonl", records)
    _jsonl(drill / "faults.jsonl", KILL)
    fig = gateway_figures(lab, drill)
    assert fig["streams_cut_200"] == 1  # e
    assert fig["streams_cut_by_fault"] == 1  # a's first attempt, on the killed r0
    _jsonl(drill / "faults.jsonl", [])  # no fault took a replica: both are the gateway's
    assert gateway_figures(lab, drill)["streams_cut_200"] == 2


def test_blame_names_who_caused_each_failure() -> None:
    # duplicates: the mechanism duplicate_causes found in each request's records and ledger
    gave_up = str(
        blame_of(
            "duplicate_generations", "network-jitter", {"duplicate_causes": {"client_gave_up": 3}}
        )
    )
    assert gave_up.startswith("client (3 requests: its attempt timeout gave up while the engine")
    assert gave_up.endswith(
        "an attempt timeout above the slowest generation, or idempotency keys the server deduplicates)"
    )
    resent = str(
        blame_of("wasted_tokens", "network-jitter", {"duplicate_causes": {"gateway_resent": 2}})
    )
    assert resent.startswith("gateway (2 requests: it re-sent a client attempt while the first")
    both = {"duplicate_causes": {"gateway_resent": 1, "client_gave_up": 1}}
    assert str(blame_of("extra_generations", "oom-kill", both)).startswith("client (1 requests")
    assert " and gateway (1 requests" in str(blame_of("extra_generations", "oom-kill", both))
    frozen = str(
        blame_of(
            "extra_generations", "upstream-timeout", {"duplicate_causes": {"frozen_resumed": 2}}
        )
    )
    assert frozen.startswith("engine (2 requests: the frozen replica went on generating them after")
    # no request shows a mechanism (no ledger evidence, or none that applies): no static text
    for none in (
        {"retries": 30},
        {"duplicate_causes": None},
        {"duplicate_causes": {"unexplained": 2}},
    ):
        assert blame_of("duplicate_generations", "network-jitter", none) is None, none
    # the gateway's rows name what it did, from their own figure
    assert str(blame_of("streams_cut_200", "oom-kill", {"streams_cut_200": 3})).startswith(
        "gateway (it cut 3 streams after their 200"
    )
    assert str(blame_of("routed_to_down", "node-loss", {"routed_to_down": 4})).startswith(
        "gateway (it sent 4 upstream tries to a replica that was down"
    )
    assert blame_of("streams_cut_200", "oom-kill", {}) is None
    cut = {"fault_cut_lost": 2}
    assert str(blame_of("availability", "oom-kill", cut, 2)).startswith("fault (2 requests")
    assert str(blame_of("availability", "oom-kill", cut, 5)).startswith("fault and service")
    # the service's failures carry no suffix: a reason without BLAME is the service's
    assert blame_of("availability", "oom-kill", {"fault_cut_lost": 0}, 2) is None
    assert blame_of("warmup_ratio", "oom-kill", {}) is None
    row = {
        "criterion": "duplicate_generations",
        "label": "duplicate generations",
        "value": 3.0,
        "op": "<=",
        "threshold": 0.0,
        "unit": "count",
        "blame": "client (x)",
    }
    assert reason(row) == "duplicate generations: 3 > 0 (duplicate_generations); BLAME: client (x)"
    assert "BLAME" not in reason({**row, "blame": None})


FROZEN_GROUND = {"fault_at": FAULT_AT, "replica": "r0", "thawed_at": 110.0}


def _hung(rid: str, sent: float, first: float | None, replica: str | None = "r0") -> dict:
    return _rec(
        rid,
        1,
        replica,
        sent,
        sent + 3.0,
        error_class="timeout_idle" if first else "timeout_ttft",
        first_byte_at=first,
    )


def test_hung_requests_blame_reads_each_requests_send_time_and_first_byte() -> None:
    """Issue 30 item 2: streams HAProxy sent before the freeze whose first bytes had come are
    the fault's (no first-byte timeout can end a started stream), not "gateway (no first-byte
    timeout)"; requests sent to the frozen replica after the freeze are the gateway's."""
    streaming = [_hung("a", 99.5, 99.6), _hung("b", 99.8, 99.9)]
    streaming.append(_rec("a", 2, "r1", 102.6, 103.0, ok=True))  # the client re-ran a
    who = str(
        blame_of("hung_requests", "upstream-timeout", {}, records=streaming, ground=FROZEN_GROUND)
    )
    assert who.startswith("fault (2 streams were already streaming when the replica froze")
    assert "; 1 re-run by the client)" in who and "gateway" not in who
    routed = [
        _hung("c", 101.0, None),
        _hung("d", 102.5, None, replica=None),
        _hung("e", 99.9, None),
    ]
    who = str(blame_of("max_wait_s", "upstream-timeout", {}, records=routed, ground=FROZEN_GROUND))
    assert who.startswith(
        "gateway (2 sent after the freeze (the last 2.5 s after it) and 1 waiting for their "
        "first byte when it froze hung on the frozen replica until the client gave up: no "
        "first-byte timeout"
    )
    mixed = str(
        blame_of(
            "hung_requests",
            "upstream-timeout",
            {},
            records=streaming + routed,
            ground=FROZEN_GROUND,
        )
    )
    assert mixed.startswith("gateway (") and " and fault (2 streams" in mixed
    # a hung attempt without a header whose request's first ledger line is its own retry on a
    # survivor (the frozen engine wrote nothing): still the frozen replica's (measured, issue 30)
    retried = [_hung("g", 101.0, None, replica=None), _rec("g", 2, "r1", 104.1, 104.5, ok=True)]
    who = str(
        blame_of(
            "hung_requests",
            "upstream-timeout",
            {},
            records=retried,
            ground=FROZEN_GROUND,
            replica_of={"g": "r1"},
        )
    )
    assert who.startswith("gateway (1 sent after the freeze")
    # a request hung on a survivor is the service's; no hung request on the frozen replica: none
    other = [_hung("f", 101.0, None, replica="r1")]
    assert (
        blame_of("hung_requests", "upstream-timeout", {}, records=other, ground=FROZEN_GROUND)
        is None
    )
    assert blame_of("hung_requests", "upstream-timeout", {}, records=routed, ground={}) is None


def test_the_engines_own_resets_retried_by_the_client_fail_no_retry_cost_row() -> None:
    """Issue 30: a replica that resets the streams it generated (``reset_after_k``), retried by
    the client, read "BLAME: client (it gave up on and re-sent requests the engine was still
    generating...)": the client gave up on nothing. Through the real judge, the re-runs are the
    engine fault's and no retry-cost row fails."""
    records, ledger = [], []
    for k in range(20):
        t = 100.0 + k * 0.5
        rid = f"x{k}"
        records += [
            _rec(rid, 1, "r0", t, t + 0.1, error_class="reset"),
            _rec(rid, 2, "r1", t + 0.11, t + 0.4, ok=True, error_class=None),
        ]
        ledger += [
            {
                "t": t + 0.001,
                "event": "fault",
                "mode": "reset_after_k",
                "replica": "r0",
                "request_id": rid,
                "pid": 10,
            },
            _gen(rid, "r0", t + 0.002, 10),
            _end(rid, "r0", t + 0.1, 10, ct=3),
            _gen(rid, "r1", t + 0.12, 11),
            _end(rid, "r1", t + 0.4, 11),
        ]
    fig = common_figures(records, ledger, [], [])
    assert (fig["rerun_generations"], fig["duplicate_generations"]) == (20, 0)
    ground = {
        "fault_at": 100.0,
        "replicas": ["r0"],
        "modes": ["reset_after_k"],
        "sabotaged_request_ids": {"r0": 20},
    }
    v = judge_drill(DrillFacts("engine-fault", records, fig, ground))
    rows = {r["criterion"]: r for r in v.rows}
    for name in ("duplicate_generations", "extra_generations", "wasted_tokens"):
        assert rows[name]["result"] == "pass", rows[name]
    assert not any("BLAME: client" in line for line in v.reasons), v.reasons
    # the same drill read without the engine's fault lines: the duplicates are back, and the
    # blame names what the records show (the stream failed at the client, the engine went on)
    fig = common_figures(records, [e for e in ledger if e.get("event") != "fault"], [], [])
    assert fig["duplicate_causes"] == {"stream_failed": 20}
