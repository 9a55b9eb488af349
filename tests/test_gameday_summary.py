"""The game day's end: ``summary.json`` carries the verdict, and the exit code follows the
drills' states (``README.md``, "Exit codes"; ``docs/definitions.md``, "Verdicts").

``run_gameday`` against a URL target with the drill run replaced by a stub: no lab, no load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer import gameday
from chaoslib_infer.plan import load_plan

ROOT = Path(__file__).resolve().parent.parent
STOP = {
    "guard": "availability_floor",
    "value": 0.2,
    "threshold": 0.5,
    "reason": "availability 0.2 < 0.5 for 2 s",
}


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: list[dict[str, Any]]
) -> tuple[int, dict[str, Any], list[str]]:
    plan_path = tmp_path / "plan.yaml"
    exp = str(ROOT / "experiments" / "oom-kill.yaml")
    drills = [{"name": f"d{i}", "experiment": exp} for i in range(len(entries))]
    plan_path.write_text(json.dumps({"name": "t", "drills": drills}), encoding="utf-8")
    todo = list(entries)

    def fake_run_drill(spec: Any, drill_dir: Path, *_a: Any, **_kw: Any) -> dict[str, Any]:
        drill_dir.mkdir(parents=True, exist_ok=True)
        return {"name": spec.name, "experiment": spec.experiment, "figures": {}, **todo.pop(0)}

    monkeypatch.setattr(gameday, "run_drill", fake_run_drill)
    seen: list[str] = []
    out = tmp_path / "out"
    code = gameday.run_gameday(
        load_plan(plan_path), out, base_url="http://127.0.0.1:9", progress=seen.append
    )
    return code, json.loads((out / "summary.json").read_text(encoding="utf-8")), seen


@pytest.mark.parametrize(
    ("entries", "code", "verdict"),
    [
        ([{"status": "passed", "reasons": []}], 0, "passed"),
        (
            [{"status": "passed", "reasons": []}, {"status": "failed", "reasons": ["x: 3 > 0"]}],
            1,
            "failed",
        ),
        ([{"status": "inconclusive", "reasons": ["fault not confirmed"]}], 3, "inconclusive"),
        ([{"status": "aborted", "reasons": ["stopped: the run was interrupted"]}], 130, "aborted"),
    ],
)
def test_summary_carries_the_game_day_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    entries: list[dict[str, Any]],
    code: int,
    verdict: str,
) -> None:
    got, summary, seen = _run(tmp_path, monkeypatch, entries)
    assert got == code
    assert summary["verdict"] == verdict
    assert seen[-1].startswith(f"game day {verdict.upper()}: ")


def test_a_stop_condition_fails_the_game_day_with_exit_1_and_verdict_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop condition aborts its drill (the service fell below the plan's floor): the game day
    stops, exits 1 (a failure for CI, not an operator's Ctrl-C: 130) and says STOPPED."""
    stopped = {
        "status": "aborted",
        "reasons": [f"stopped: {STOP['guard']}: {STOP['reason']}"],
        "stop_condition": STOP,
    }
    code, summary, seen = _run(
        tmp_path, monkeypatch, [stopped, {"status": "passed", "reasons": []}]
    )
    assert code == 1
    assert summary["verdict"] == "stopped"
    assert summary["stopped_by"]["guard"] == "availability_floor"
    assert [d["name"] for d in summary["drills"]] == ["d0"]  # no further drill ran
    assert summary["drills"][0]["status"] == "aborted"
    assert any(m == "stop condition tripped: rollbacks played; no further drill runs" for m in seen)
    assert "STOPPED" in (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert seen[-1].startswith("game day STOPPED: ")


def test_index_shows_the_reasons_before_the_scorecard_with_styled_badges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [
        {"status": "failed", "reasons": ["duplicate generations: 3 > 0 (duplicate_generations)"]},
        {"status": "inconclusive", "reasons": ["fault not confirmed by ground truth: x"]},
    ]
    code, _summary, _seen = _run(tmp_path, monkeypatch, entries)
    assert code == 1
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    first = page.index("duplicate generations: 3 &gt; 0 (duplicate_generations)")
    assert first < page.index("fault not confirmed by ground truth: x") < page.index("Scorecard")
    assert 'id="reasons"' in page and page.index('id="reasons"') < page.index("Scorecard")
    assert 'class="verdict v-FAILED"' in page
    style = page.split("</style>", 1)[0]
    for selector in (".failed", ".inconclusive", ".v-FAILED", ".v-INCONCLUSIVE"):
        assert selector in style, selector


def test_the_game_day_closes_with_each_drills_verdict_and_first_reason() -> None:
    """Found by a new-user trial: the verdicts were spread over ~80 lines of progress."""
    from chaoslib_infer.gameday_evidence import verdict_table

    long = "first-request TTFT / steady-state TTFT: 45.8x > 10x; fix: warm the engine " + "x" * 80
    lines = verdict_table(
        [
            {"name": "node-loss", "status": "passed", "reasons": []},
            {"name": "oom-kill", "status": "failed", "reasons": [long, "second", "third"]},
            {"name": "quota-cut", "status": "aborted", "reasons": ["stopped: interrupted"]},
        ]
    )
    assert lines[0].split() == ["drill", "verdict", "first", "reason"]
    assert lines[1] == "node-loss  PASSED"
    assert lines[2].startswith("oom-kill   FAILED        first-request TTFT / steady-state")
    assert lines[2].endswith("... (+2 more)") and len(lines[2]) == 11 + 14 + 100 + len(" (+2 more)")
    assert lines[3] == "quota-cut  ABORTED       stopped: interrupted"
    assert verdict_table([]) == []
