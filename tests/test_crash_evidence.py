"""Crashes told whole (issue 21 item 5), on synthetic lab events, ledger and records: exits,
exit codes, restarts, restart time, the prompts a replica died on, the engine-fault drill's
confirmation line, and the prompt size each record carries. Pure functions: fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_verdict_unit import attempt, ledger_for, steady

from chaoslib_infer.drills.oom_kill import figures as oom
from chaoslib_infer.evidence.figures import common_figures
from chaoslib_infer.evidence.kinds import engine_fault as ev
from chaoslib_infer.gameday_evidence import headline
from chaoslib_infer.load.prompt_size import estimate_prompt_tokens, prompt_fields
from chaoslib_infer.measure.crashes import crash_report, died_on
from chaoslib_infer.measure.figkit import DrillContext
from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.timeline import timeline

T0 = 1_800_000_000.0


def _events() -> list[dict[str, Any]]:
    """r0 (pid 11) dies with exit status 70 at +105 s, restarts as pid 12, dies again at +110 s,
    restarts as pid 13; r1 never dies."""
    return [
        {"t": T0 + 1, "event": "start", "replica": "r0", "pid": 11},
        {"t": T0 + 105, "event": "exit", "replica": "r0", "pid": 11, "cause": "exit:70",
         "status": "exit:70", "expected": False},
        {"t": T0 + 105.5, "event": "start", "replica": "r0", "pid": 12},
        {"t": T0 + 106.2, "event": "ready", "replica": "r0"},
        {"t": T0 + 110, "event": "exit", "replica": "r0", "pid": 12, "cause": "exit:70",
         "status": "exit:70", "expected": False},
        {"t": T0 + 110.4, "event": "start", "replica": "r0", "pid": 13},
        {"t": T0 + 111.0, "event": "ready", "replica": "r0"},
    ]  # fmt: skip


def _ledger() -> list[dict[str, Any]]:
    """``a`` served whole by pid 11; ``b`` in flight on pid 11 when it died (no end); ``c`` the
    long prompt pid 11 died on (its fault line, 300 tokens by the engine's count); ``d`` the one
    pid 12 died on (280 tokens); ``b`` retried on r1 and ended there (another pid)."""
    return [
        {"t": T0 + 101, "event": "generation", "replica": "r0", "request_id": "a", "pid": 11},
        {"t": T0 + 101.5, "event": "generation_end", "replica": "r0", "request_id": "a",
         "pid": 11, "prompt_tokens": 12, "completion_tokens": 8, "outcome": "done"},
        {"t": T0 + 104.8, "event": "generation", "replica": "r0", "request_id": "b", "pid": 11},
        {"t": T0 + 104.9, "event": "fault", "mode": "crash_on_long_prompt", "replica": "r0",
         "request_id": "c", "pid": 11, "source": "admin", "params": {"n": 256, "how": "exit"},
         "prompt_tokens": 300},
        {"t": T0 + 105.2, "event": "generation", "replica": "r1", "request_id": "b", "pid": 21},
        {"t": T0 + 105.6, "event": "generation_end", "replica": "r1", "request_id": "b",
         "pid": 21, "prompt_tokens": 21, "completion_tokens": 8, "outcome": "done"},
        {"t": T0 + 109.9, "event": "fault", "mode": "crash_on_long_prompt", "replica": "r0",
         "request_id": "d", "pid": 12, "source": "admin", "params": {"n": 256, "how": "exit"},
         "prompt_tokens": 280},
    ]  # fmt: skip


def _records() -> list[dict[str, Any]]:
    def rec(rid: str, ok: bool, n: int, src: str, sent: float) -> dict[str, Any]:
        r = attempt(rid, T0 + sent, ok=ok, replica="r0", error_class="http_5xx",
                    first_token=0.01 if ok else None)  # fmt: skip
        return {**r, "prompt_tokens": n, "prompt_tokens_source": src}

    return [rec("a", True, 12, "usage", 101), rec("b", False, 21, "estimate", 104.8),
            rec("c", False, 301, "estimate", 104.9), rec("d", False, 282, "estimate", 109.9)]  # fmt: skip


def test_crash_report_counts_exits_restarts_and_the_prompts_died_on() -> None:
    served = {T0 + 105: T0 + 107.0, T0 + 110: T0 + 113.5}
    fig, exits = crash_report(
        _events(), _ledger(), _records(), ["r0"], T0 + 100, lambda r, t: served.get(t)
    )
    assert fig["replica_exits"] == 2 and fig["replica_restarts"] == 2
    assert fig["exit_codes"] == {"exit:70": 2} and fig["restarts_unserved"] == 0
    assert fig["restart_s"] == pytest.approx(3.5)  # the worst: 110 -> 113.5
    assert [x["restart_s"] for x in exits] == pytest.approx([2.0, 3.5])
    assert [(x["pid"], x["restarted_at"], x["ready_at"]) for x in exits] == [
        (11, T0 + 105.5, T0 + 106.2),
        (12, T0 + 110.4, T0 + 111.0),
    ]
    # died on: b (in flight, no end on pid 11; its retry's end on r1 does not count, but gives
    # the engine's count of its prompt) and c (the fault line) for pid 11; d for pid 12. The
    # engine's count wins over the client's estimate (c: 301, d: 282)
    assert [[(p["request_id"], p["prompt_tokens"], p["source"]) for p in x["died_on"]] for x in exits] == [
        [("b", 21, "engine"), ("c", 300, "engine")],
        [("d", 280, "engine")],
    ]  # fmt: skip
    assert fig["crash_prompt_tokens"] == [21, 300, 280]
    assert fig["crash_prompt_tokens_source"] == "engine"
    # a restart never followed by a served request: restart time unmeasured, never 0
    fig, _ = crash_report(_events(), _ledger(), _records(), ["r0"], T0 + 100, lambda r, t: None)
    assert fig["restart_s"] is None and fig["restarts_unserved"] == 2
    # nothing died: counted zero, restart time unmeasured
    fig, exits = crash_report(_events(), _ledger(), _records(), ["r1"], T0 + 100)
    assert (fig["replica_exits"], fig["restart_s"], exits) == (0, None, [])
    assert died_on(_ledger(), {"replica": "r1", "pid": 21, "t": T0 + 200}) == []
    # the supervisor's pid is not the engine's (a wrapper): matched by time, after the last exit
    no_pid = [{**e, "pid": None} for e in _events()]
    fig, exits = crash_report(no_pid, _ledger(), _records(), ["r0"], T0 + 100)
    assert [[p["request_id"] for p in x["died_on"]] for x in exits] == [["b", "c"], ["d"]]


def _faults() -> list[dict[str, Any]]:
    return [
        {"kind": "engine-fault", "phase": "set", "fault_at": T0 + 100, "replica": "r0",
         "mode": "crash_on_long_prompt", "params": {"n": 256, "how": "exit"}},
        {"kind": "engine-fault", "phase": "cleared", "fault_at": T0 + 120, "replica": "r0",
         "mode": "all"},
    ]  # fmt: skip


def test_engine_fault_drill_tells_the_crash_and_confirms_it(tmp_path: Path) -> None:
    """The figures and ground truth of an engine-fault drill whose replica crashed twice; the
    verdict's confirmation names exits, codes, restarts and the trigger: no more "no lab ground
    truth" beside the replica's exit:70."""
    served = {T0 + 105: T0 + 107.0, T0 + 110: T0 + 113.5}
    records = steady(T0 + 90, T0 + 130)
    records += _records()
    ctx = DrillContext(
        tmp_path, records, _faults(), _events(), _ledger(), lambda r, t: served.get(t)
    )
    fig, ground = ev.compute(ctx)
    assert (fig["replica_exits"], fig["replica_restarts"], fig["exit_codes"]) == (
        2,
        2,
        {"exit:70": 2},
    )
    assert fig["restart_s"] == pytest.approx(3.5) and fig["crash_prompt_tokens"] == [21, 300, 280]
    assert fig["sabotaged_by_mode"] == {"crash_on_long_prompt": 2}
    assert ground["crash_trigger"] == (
        "armed on prompts over 256 tokens; died on prompts of 21, 300, 280 tokens (engine count)"
    )
    tl = timeline("engine-crash", ground, fig, _events())
    assert tl.confirmed is True and tl.fault_at == T0 + 100
    assert tl.why == (
        "2 of the drill's requests sabotaged by crash_on_long_prompt (engine ledger); "
        "2 replica exits (exit:70 x2), 2 restarted; " + ground["crash_trigger"]
    )
    assert "replica_exits=2 (exit:70 x2), replica_restarts=2" in headline(fig)
    full = {**common_figures(records, ledger_for(records) + _ledger()), **fig}
    v = judge_drill(DrillFacts("engine-crash", records, full, ground, lab_events=_events()))
    assert f"fault: {tl.why}" in v.notes
    assert not any("no lab ground truth" in n for n in v.notes), v.notes
    assert not any("confirm" in r for r in v.reasons), v.reasons


def test_an_engine_fault_the_traffic_never_met_is_not_confirmed(tmp_path: Path) -> None:
    """Armed, but no request of the drill was sabotaged and nothing died: not confirmed (the
    judge makes that inconclusive), with the reason."""
    ctx = DrillContext(tmp_path, steady(T0 + 90, T0 + 130), _faults(), [], [])
    fig, ground = ev.compute(ctx)
    assert fig["replica_exits"] == 0 and ground["crash_trigger"] is None
    tl = timeline("engine-crash", ground, fig, [])
    assert tl.confirmed is False
    assert (
        tl.why
        == "the armed crash_on_long_prompt sabotaged none of the drill's requests (engine ledger)"
    )
    assert "replica_exits" not in headline(fig)
    # a mode that cannot crash and killed nothing: no crash rows at all (nothing happened)
    hang = [
        {**f, "mode": "hang" if f["phase"] == "set" else "all", "params": {}} for f in _faults()
    ]
    fig, ground = ev.compute(DrillContext(tmp_path, steady(T0 + 90, T0 + 130), hang, [], []))
    assert "replica_exits" not in fig and "crash_trigger" not in ground
    assert ground["replica_exits"] == []


def test_oom_kill_reports_exits_restarts_and_what_was_in_flight(tmp_path: Path) -> None:
    events = [
        {"t": T0 + 105, "event": "exit", "replica": "r0", "pid": 11, "cause": "oom",
         "status": "signal:SIGKILL"},
        {"t": T0 + 105.5, "event": "start", "replica": "r0", "pid": 12},
        {"t": T0 + 106.0, "event": "ready", "replica": "r0"},
    ]  # fmt: skip
    fault = {"kind": "oom-kill", "fault_at": T0 + 104.5, "replica": "r0", "oom_kills_before": 0,
             "oom_kills_after": 1}  # fmt: skip
    # no crash fault line, and b's retry never reached the ledger: the client's estimate
    ledger = [e for e in _ledger() if e.get("event") != "fault" and e.get("replica") == "r0"]
    ctx = DrillContext(tmp_path, _records(), [fault], events, ledger, lambda r, t: T0 + 107.0)
    fig, ground = oom.compute(ctx)
    assert (fig["replica_exits"], fig["replica_restarts"], fig["exit_codes"]) == (1, 1, {"oom": 1})
    assert fig["restart_s_ground_truth"] == pytest.approx(2.0)
    assert fig["crash_prompt_tokens"] == [21]  # b was in flight on the killed process
    assert ground["crash_trigger"] == (
        "memory hog in r0's cgroup; in flight on the killed process: prompts of 21 tokens "
        "(estimate count)"
    )


def test_records_carry_the_prompt_size_and_say_whose_count() -> None:
    chat = b'{"messages": [{"role": "user", "content": "' + b"word " * 100 + b'"}]}'
    assert estimate_prompt_tokens(chat) == 125  # the sim engine's rule: ceil(500 / 4)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]}
    assert estimate_prompt_tokens(parts) == 2
    assert estimate_prompt_tokens({"prompt": [5, 6, 7]}) == 3
    assert estimate_prompt_tokens({"prompt": "x"}) == 1
    assert estimate_prompt_tokens(b"not json") is None and estimate_prompt_tokens({"a": 1}) is None
    assert prompt_fields(130, chat) == {"prompt_tokens": 130, "prompt_tokens_source": "usage"}
    assert prompt_fields(None, chat) == {"prompt_tokens": 125, "prompt_tokens_source": "estimate"}
    assert prompt_fields(None, None) == {"prompt_tokens": None, "prompt_tokens_source": None}
