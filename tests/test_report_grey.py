"""Reporting that cannot turn grey into green: ``junit.xml`` writes an inconclusive drill as a
failure unless the operator asks for ``skipped`` (``--junit-inconclusive`` on ``gameday``,
``drill run`` and ``report``), and the choice a game day made is kept by ``report``.

Synthetic game-day folders (no lab): ``report`` keeps a drill whose folder is absent as the
summary has it, so only the summary, the index and the JUnit file are written.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chaoslib_infer.cli.drill import drill
from chaoslib_infer.cli.gameday import gameday
from chaoslib_infer.cli.report import report

SUMMARY: dict[str, Any] = {
    "plan": "grey",
    "target": {"kind": "lab", "engine": "sim", "replicas": 3},
    "started_at": "2027-01-15T08:00:00+00:00",
    "ended_at": "2027-01-15T08:05:00+00:00",
    "complete": True,
    "drills": [
        {"name": "a", "status": "passed", "reasons": [], "figures": {}},
        {
            "name": "b",
            "status": "inconclusive",
            "reasons": ["fault not confirmed by ground truth: the cut did not take"],
            "figures": {},
        },
    ],
}


def _folder(tmp_path: Path, **extra: Any) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({**SUMMARY, **extra}), encoding="utf-8")
    return run


def _grey_case(run: Path) -> tuple[ET.Element, ET.Element]:
    """The suite of ``run/junit.xml`` and its test case for the inconclusive drill ``b``."""
    root = ET.parse(run / "junit.xml").getroot()
    (case,) = [c for c in root.iter("testcase") if c.get("name") == "b"]
    return root, case


def test_report_writes_inconclusive_as_a_failure_unless_told_otherwise(tmp_path: Path) -> None:
    run = _folder(tmp_path)
    res = CliRunner().invoke(report, [str(run)])
    assert res.exit_code == 0, res.output
    root, case = _grey_case(run)
    assert (root.get("failures"), root.get("skipped")) == ("1", "0")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "inconclusive"
    assert failure.get("message") == (
        "inconclusive: fault not confirmed by ground truth: the cut did not take"
    )
    # the option: skipped, and recorded, so a later report writes it the same way
    res = CliRunner().invoke(report, [str(run), "--junit-inconclusive", "skipped"])
    assert res.exit_code == 0, res.output
    root, case = _grey_case(run)
    assert (root.get("failures"), root.get("skipped")) == ("0", "1")
    assert case.find("skipped") is not None and case.find("failure") is None
    assert json.loads((run / "summary.json").read_text())["junit_inconclusive"] == "skipped"
    assert CliRunner().invoke(report, [str(run)]).exit_code == 0
    assert _grey_case(run)[0].get("skipped") == "1"
    # the index never reads the scorecard as PASS with a drill not judged
    index = (run / "index.html").read_text(encoding="utf-8")
    assert "Tier 1: Stability — INCONCLUSIVE (not judged: 1)" in index


def test_report_refuses_an_unknown_choice(tmp_path: Path) -> None:
    res = CliRunner().invoke(report, [str(_folder(tmp_path)), "--junit-inconclusive", "green"])
    assert res.exit_code == 2 and "'green' is not one of 'failure', 'skipped'" in res.output
    run = _folder(tmp_path / "recorded", junit_inconclusive="green")
    res = CliRunner().invoke(report, [str(run)])
    assert res.exit_code == 2
    assert "junit inconclusive 'green': expected one of failure, skipped" in res.output


@pytest.mark.parametrize(
    ("command", "args"),
    [(gameday, []), (drill, ["run", "oom-kill"])],
    ids=["gameday", "drill-run"],
)
@pytest.mark.parametrize("choice", [None, "skipped"])
def test_gameday_and_drill_run_hand_the_choice_to_the_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: Any,
    args: list[str],
    choice: str | None,
) -> None:
    from chaoslib_infer import gameday as gameday_module

    seen: dict[str, Any] = {}

    def fake_run(plan: Any, out_dir: Path, **kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(gameday_module, "run_gameday", fake_run)
    option = [] if choice is None else ["--junit-inconclusive", choice]
    res = CliRunner().invoke(command, [*args, "--out", str(tmp_path / "out"), *option])
    assert res.exit_code == 0, res.output
    assert seen["junit_inconclusive"] == (choice or "failure")
