"""End to end: the upstream-timeout drill (one replica frozen, socket open) against the real lab.

``chaos-infer drill run upstream-timeout`` brings up the default plan's lab (3 sim replicas behind
HAProxy), runs the experiment and takes the lab down. Figures are checked against the lab's own
record: HAProxy's ``show stat`` samples (ejection, sessions stuck on the frozen replica), the
fault ledger and events, and the freezer cgroup. Tolerances: interruption within 0.25 s of an
independent computation; counts exact.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import labutil
import pytest
from labutil import GamedayRun, check_verdict, cli, jsonl, lab_pids, lab_skip_reason, pid_alive

from chaoslib_infer.load.records import read_records
from chaoslib_infer.verdict.blame import strip_blame

ROOT = Path(__file__).resolve().parent.parent


pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(lab_skip_reason() is not None, reason=lab_skip_reason() or ""),
]


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=timeout)


def _interruption(records: list[dict[str, Any]], fault_at: float, settle_s: float = 5.0) -> float:
    """The docs/definitions.md definition, written again: the time out of SLO summed over every
    episode, each from its first failure to the failure followed by ``settle_s`` with at least
    one success and no failed request in flight (one sent before the window's end that failed
    after the failure: a hung request); the next failure opens the next episode."""
    after = [r for r in records if r["end_at"] >= fault_at and not r.get("cut_off")]
    fails = sorted((r["end_at"], r["sent_at"]) for r in after if not r["ok"])
    total, start = 0.0, None
    for i, (f, _) in enumerate(fails):
        start = f if start is None else start
        pending = [e for e, s in fails[i + 1 :] if e > f and s <= f + settle_s]
        if not pending and any(r["ok"] and f < r["end_at"] <= f + settle_s for r in after):
            if i + 1 < len(fails) or max(r["end_at"] for r in after) >= f + settle_s:
                total, start = total + f - start, None
    return total + (fails[-1][0] - start if start is not None else 0.0)


def _limit_s(error: str) -> float:
    m = re.search(r"(\d+(?:\.\d+)?) s", error)
    assert m, error
    return float(m.group(1))


def _after_run_checks(out: Path) -> dict[str, Any]:
    """No active fault, no freezer cgroup, no dead-man timer, no lab process left behind."""
    status = _cli("lab", "status", "--json", "--state-dir", str(out / "lab"))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["active_faults"] == []
    fault = [f for f in jsonl(out / "upstream-timeout" / "faults.jsonl")][-1]
    if fault.get("cgroup") and fault.get("freezer") == 1:
        assert not Path(fault["cgroup"]).exists(), "freezer cgroup left behind"
    deadman = int(fault["deadman_pid"])
    assert not pid_alive(deadman, "chaoslib_infer.lab.freeze deadman"), "dead-man timer left behind"
    lab_dir = str((out / "lab").resolve())
    assert [p for p in lab_pids(out / "lab") if pid_alive(p, lab_dir)] == []
    return fault


def test_upstream_timeout_drill_fails_on_hung_requests_and_figures_match_ground_truth(
    default_gameday: GamedayRun,
) -> None:
    """HAProxy keeps sending to the frozen replica until its health checks eject it (~2 s): those
    requests hang until the client gives up. The gateway does not fail fast, so the drill FAILS
    and says which requests hung and for how long. Read from the session's default game day (the
    plan and lab ``drill run upstream-timeout`` uses)."""
    out, proc = default_gameday.out, default_gameday.proc
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    drill = default_gameday.drill("upstream-timeout")
    assert drill["status"] == "failed", json.dumps(drill, indent=1)[:3000]
    check_verdict(drill)
    assert drill["hypothesis"] == {"before": True, "after": False}  # drill-criteria-hold
    fig, gt = drill["figures"], drill["ground_truth"]
    reasons = drill["reasons"]
    hung_reason = (
        f"requests that hung until the client gave up: {fig['hung_requests']} > 0 (hung_requests)"
    )
    assert hung_reason in [strip_blame(r) for r in reasons], reasons
    # HAProxy kept sending to the frozen replica: the gateway's part, named as such
    assert any(r.startswith(hung_reason + "; BLAME: gateway (") for r in reasons), reasons
    assert any(r.startswith("longest wait of a request in the fault window: ") for r in reasons)
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["ejection_s"]["result"] == "pass"  # it was ejected, just not fast enough
    assert drill["verdict"]["windows"]["after"]["requests"] >= 10  # thawed: P99 judged after
    assert rows["p99_after_vs_baseline"]["value"] is not None, rows["p99_after_vs_baseline"]
    assert rows["health_disagreement_s"]["value"] is not None
    fault = _after_run_checks(out)
    records = read_records(out / "upstream-timeout" / "records.jsonl")
    fault_at, replica = gt["fault_at"], gt["replica"]
    assert gt["mode"] == "freeze" and gt["freezer"] in (1, 2) and gt["fallback_reason"] is None

    # ejection: HAProxy's own state, sampled every ~50 ms by the action
    samples = [
        s for s in jsonl(out / "upstream-timeout" / "upstream-timeout-samples.jsonl")
        if s["source"] == "haproxy"
    ]  # fmt: skip
    assert all(s["servers"][replica]["status"] == "UP" for s in samples if s["t"] < fault_at)
    first_down = next(
        s["t"] for s in samples if s["t"] >= fault_at and s["servers"][replica]["status"] != "UP"
        and not s["servers"][replica]["status"].startswith("UP")
    )  # fmt: skip
    assert gt["ejected_at"] == first_down
    assert fig["ejection_s"] == pytest.approx(first_down - fault_at, abs=1e-9)
    assert 1.0 <= fig["ejection_s"] <= 4.5  # inter 500ms, fall 2, timeout check 1s
    gaps = [b["t"] - a["t"] for a, b in zip(samples, samples[1:], strict=False)]
    assert max(gaps) < 0.5, "show stat sampling stalled"
    # nothing new reached the frozen replica once ejected: its sessions only stay or drop
    after = [s["servers"][replica]["scur"] for s in samples if s["t"] >= first_down]
    assert all(b <= a for a, b in zip(after, after[1:], strict=False))

    # hung requests: waited on the frozen replica until the *client* gave up
    hung = [
        r for r in records
        if not r["ok"] and r["end_at"] >= fault_at and r["error_class"].startswith("timeout_")
    ]  # fmt: skip
    assert fig["hung_requests"] == len(hung) == gt["hung_sessions"] >= 1
    assert fig["fails_fast"] is False
    for r in hung:
        assert r["sent_at"] < gt["ejected_at"] + 0.1  # dispatched before the ejection
        limit = _limit_s(r["error"])
        if r["error_class"] == "timeout_idle":
            last = max([r["first_token_at"] or r["sent_at"], *r["chunk_times"]])
            assert r["end_at"] - last >= limit - 0.05
        else:
            assert r["end_at"] - r["sent_at"] >= limit - 0.05
    assert fig["hung_request_max_s"] == pytest.approx(
        max(r["end_at"] - r["sent_at"] for r in hung), abs=1e-9
    )
    failed_after = sorted(r["end_at"] for r in records if not r["ok"] and r["end_at"] >= fault_at)
    assert fig["time_to_first_error_s"] == pytest.approx(failed_after[0] - fault_at, abs=1e-9)
    # no failure is visible before the client's shortest timeout: the gateway never failed fast
    assert fig["time_to_first_error_s"] >= min(_limit_s(r["error"]) for r in hung) - 0.05
    assert abs(fig["interruption_s"] - _interruption(records, fault_at)) <= 0.25
    # every hung request is inside the interruption: none "settled" while others were pending
    assert fig["failed_requests"] >= len(hung)
    assert fig["interruption_s"] >= max(r["end_at"] for r in hung) - min(r["end_at"] for r in hung)

    # the survivors carried everything sent after the ejection, while r0 stayed frozen
    later = [r for r in records if gt["ejected_at"] + 0.1 <= r["sent_at"] < gt["held_until"]]
    assert len(later) >= 40 and all(r["ok"] for r in later)
    assert {r["replica"] for r in later} <= set(fault["survivors"])
    assert fig["survivor_running_max"] >= 1 and fig["hung_sessions_max"] >= gt["hung_sessions"]
    # the rollback thawed it: the lab's 'fault cleared' event after the hold
    assert gt["thawed_at"] is not None and gt["held_until"] <= gt["thawed_at"]
    assert (out / "upstream-timeout" / "evidence.md").stat().st_size > 0


def test_upstream_timeout_drill_deviates_with_a_single_replica(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _cli(
        "drill", "run", "upstream-timeout", "--replicas", "1", "--out", str(out),
        "--verdict-policy", "strict",  # the zero-loss rule: the fault window's requests lost
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    drill = json.loads((out / "summary.json").read_text())["drills"][0]
    assert drill["status"] == "failed"
    check_verdict(drill)
    assert drill["hypothesis"] == {"before": True, "after": False}
    assert any("(availability_fault)" in r for r in drill["reasons"]), drill["reasons"]
    journal = json.loads((out / "upstream-timeout" / "journal.json").read_text())
    after = {
        p["activity"]["name"]: p["output"] for p in journal["steady_states"]["after"]["probes"]
    }
    assert after["availability-meets-slo"]["passed"] is False
    assert [r["status"] for r in journal["rollbacks"]] == ["succeeded", "succeeded"]
    fig, gt = drill["figures"], drill["ground_truth"]
    assert gt["ejected_at"] is not None  # nothing left to route to: HAProxy answers 503 at once
    records = read_records(out / "upstream-timeout" / "records.jsonl")
    nosrv = [
        r for r in records
        if gt["ejected_at"] + 0.1 <= r["sent_at"] < gt["held_until"] and not r["ok"]
    ]  # fmt: skip
    assert nosrv and all(r["status"] == 503 for r in nosrv)
    assert fig["failed_requests"] >= len(nosrv) > 0
    _after_run_checks(out)


def test_sigint_during_the_freeze_thaws_and_takes_the_lab_down(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaoslib_infer.cli", "drill", "run", "upstream-timeout",
         "--replicas", "2", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    with labutil.killed_at_exit(proc):
        deadline = time.monotonic() + 120
        seen = labutil.read_until(proc, "injecting the fault", 120)
        assert "injecting the fault" in seen, seen
        faults = out / "upstream-timeout" / "faults.jsonl"
        while time.monotonic() < deadline and not faults.exists():
            time.sleep(0.05)
        time.sleep(1.0)  # frozen now
        injected = jsonl(faults)[-1]
        assert injected["phase"] == "injected"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    journal = json.loads((out / "upstream-timeout" / "journal.json").read_text())
    assert journal["status"] == "interrupted"
    assert [r["activity"]["name"] for r in journal["rollbacks"]] == [
        "thaw-frozen-replica",
        "clear-lab-faults",
    ]
    assert any("thawed" in n for n in journal["rollbacks"][0]["output"])
    events = jsonl(out / "lab" / "events.jsonl")
    cleared = [
        e for e in events
        if e.get("event") == "fault" and e.get("fault_id") == injected["fault_id"]
        and e.get("phase") == "cleared"
    ]  # fmt: skip
    assert cleared and cleared[0]["t"] > injected["fault_at"]
    _after_run_checks(out)
