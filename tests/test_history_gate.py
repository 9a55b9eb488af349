"""The ``--fail-on-regression`` gate (issue 32) without a lab: the exit code, the junit
failure beside the drills' own cases, the runbook's citation and the game day's index.html
rows, all from a summary with a history comparison in it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.evidence.bundle import junit_xml
from chaoslib_infer.evidence.render import render_index
from chaoslib_infer.evidence.runbooks import evidence_block
from chaoslib_infer.gameday import (
    EXIT_DEVIATED,
    EXIT_ERROR,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    regression_exit_code,
)
from chaoslib_infer.history.compare import Past, compare_drill
from chaoslib_infer.history.record import DrillRecord


def _summary(fail_on_regression: bool) -> dict[str, Any]:
    settings = {"client": {}, "gateway": {"gateway": "haproxy"}}
    past = [
        Past(i, "2026-12-06T21:00:00+00:00", "lab:sim:x3",
             DrillRecord("oom-kill", "passed", [], {"restart_s": 2.2 + i / 15}, settings))
        for i in range(1, 7)
    ]  # fmt: skip
    comp = compare_drill(DrillRecord("oom-kill", "passed", [], {"restart_s": 13.4}, settings), past)
    assert comp.reading == "regressed"
    return {
        "plan": "default-gameday",
        "target": {"kind": "lab", "engine": "sim", "replicas": 3},
        "started_at": "2026-12-06T22:00:00+00:00",
        "ended_at": "2026-12-06T22:01:00+00:00",
        "complete": True,
        "drills": [
            {
                "name": "oom-kill",
                "status": "passed",
                "reasons": [],
                "figures": {"restart_s": 13.4},
                "evidence": "oom-kill/evidence.md",
            },
        ],  # fmt: skip
        "history": {
            "store": "/tmp/h.sqlite",
            "run_id": 7,
            "drills": {"oom-kill": comp.as_dict()},
            "trends": {},
            "regressed": ["oom-kill"],
            "fail_on_regression": fail_on_regression,
        },
    }


def test_the_gate_turns_a_pass_into_exit_1_only_when_asked() -> None:
    on, off = _summary(True)["history"], _summary(False)["history"]
    assert regression_exit_code(EXIT_OK, on) == EXIT_DEVIATED
    assert regression_exit_code(EXIT_INCONCLUSIVE, on) == EXIT_DEVIATED
    assert regression_exit_code(EXIT_OK, off) == EXIT_OK
    assert regression_exit_code(EXIT_OK, {**on, "regressed": []}) == EXIT_OK
    for own in (EXIT_DEVIATED, EXIT_ERROR, EXIT_INTERRUPTED):  # the run's own code stands
        assert regression_exit_code(own, on) == own


def test_junit_gets_a_regression_failure_beside_the_drill_s_own_case() -> None:
    suite = ET.fromstring(junit_xml(_summary(True)))
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["oom-kill"].find("failure") is None  # the drill passed: its verdict stands
    failure = cases["history:oom-kill"].find("failure")
    assert failure is not None and failure.get("type") == "regression"
    assert (failure.get("message") or "").startswith("restart_s 13.4 s vs 2.27-2.6 s")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    off = ET.fromstring(junit_xml(_summary(False)))
    assert [c.get("name") for c in off.iter("testcase")] == ["oom-kill"]


def test_index_and_runbook_cite_the_comparison(tmp_path: Path) -> None:
    summary = _summary(False)
    html = render_index(tmp_path, summary, "PASSED").read_text()
    assert 'id="history-comparison"' in html
    assert "<td>oom-kill</td><td>regressed</td><td>restart_s 13.4 s vs 2.27-2.6 s" in html
    block = evidence_block(summary, summary["drills"], tmp_path, tmp_path)
    assert (
        "- History: run #7 of `/tmp/h.sqlite` against runs #1, #2, #3, #4, #5, #6: **regressed** (restart_s 13.4 s"
        in block
    )


def test_a_plan_names_its_store_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from chaoslib_infer.errors import ConfigError
    from chaoslib_infer.history.store import resolve_where
    from chaoslib_infer.plan import load_plan

    exp = Path(__file__).resolve().parent.parent / "experiments" / "oom-kill.yaml"
    good = tmp_path / "p.yaml"
    good.write_text(
        f"history: postgresql://ci@db/chaos\ndrills: [{{name: oom-kill, experiment: {exp}}}]\n"
    )
    plan = load_plan(good)
    assert plan.history == "postgresql://ci@db/chaos"
    # $CHAOS_INFER_HISTORY (the suite sets it off) comes before the plan's
    assert resolve_where(None, plan.history) is None
    assert resolve_where("x.sqlite", plan.history) == "x.sqlite"  # --history first
    assert resolve_where("off", plan.history) is None
    bad = tmp_path / "b.yaml"
    bad.write_text(f"history: 3\ndrills: [{{name: oom-kill, experiment: {exp}}}]\n")
    with pytest.raises(ConfigError, match="history: expected an SQLite file path"):
        load_plan(bad)


def test_a_certification_is_recorded_per_target() -> None:
    from chaoslib_infer.history.record import record_from_summary

    row = {"metric": "p99_e2e_s", "value": 1.25, "passed": True}
    summary = {
        "kind": "certification",
        "plan": {"name": "certification", "path": "drills/certification.yaml"},
        "started_at": "2026-12-06T20:00:00+00:00",
        "complete": True,
        "tool": {"chaoslib-infer": "0.1.0"},
        "targets": [
            {"name": "a", "verdict": "CERTIFIED", "reasons": [], "target": {"url": "http://127.0.0.1:1"},
             "scorecard": {"tiers": [{"rows": [row]}]}},
            {"name": "b", "verdict": "NOT CERTIFIED", "reasons": ["p99 too slow"],
             "target": {"url": "http://127.0.0.1:2"}, "scorecard": {"tiers": []}},
        ],
    }  # fmt: skip
    run = record_from_summary(summary)
    assert (run.kind, run.plan, run.target_key) == ("certify", "certification", "certify:a,b")
    assert [(d.drill, d.status) for d in run.drills] == [
        ("certify/a", "passed"),
        ("certify/b", "failed"),
    ]
    assert run.drills[0].figures == {"p99_e2e_s": 1.25}
    assert run.drills[0].settings_hash != run.drills[1].settings_hash  # each target its own


def test_a_store_that_cannot_be_written_is_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    from chaoslib_infer.gameday import record_history

    lines: list[str] = []
    summary = _summary(False)
    summary.pop("history")
    got = record_history(summary, tmp_path, "postgresql://nobody:pw@127.0.0.1:1/x", lines.append)
    assert got["store"] == "postgresql://nobody:***@127.0.0.1:1/x"  # the password hidden
    assert "cannot open" in got["error"]
    assert len(lines) == 1 and lines[0].startswith("history: not recorded: history: ")
    assert "pw" not in lines[0]
    partial = {**summary, "complete": False}
    assert record_history(partial, tmp_path, str(tmp_path / "h.sqlite"), lines.append) == {
        "store": str(tmp_path / "h.sqlite"),
        "error": "the run did not complete: not recorded",
    }
    ok = record_history(summary, tmp_path, str(tmp_path / "h.sqlite"), lines.append)
    assert ok["run_id"] == 1 and ok["regressed"] == []
    assert ok["drills"]["oom-kill"]["reading"] == "not compared"
