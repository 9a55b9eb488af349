"""A figure kind whose computation raises makes its drill ``error`` (exit code 2), with a reason that
names the kind and the exception's first line, in the verdict, summary entry, evidence and junit.xml;
never a silent pass (issue #12, item 4).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.bundle import junit_xml
from chaoslib_infer.evidence.figures import drill_figures
from chaoslib_infer.evidence.verdicts import drill_verdict
from chaoslib_infer.gameday import EXIT_ERROR, drill_evidence
from chaoslib_infer.verdict import DrillFacts, exit_code, figure_error_reason, judge_drill

#: What the oom-kill kind raises on a fault record without its injection time.
REASON = "figures of oom-kill could not be computed: KeyError: 'fault_at'"


def _broken_oom_kill_run(drill_dir: Path) -> None:
    """A drill folder whose fault log has an oom-kill record the kind's ``compute`` chokes on."""
    drill_dir.mkdir(parents=True, exist_ok=True)
    (drill_dir / "faults.jsonl").write_text(
        json.dumps({"kind": "oom-kill", "replica": "r1"}) + "\n", encoding="utf-8"
    )
    (drill_dir / "residue.json").write_text(
        json.dumps({"checked_at": 1.0, "residue": []}), encoding="utf-8"
    )


def test_a_kind_that_raises_is_reported_on_one_line(tmp_path: Path) -> None:
    _broken_oom_kill_run(tmp_path)
    figures, _ground = drill_figures(tmp_path, [], [])
    assert figures["figure_errors"] == {"oom-kill": "KeyError: 'fault_at'"}


def test_a_kind_that_raises_makes_the_drill_an_error_naming_kind_and_message(
    tmp_path: Path,
) -> None:
    _broken_oom_kill_run(tmp_path)
    figures, ground = drill_figures(tmp_path, [], [])
    v = drill_verdict("oom-kill", tmp_path, {}, [], figures, ground, [], False)
    assert v.state == "error"
    assert v.reasons == [REASON]
    assert exit_code([v.state]) == EXIT_ERROR == 2
    assert exit_code(["passed", v.state, "inconclusive"]) == 2


def test_the_error_reaches_summary_entry_evidence_and_junit(tmp_path: Path) -> None:
    drill_dir = tmp_path / "oom-kill"
    _broken_oom_kill_run(drill_dir)
    entry = drill_evidence(
        "oom-kill",
        "experiments/oom-kill.yaml",
        "OOM kill",
        drill_dir,
        {},
        None,
        {"kind": "url", "url": "http://127.0.0.1:1", "engine": "unknown", "replicas": 0},
        1000.0,
        1010.0,
        kind="oom-kill",
    )
    assert entry["status"] == "error"
    assert entry["reasons"] == [REASON]
    assert entry["figures"]["figure_errors"] == {"oom-kill": "KeyError: 'fault_at'"}
    evidence = (drill_dir / "evidence.md").read_text(encoding="utf-8")
    assert REASON in evidence
    summary: dict[str, Any] = {"plan": "p", "drills": [entry]}
    root = ET.fromstring(junit_xml(summary))
    assert root.get("errors") == "1" and root.get("failures") == "0"
    case = next(c for c in root.iter("testcase") if c.get("name") == "oom-kill")
    error = case.find("error")
    assert error is not None, ET.tostring(case)
    assert error.get("message") == REASON
    assert REASON in (error.text or "")


def test_the_reason_keeps_one_line_of_a_multi_line_message() -> None:
    assert figure_error_reason("node-loss", "ValueError: bad row\n  at line 3\n") == (
        "figures of node-loss could not be computed: ValueError: bad row"
    )
    assert figure_error_reason("node-loss", "") == (
        "figures of node-loss could not be computed: unknown error"
    )


def test_a_failed_figure_stays_visible_under_an_abort_and_a_residue() -> None:
    reason = figure_error_reason("network-jitter", "IndexError: list index out of range")
    aborted = judge_drill(
        DrillFacts("network-jitter", [], {}, {}, journal_status="aborted", errors=[reason])
    )
    assert aborted.state == "aborted"  # an abort outranks the error (exit 130) ...
    assert aborted.reasons == ["stopped: the run was interrupted", reason]  # ... yet it shows
    left = judge_drill(
        DrillFacts("network-jitter", [], {}, {}, errors=[reason], residue=["netem on r2"])
    )
    assert left.state == "failed"
    assert left.reasons == ["fault left behind after the rollbacks: netem on r2", reason]
    # interrupted with a fault left behind: aborted (the game day stops, exit 130), the
    # residue listed, never hidden; a stop condition with a residue stays failed
    both = judge_drill(
        DrillFacts(
            "network-jitter",
            [],
            {},
            {},
            journal_status="aborted",
            errors=[reason],
            residue=["netem on r2"],
        )
    )
    assert both.state == "aborted"
    assert both.reasons == [
        "stopped: the run was interrupted",
        "fault left behind after the rollbacks: netem on r2",
        reason,
    ]
    tripped = judge_drill(
        DrillFacts("network-jitter", [], {}, {}, stop_reason="P99 over 5 s", residue=["x"])
    )
    assert (tripped.state, tripped.reasons) == (
        "failed",
        ["fault left behind after the rollbacks: x"],
    )
    # a crashed action (not a figure) is not repeated under an abort
    crashed = judge_drill(
        DrillFacts(
            "network-jitter", [], {}, {}, journal_status="aborted", errors=["activity x crashed"]
        )
    )
    assert crashed.reasons == ["stopped: the run was interrupted"]
