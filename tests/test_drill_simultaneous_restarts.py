"""End to end: the simultaneous-restarts drill against the real lab.

``chaos-infer drill run simultaneous-restarts`` with a plan whose lab (3 sim replicas) runs the
retrying gateway (``gateway_retry: true``: HAProxy retries refused / 503 requests elsewhere), so
the survivor can carry the restart period; with ``restart_k: all`` nothing can, and the drill
deviates. Figures are checked against the lab's ground truth (events.jsonl, the engine ledger) and
recomputed from the records: shares and counts exact, interruption within 0.25 s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import labutil
import pytest
from labutil import check_verdict, cli, jsonl, lab_pids, lab_skip_reason, pid_alive

from chaoslib_infer.load.records import read_records

ROOT = Path(__file__).resolve().parent.parent
DRILL = "simultaneous-restarts"


pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(lab_skip_reason() is not None, reason=lab_skip_reason() or ""),
]


def _run_drill(
    tmp_path: Path, drill_vars: dict[str, Any], policy: str = "default"
) -> tuple[int, Path, str]:
    """``chaos-infer drill run`` with a plan of our own (``$CHAOS_INFER_PLAN``), under the
    verdict ``policy``."""
    plan = {
        "name": "restarts-test",
        "lab": {"replicas": 3, "engine": "sim", "memory_limit_mb": 512, "gateway_retry": True},
        "verdict_policy": policy,
        "drills": [
            {"name": DRILL, "experiment": f"../experiments/{DRILL}.yaml", "vars": drill_vars}
        ],
    }
    out = tmp_path / "out"
    proc = labutil.drill_run(DRILL, out, labutil.write_plan(tmp_path, plan), timeout=240)
    return proc.returncode, out, proc.stdout[-3000:] + proc.stderr[-3000:]


def _interruption(records: list[dict[str, Any]], fault_at: float, settle_s: float = 5.0) -> float:
    """The docs/definitions.md definition, written again (see test_drill_upstream_timeout): the
    time out of SLO summed over every episode, each closed by a failure followed by ``settle_s``
    holding a success and no later failure."""
    ends = sorted(
        (r["end_at"], bool(r["ok"]))
        for r in records
        if r["end_at"] >= fault_at and not r.get("cut_off")  # cut off at the stop: not a failure
    )
    fails = [t for t, ok in ends if not ok]
    total, start = 0.0, None
    for i, f in enumerate(fails):
        start = f if start is None else start
        nxt = fails[i + 1] if i + 1 < len(fails) else math.inf
        if nxt > f + settle_s and any(ok and f < t <= f + settle_s for t, ok in ends):
            total, start = total + f - start, None
    return total + (fails[-1] - start if start is not None else 0.0)


def _check_restarts(out: Path, gt: dict[str, Any], targets: list[str]) -> list[dict[str, Any]]:
    """Ground truth against events.jsonl and the engine ledger; returns the events."""
    events = jsonl(out / "lab" / "events.jsonl")
    ledger = jsonl(out / "lab" / "ledger.jsonl")
    fault_at = gt["fault_at"]
    assert sorted(gt["restarts"]) == targets
    for name, row in gt["restarts"].items():
        exits = [
            e for e in events
            if e["event"] == "exit" and e["replica"] == name
            and fault_at - 1 <= e["t"] <= gt["all_serving_at"]  # not the lab's own shutdown
        ]  # fmt: skip
        assert len(exits) == 1 and exits[0]["cause"] == "signal:SIGKILL", exits
        assert (
            row["died_at"] == exits[0]["t"] and fault_at - 0.01 <= row["died_at"] <= fault_at + 0.5
        )
        start = next(
            e for e in events
            if e["event"] == "start" and e["replica"] == name and e["t"] >= row["died_at"]
        )  # fmt: skip
        assert row["new_pid"] == start["pid"] != exits[0]["pid"]
        assert row["started_at"] <= row["ready_at"] <= row["serving_again_at"]
        first_gen = min(g["t"] for g in ledger if g["replica"] == name and g["t"] > row["died_at"])
        assert abs(row["serving_again_at"] - first_gen) <= 0.05
        assert row["restart_s"] == pytest.approx(row["serving_again_at"] - row["died_at"])
    died = [row["died_at"] for row in gt["restarts"].values()]
    assert max(died) - min(died) <= 0.1, "the restarts were not simultaneous"
    for name in gt["survivors"]:
        assert not [e for e in events if e["replica"] == name and e["event"] in ("exit", "start")
                    and fault_at - 1 <= e["t"] <= gt["all_serving_at"]]  # fmt: skip
    assert gt["all_serving_at"] == max(r["serving_again_at"] for r in gt["restarts"].values())
    return events


def _after_run_checks(out: Path) -> None:
    status = cli("lab", "status", "--json", "--state-dir", str(out / "lab"), timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["active_faults"] == []
    pids = lab_pids(out / "lab")
    assert [p for p in pids if pid_alive(p, str((out / "lab").resolve()))] == []


def test_restarts_with_a_survivor_judged_and_figures_match_ground_truth(tmp_path: Path) -> None:
    """The survivor carries the restart period; requests already in flight on a killed replica
    (if any) are lost: under the default policy they cost error budget (judged by its share)
    and are counted on the fault-window row, not judged one by one."""
    code, out, tail = _run_drill(tmp_path, {})
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    check_verdict(drill)
    assert code == (0 if drill["status"] == "passed" else 1), tail
    assert drill["hypothesis"]["before"] is True
    fig, gt = drill["figures"], drill["ground_truth"]
    assert gt["replicas"] == ["r0", "r1"] and gt["survivors"] == ["r2"] and gt["method"] == "kill"
    _check_restarts(out, gt, ["r0", "r1"])
    fault_at, end = gt["fault_at"], gt["all_serving_at"]
    assert fig["all_serving_s"] == pytest.approx(end - fault_at, abs=1e-9)
    assert 0.5 <= fig["all_serving_s"] <= 10.0  # 1 s engine load delay + health checks
    assert abs(fig["all_serving_s_client"] - fig["all_serving_s"]) <= 0.5

    records = read_records(out / DRILL / "records.jsonl")
    window = [r for r in records if fault_at <= r["sent_at"] < end]
    survivor = [r for r in window if r["replica"] == "r2"]
    assert fig["window_requests"] == len(window) >= 5
    assert fig["survivor_requests"] == len(survivor)
    assert fig["survivor_share_ratio"] == len(survivor) / len(window)
    assert fig["survivor_share_ratio"] >= 0.5  # the survivor carried the restart period
    # a request already on its way to a killed replica at the kill instant may be cut too (the
    # gateway has not seen the death yet); nothing sent later fails
    late = [r for r in window if not r["ok"]]
    assert fig["window_failed"] == len(late)
    assert all(r["sent_at"] < fault_at + 0.1 for r in late), late
    # the only failures: requests already in flight on a killed replica
    # (attempts still on the wire when the load stopped are recorded as cut off: not lost)
    lost = [r for r in records if not r["ok"] and r["end_at"] >= fault_at and not r.get("cut_off")]
    assert all(r["sent_at"] < fault_at + 0.1 for r in lost), lost
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["availability_fault"]["result"] == "not judged"
    assert rows["availability_fault"]["note"].startswith("not judged under policy default: ")
    assert (rows["budget_cost_s"]["value"] > 0) == bool(lost)
    assert rows["budget_share"]["result"] == "pass"  # a few lost streams cost little
    assert rows["all_serving_s"]["result"] == "pass"
    assert rows["max_survivor_share"]["result"] == "n/a"  # one survivor must carry everything
    assert abs(fig["interruption_s"] - _interruption(records, fault_at)) <= 0.25

    for name, row in gt["restarts"].items():
        mine = sorted(
            (r for r in records if r["ok"] and r["replica"] == name
             and r["sent_at"] >= row["ready_at"] and r["first_token_at"] is not None),
            key=lambda r: r["first_byte_at"],
        )[:3]  # fmt: skip
        warm = fig["warmup"][name]
        assert warm["n"] == len(mine) == 3
        assert warm["ttfts_s"] == pytest.approx([r["first_token_at"] - r["sent_at"] for r in mine])
    assert fig["survivor_running_max"] >= 1 and fig["survivor_scur_max"] >= 1
    assert fig["queue_max"] is not None
    _after_run_checks(out)


def test_restarting_every_replica_deviates(tmp_path: Path) -> None:
    # the zero-loss rule (strict): the outage of every replica at once loses requests
    code, out, tail = _run_drill(tmp_path, {"restart_k": "all"}, policy="strict")
    assert code == 1, tail
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert drill["status"] == "failed"
    check_verdict(drill)
    assert drill["hypothesis"] == {"before": True, "after": False}
    assert any("(availability_fault)" in r for r in drill["reasons"]), drill["reasons"]
    fig, gt = drill["figures"], drill["ground_truth"]
    assert gt["replicas"] == ["r0", "r1", "r2"] and gt["survivors"] == []
    _check_restarts(out, gt, ["r0", "r1", "r2"])
    records = read_records(out / DRILL / "records.jsonl")
    fault_at, end = gt["fault_at"], gt["all_serving_at"]
    window = [r for r in records if fault_at <= r["sent_at"] < end]
    failed = [r for r in window if not r["ok"]]
    assert fig["survivor_share_ratio"] is None and fig["survivor_requests"] == 0
    assert fig["window_requests"] == len(window)
    assert fig["window_failed"] == len(failed) >= 3
    # requests sent once every replica was dead: HAProxy has nothing left to route to (503);
    # a request already on its way to a replica at the kill instant may be cut (reset) instead
    last_death = max(row["died_at"] for row in gt["restarts"].values())
    assert all(r["status"] == 503 for r in failed if r["sent_at"] > last_death + 0.05)
    assert all(r["status"] == 503 or r["error_class"] == "reset" for r in failed)
    assert abs(fig["interruption_s"] - _interruption(records, fault_at)) <= 0.25
    journal = json.loads((out / DRILL / "journal.json").read_text())
    assert [r["status"] for r in journal["rollbacks"]] == ["succeeded"]
    _after_run_checks(out)
