"""Runbooks: one per drill with the required sections, and their Evidence filled from a run."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from labutil import SEVEN_DRILLS as SEVEN

from chaoslib_infer.evidence.bundle import write_manifest
from chaoslib_infer.evidence.runbooks import END, START, fill_runbook_text, fill_runbooks

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = ROOT / "runbooks"
SECTIONS = [
    "Purpose",
    "Preconditions",
    "Blast radius",
    "Steps",
    "Expected behaviour",
    "Verdict criteria",
    "When the drill fails",
    "Rollback",
    "Evidence",
]


@pytest.mark.parametrize("drill", SEVEN)
def test_each_drill_has_a_complete_runbook(drill: str) -> None:
    text = (RUNBOOKS / f"{drill}.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+?)\s*$", text, re.M)
    assert headings == SECTIONS, headings
    assert f"`experiments/{drill}.yaml`" in text
    # the runbook names every criterion the verdict judges for this drill (verdict/criteria.py)
    from chaoslib_infer.verdict import DRILL_CRITERIA

    criteria = text.split("## Verdict criteria", 1)[1].split("## When the drill fails", 1)[0]
    for c in DRILL_CRITERIA[drill]:
        assert f"`{c.name}`" in criteria, (drill, c.name)
    assert (ROOT / "experiments" / f"{drill}.yaml").is_file()
    assert text.count(START) == 1 and text.count(END) == 1
    evidence = text.split("## Evidence", 1)[1]
    assert START in evidence and END in evidence  # markers inside the Evidence section
    for section in SECTIONS[:-1]:
        body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
        assert len(body.strip()) > 40, f"{drill}: section {section} is empty"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    drills: list[dict[str, Any]] = [
        {
            "name": "oom-kill",
            "experiment": str(ROOT / "experiments" / "oom-kill.yaml"),
            "status": "passed",
            "hypothesis": {"before": True, "after": True},
            "started_at": "2027-01-15T08:00:00+00:00",
            "ended_at": "2027-01-15T08:00:40+00:00",
            "figures": {
                "requests": 312,
                "availability": 0.9936,
                "interruption_s": 0.8123,
                "restart_s": 0.412,
                "errors_by_class": {"reset": {"count": 2, "sample": "x|y"}},
                "note": "a|b",
            },
            "ground_truth": {"fault_at": 1800000000.25, "oom_kills_after": 1, "events": [1, 2]},
            "evidence": "oom-kill/evidence.md",
        },
        {
            # a second run of the spike under another name: lands in traffic-spike.md
            "name": "traffic-spike-2",
            "experiment": str(ROOT / "experiments" / "traffic-spike.yaml"),
            "status": "deviated",
            "hypothesis": {"before": True, "after": False},
            "started_at": "2027-01-15T08:01:00+00:00",
            "ended_at": "2027-01-15T08:01:50+00:00",
            "figures": {"requests": 555, "recovery_s": 4.5, "shed_requests": 17},
            "ground_truth": {},
            "evidence": "traffic-spike-2/evidence.md",
        },
        {"name": "not-a-drill", "experiment": "x.yaml", "status": "passed", "figures": {}},
    ]
    for d in drills:
        (run / d["name"]).mkdir(parents=True)
        for f in ("evidence.html", "evidence.md", "records.jsonl"):
            (run / d["name"] / f).write_text(f"{d['name']} {f}\n")
    summary = {
        "plan": "synthetic",
        "target": {"kind": "lab", "engine": "sim", "replicas": 3},
        "started_at": "2027-01-15T08:00:00+00:00",
        "ended_at": "2027-01-15T08:02:00+00:00",
        "complete": True,
        "drills": drills,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    write_manifest(run)
    return run


def test_fill_runbooks_from_a_run(tmp_path: Path) -> None:
    books = tmp_path / "runbooks"
    shutil.copytree(RUNBOOKS, books)
    before = {p.name: p.read_text(encoding="utf-8") for p in books.glob("*.md")}
    run = _run(tmp_path)
    written = fill_runbooks(run, books)
    assert sorted(written) == ["oom-kill", "traffic-spike"]

    oom = (books / "oom-kill.md").read_text(encoding="utf-8")
    head, rest = oom.split(START)
    block, tail = rest.split(END)
    old_head, old_rest = before["oom-kill.md"].split(START)
    assert head == old_head and tail == old_rest.split(END)[1]  # outside the markers: unchanged
    assert "### oom-kill: PASSED" in block
    assert "Hypothesis before the fault: held; after: held." in block
    assert "| interruption_s | 0.8123 |" in block
    assert "| restart_s | 0.412 |" in block
    assert "| note | a\\|b |" in block  # table-safe
    assert "errors_by_class" not in block  # nested values stay in the evidence page
    assert "| oom_kills_after | 1 |" in block and "| events |" not in block
    assert "| fault_at | 2027-01-15T08:00:00.250Z |" in block  # unix seconds as UTC
    links = re.findall(r"\]\(([^)]+)\)", block)
    assert links and all((books / link).resolve().is_file() for link in links), links
    html = run / "oom-kill" / "evidence.html"
    assert f"`oom-kill/evidence.html`: `{_sha(html)}`" in block
    assert f"`oom-kill/records.jsonl`: `{_sha(run / 'oom-kill' / 'records.jsonl')}`" in block

    spike = (books / "traffic-spike.md").read_text(encoding="utf-8")
    assert "### traffic-spike-2: DEVIATED" in spike
    assert "after: **did not hold**" in spike
    assert "| recovery_s | 4.5 |" in spike and "| shed_requests | 17 |" in spike
    for name in ("node-loss.md", "quota-cut.md"):  # not in the run: untouched
        assert (books / name).read_text(encoding="utf-8") == before[name]

    # idempotent: the same run gives the same bytes
    snapshot = {p.name: p.read_bytes() for p in books.glob("*.md")}
    fill_runbooks(run, books)
    assert {p.name: p.read_bytes() for p in books.glob("*.md")} == snapshot


def test_markers_added_when_missing_and_broken_markers_refused() -> None:
    text = "# R\n\n## Rollback\nundo\n\n## Evidence\nsee the run\n\n## Notes\nkeep\n"
    out = fill_runbook_text(text, "\nproof\n")
    assert out == (
        f"# R\n\n## Rollback\nundo\n\n## Evidence\nsee the run\n\n{START}\nproof\n{END}\n"
        "\n## Notes\nkeep\n"
    )
    assert fill_runbook_text(out, "\nproof\n") == out
    bare = fill_runbook_text("# R\n## Steps\n1.", "\np\n")
    assert bare == f"# R\n## Steps\n1.\n\n## Evidence\n{START}\np\n{END}\n"
    with pytest.raises(ValueError, match="markers"):
        fill_runbook_text(f"{END}\n{START}\n", "x")
    with pytest.raises(ValueError, match="markers"):
        fill_runbook_text(f"{START}{END}{START}{END}", "x")


def test_fill_needs_a_summary(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fill_runbooks(tmp_path, RUNBOOKS)
