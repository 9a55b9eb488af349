"""Plan loading, journal verdicts, CLI input errors and the capacity formula."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from labutil import SEVEN_DRILLS, cli

from chaoslib_infer.cli import main
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.journal import drill_status, failed_activities, hypothesis_results
from chaoslib_infer.plan import load_plan

ROOT = Path(__file__).resolve().parent.parent


def test_default_plan_loads() -> None:
    plan = load_plan(ROOT / "drills" / "gameday.yaml")
    assert [d.name for d in plan.drills] == SEVEN_DRILLS
    assert plan.drills[0].experiment.is_file()
    assert plan.lab.replicas >= 2


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("drills: [", "invalid YAML"),
        ("- 1\n- 2\n", "top level"),
        ("drills: []\n", "drills"),
        ("drills:\n  - name: x\n", "drills[0].experiment"),
        ("drills:\n  - name: x\n    experiment: nope.yaml\n", "no such file"),
        ("lab: {engine: gpu}\ndrills:\n  - {name: x, experiment: e.yaml}\n", "lab.engine"),
        ("lab: {replicas: zero}\ndrills:\n  - {name: x, experiment: e.yaml}\n", "lab.replicas"),
        ("lab: {1bad: 2}\ndrills:\n  - {name: x, experiment: e.yaml}\n", "lab.1bad"),
        ("lab: {nodez: 3}\ndrills:\n  - {name: x, experiment: e.yaml}\n", "lab.nodez"),
        ("lab: {replicas: 99}\ndrills:\n  - {name: x, experiment: e.yaml}\n", "lab.replicas"),
        (
            "drills:\n  - {name: x, experiment: e.yaml}\n  - {name: x, experiment: e.yaml}\n",
            "duplicate",
        ),
    ],
)
def test_bad_plans_name_file_and_field(tmp_path: Path, text: str, fragment: str) -> None:
    (tmp_path / "e.yaml").write_text("title: t\n", encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    assert str(plan) in str(err.value)
    assert fragment in str(err.value)


def test_gameday_bad_plan_exits_2_with_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("drills: [", encoding="utf-8")
    proc = cli("gameday", str(plan), "--out", str(tmp_path / "o"), timeout=60, cwd=None)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "invalid YAML" in proc.stderr


def test_gameday_bad_slo_override_exits_2() -> None:
    result = CliRunner().invoke(main, ["gameday", "--slo", "p99_e2e_s=fast", "--dry-run"])
    assert result.exit_code == 2
    assert "not a number" in result.output
    result = CliRunner().invoke(main, ["gameday", "--slo", "nonsense=1", "--dry-run"])
    assert result.exit_code == 2
    assert "unknown SLO threshold" in result.output


def test_gameday_dry_run_touches_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["gameday", "--dry-run", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "oom-kill" in result.output
    assert "rollback: clear-lab-faults" in result.output
    assert not out.exists()


def test_capacity_reproduces_the_worked_example() -> None:
    result = CliRunner().invoke(
        main,
        [
            "capacity",
            "--peak-qps",
            "200",
            "--latency-s",
            "1",
            "--concurrency",
            "20",
            "--redundancy",
            "0.7",
        ],
    )
    assert result.exit_code == 0
    assert result.output.strip().splitlines()[-1] == "15"
    assert "14.29" in result.output or "14.28" in result.output


def test_capacity_rejects_nonsense() -> None:
    result = CliRunner().invoke(
        main, ["capacity", "--peak-qps", "0", "--latency-s", "1", "--concurrency", "20"]
    )
    assert result.exit_code == 2


def _journal(
    before: bool | None, after: bool | None, status: str = "completed", run_ok: bool = True
) -> dict:
    states: dict = {}
    if before is not None:
        states["before"] = {"steady_state_met": before, "probes": []}
    if after is not None:
        states["after"] = {"steady_state_met": after, "probes": []}
    return {
        "status": status,
        "deviated": after is False,
        "steady_states": states,
        "run": [
            {
                "activity": {"name": "act"},
                "status": "succeeded" if run_ok else "failed",
                "exception": ["x\n", "ActivityFailed: boom\n"],
            }
        ],
        "rollbacks": [],
    }


def test_journal_verdicts() -> None:
    assert drill_status(_journal(True, True)) == "passed"
    # chaos run exits 0 here (hypothesis failed before the method), our verdict must not
    assert drill_status(_journal(False, None, status="failed")) == "deviated"
    assert drill_status(_journal(True, False, status="completed")) == "deviated"
    assert drill_status(_journal(True, True, run_ok=False)) == "error"
    assert drill_status(_journal(True, None, status="interrupted")) == "aborted"
    assert hypothesis_results(_journal(True, None)) == {"before": True, "after": None}
    failed = failed_activities(_journal(True, True, run_ok=False))
    assert failed[0]["exception"] == "ActivityFailed: boom"


def test_discover_lists_typed_documented_activities() -> None:
    from chaoslib_infer import discover

    found = discover()
    names = {(a["type"], a["name"]) for a in found["activities"]}
    assert ("action", "oom_kill_replica") in names
    assert ("action", "clear_lab_faults") in names
    assert ("probe", "slo_check") in names
    assert ("probe", "wait_for_replica_serving") in names
    for activity in found["activities"]:
        assert activity["doc"], activity["name"]
    json.dumps(found)


def test_junit_and_manifest(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from chaoslib_infer.evidence.bundle import junit_xml, verify_manifest, write_manifest

    summary = {
        "plan": "p",
        "started_at": "2026-01-01T00:00:00+00:00",
        "drills": [
            {"name": "a", "status": "passed", "figures": {}},
            {"name": "b", "status": "deviated", "figures": {"availability": 0.9}},
            {"name": "c", "status": "aborted", "figures": {}},
        ],
    }
    root = ET.fromstring(junit_xml(summary))
    assert (
        root.attrib["tests"] == "3"
        and root.attrib["failures"] == "1"
        and root.attrib["errors"] == "1"
    )
    cases = {c.attrib["name"]: c for c in root.findall("testcase")}
    assert cases["a"].find("failure") is None
    assert cases["b"].find("failure") is not None
    assert cases["c"].find("error") is not None
    errored = ET.fromstring(junit_xml({"plan": "p", "drills": [], "error": "lab: bad option"}))
    assert errored.attrib["errors"] == "1" and errored.attrib["tests"] == "1"
    assert "lab: bad option" in ET.tostring(errored, encoding="unicode")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("hello")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "sock").write_text("ignored")
    manifest = write_manifest(tmp_path)
    assert "d/x.txt" in manifest.read_text() and "lab/" not in manifest.read_text()
    assert verify_manifest(tmp_path) == []
    (tmp_path / "d" / "x.txt").write_text("tampered")
    assert verify_manifest(tmp_path) == ["d/x.txt"]


# Criterion overrides (issue 21, item 7): an empty value, ``none``, a negative threshold and one
# criterion given twice with different values are refused with one line and exit 2, before
# anything starts; ``off`` stays "not judged"; --dry-run shows the overrides in force.
@pytest.mark.parametrize(
    ("command", "items", "fragments"),
    [
        (("gameday",), ("p99_e2e_s=",), ("p99_e2e_s=''", "empty value")),
        (("gameday",), ("p99_e2e_s=none",), ("p99_e2e_s='none'", "write 'off'")),
        (("gameday",), ("p99_e2e_s=-1",), ("p99_e2e_s='-1'", "negative")),
        (("drill", "run", "oom-kill"), ("restart_s=-0.5",), ("restart_s='-0.5'", "negative")),
        (("gameday",), ("retries=2", "retries=3"), ("retries given twice", "2 and 3")),
        (
            ("drill", "run", "oom-kill"),
            ("oom-kill:restart_s=20", "oom-kill:restart_s=off"),
            ("oom-kill:restart_s given twice", "20 and off"),
        ),
    ],
)
def test_bad_criterion_override_exits_2_with_one_line(
    tmp_path: Path, command: tuple[str, ...], items: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    args = [*command, "--dry-run", "--out", str(tmp_path / "o")]
    for item in items:
        args += ["--criterion", item]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for fragment in fragments:
        assert fragment in result.output


def test_criterion_overrides_in_force_shown_by_dry_run(tmp_path: Path) -> None:
    args = ["gameday", "--dry-run", "--out", str(tmp_path / "o")]
    for item in ("retries=2", "retries=2.0", "oom-kill:restart_s=20", "warmup_ratio=off"):
        args += ["--criterion", item]  # the same value twice is no conflict
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    shown = lines[lines.index("criteria overrides in force (drill: criterion=threshold):") :]
    assert "    oom-kill: restart_s=20" in shown
    assert "    oom-kill: warmup_ratio=off (not judged)" in shown
    assert "    network-jitter: retries=2" in shown
    # each drill's own criteria in force, overrides applied, defaults otherwise
    oom = next(line for line in shown if line.startswith("  oom-kill: oom_kills>=1"))
    assert "restart_s<=20" in oom and "warmup_ratio off" in oom
    assert "  upstream-timeout: hung_requests<=0, max_wait_s<=5" in "\n".join(shown)
    assert lines[-1] == "dry run: nothing was started or changed"
    result = CliRunner().invoke(main, ["gameday", "--dry-run", "--out", str(tmp_path / "o")])
    assert "criteria overrides: none" in result.output
    assert "oom_kills>=1, restart_s<=30, warmup_ratio<=10" in result.output


def test_dry_run_lists_every_common_criterion(tmp_path: Path) -> None:
    from chaoslib_infer.verdict.criteria import COMMON

    result = CliRunner().invoke(main, ["gameday", "--dry-run", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("  every drill also: "))
    shown = line.removeprefix("  every drill also: ").split(", ")
    assert "..." not in line and len(shown) == len(COMMON)
    assert [s.split("<")[0].split(">")[0].split(" ")[0] for s in shown] == [c.name for c in COMMON]
    assert "availability>=0.999" in shown and "retries off" in shown


@pytest.mark.parametrize(
    ("criteria", "fragment"),
    [
        ("    criteria:\n      restart_s: 20\n      restart_s: 21\n", "given twice"),
        ("    criteria: {restart_s: 20, restart_s: 'off'}\n", "20 and off"),
        ("    criteria: {restart_s: off}\n", "criteria.restart_s: a bare off is YAML for false"),
        ("    criteria: {restart_s: -1}\n", "restart_s=-1: negative"),
        ("    criteria: {restart_s: none}\n", "restart_s='none'"),
        ("    criteria: {restart_s: ''}\n", "restart_s='': empty value"),
        ("    criteria:\n      restart_s:\n", "criteria.restart_s: empty value"),
        ("criteria:\n  availability: 0.99\n  availability: 0.9\n", "0.99 and 0.9"),
    ],
)
def test_bad_plan_criteria_refused(tmp_path: Path, criteria: str, fragment: str) -> None:
    plan = tmp_path / "plan.yaml"
    exp = ROOT / "experiments" / "oom-kill.yaml"
    plan.write_text(f"drills:\n  - name: oom-kill\n    experiment: {exp}\n{criteria}")
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    assert str(plan) in str(err.value)
    assert fragment in str(err.value)


def test_plan_criteria_same_value_twice_null_and_off_still_load(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    exp = ROOT / "experiments" / "oom-kill.yaml"
    plan.write_text(
        f"drills:\n  - name: oom-kill\n    experiment: {exp}\n"
        "    criteria: {restart_s: 20, restart_s: 20.0, warmup_ratio: 'off', oom_kills: null}\n"
    )
    spec = load_plan(plan).drills[0]
    assert spec.criteria == {"restart_s": 20.0, "warmup_ratio": "off", "oom_kills": None}
