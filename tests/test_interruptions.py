"""Interruption matrix (docs/safety.md section 9): every drill, interrupted four ways, leaves no fault.

For each of the seven drills, ``chaos-infer drill run NAME --out DIR`` (a subprocess, its own lab)
is interrupted once its fault is in place, in four ways:

- ``sigint`` / ``sigterm``: the signal is sent to the runner once the fault is recorded in the lab's
  ledger (``faults.json``) and has had a moment to act; expected: exit 130, the drill ``aborted``
  in ``summary.json``, the rollbacks played (``journal.json``), the lab taken down by the runner.
- ``exception``: ``tests/_raise_after.py`` makes a function of the drill's action raise
  ``RuntimeError("injected failure")`` right after it did its real work (the fault is in the
  ledger at that instant, checked); expected: exit 1, the drill ``error``, the rollbacks played.
- ``sigkill``: the runner is SIGKILLed once the fault is in place; its orphaned load generator is
  killed; the ledger must still hold the fault; ``chaos-infer rollback --state-dir DIR/lab`` undoes
  it; ``chaos-infer lab status --json`` then lists no active fault; ``chaos-infer lab down``.

In every case the lab ends with no fault: ``faults.json`` empty, every fault the lab recorded as
``injected`` (``events.jsonl``) has a matching ``cleared``/``expired`` event, and no process of the
run (lab programs, engines, load generator, memory hog, jitter shim, node controller, dead-man
timers), network namespace or cgroup (memory, freezer) of the lab is left.

To fit the matrix in ~10 minutes on two cores, the drills run on a copy of the default plan and
experiments whose only change is a 2 s load warm-up instead of 8 s (the faults are identical).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from labutil import BackgroundRun, cli, plan_copy
from labutil import pid_alive as _alive

ROOT = Path(__file__).resolve().parent.parent
RAISE_AFTER = Path(__file__).resolve().parent / "_raise_after.py"

WARMUP_S = 2.0
INJECTING = "method: injecting the fault..."
#: seconds from SIGINT/SIGTERM to the first rollback (an activity's ``pauses.after`` is 10-20 s)
MAX_ROLLBACK_DELAY_S = 3.0
SHORT_HOLD_S = 4
#: traffic-spike's first (baseline) phase: this much longer than SHORT_HOLD_S
BASELINE_HEADROOM_S = 6


@dataclass(frozen=True)
class DrillCase:
    """How to interrupt one drill.

    Attributes:
        ledger_kind: ``kind`` of the lab ledger record that shows the fault is in place.
        delay_s: seconds between that record appearing and the signal (the fault acts meanwhile;
            shorter where the action forgets the record by itself soon after: the memory hog is
            removed once the kernel killed the engine, a restart record once every restarted
            replica serves again).
        raise_after: ``MODULE:QUALNAME`` that raises right after its real call (case
            ``exception``): the drill's action itself where its fault stays in place after it
            returns, else the lab function that puts the fault in place.
        persists: the fault stays active until something undoes it (so ``lab status`` lists it
            after the runner was SIGKILLed); False where it ends by itself (the hog exits once
            the kernel killed the engine; supervisord respawns killed replicas).
    """

    ledger_kind: str
    delay_s: float
    raise_after: str
    persists: bool = True


DRILLS: dict[str, DrillCase] = {
    "node-loss": DrillCase("node-loss", 1.5, "chaoslib_infer.drills.node_loss.actions:lose_node"),
    # the hog is in the ledger from its start until the kernel killed the engine (~1 s)
    "oom-kill": DrillCase("oom-kill", 0.3, "chaoslib_infer.lab.fleet:Lab.fault_event", False),
    "network-jitter": DrillCase(
        "network-jitter", 1.5, "chaoslib_infer.drills.network_jitter.actions:inject_network_jitter"
    ),
    "traffic-spike": DrillCase(
        "traffic-spike", 1.5, "chaoslib_infer.drills.traffic_spike.actions:inject_traffic_spike"
    ),
    "upstream-timeout": DrillCase(
        "upstream-timeout", 1.5, "chaoslib_infer.lab.freeze:freeze_replica"
    ),
    # the record lives until every restarted replica serves again (>= the 1 s engine load delay)
    "simultaneous-restarts": DrillCase(
        "simultaneous-restarts", 0.3, "chaoslib_infer.lab.restarts:restart", False
    ),
    "quota-cut": DrillCase(
        "quota-cut", 1.5, "chaoslib_infer.drills.quota_cut.actions:cut_replica_quota"
    ),
}
INTERRUPTIONS = ["sigint", "sigterm", "exception", "sigkill"]
HELPER_PID_KEYS = ("pid", "hog_pid", "shim_pid", "deadman_pid", "controller_pid", "watchdog_pid")


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------
def _shorten_holds(exp: dict[str, Any]) -> None:
    """Holds of a few seconds instead of the drills' 10-20 s: every case interrupts the fault
    0.3-1.5 s after it is in place, and the ``exception`` case spends its time in what follows
    the action that raised (the drill goes on to its pauses, waits and after-hypothesis)."""
    for activity in exp["method"]:
        pauses = activity.get("pauses") or {}
        if "after" in pauses:
            pauses["after"] = min(pauses["after"], SHORT_HOLD_S)
        args = activity["provider"].get("arguments") or {}
        if isinstance(args.get("duration_s"), int | float):
            args["duration_s"] = min(args["duration_s"], SHORT_HOLD_S + 2)
    cfg = exp["configuration"]
    for key in ("hold_s", "spike_settle_s"):
        if isinstance(cfg.get(key), int | float):
            cfg[key] = min(cfg[key], SHORT_HOLD_S + 2)
    if cfg.get("load_profile"):  # baseline, spike, baseline: same rates, shorter phases; the
        # first outlasts the warm-up and the before-hypothesis (2.5 s in a rehearsal: 4.5 s in
        # all, past a 4 s phase, and the spike began before the method could record it)
        cfg["load_profile"] = [
            [SHORT_HOLD_S + (BASELINE_HEADROOM_S if i == 0 else 0), rate]
            for i, (_, rate) in enumerate(cfg["load_profile"])
        ]


@pytest.fixture(scope="module")
def light_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A copy of drills/gameday.yaml and experiments/ with a 2 s load warm-up, short holds
    (:func:`_shorten_holds`) and no load past the rollbacks; returns the env."""

    def edit(name: str, exp: dict[str, Any]) -> None:
        control = next(c for c in exp["controls"] if c["name"] == "background-load")
        control["provider"]["arguments"]["warmup_s"] = WARMUP_S
        # no load after the rollbacks: these cases judge the rollbacks and the residue, not the
        # after window (the ``exception`` cases ran the drill to its end: 6-10 s each)
        control["provider"]["arguments"]["observe_after_s"] = 0
        _shorten_holds(exp)

    env = plan_copy(tmp_path_factory.mktemp("plan"), edit)
    plan = yaml.safe_load(Path(env["CHAOS_INFER_PLAN"]).read_text())
    assert {d["name"] for d in plan["drills"]} == set(DRILLS)
    return env


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=timeout, env=env)


class Runner(BackgroundRun):
    """A ``drill run`` subprocess whose output is read by a thread (so it never blocks);
    ``injecting`` is set once it says the method started."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.injecting = threading.Event()
        super().__init__(argv, {**os.environ, **env})

    def on_line(self, line: str) -> None:
        if INJECTING in line:
            self.injecting.set()


def _ledger(lab_dir: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((lab_dir / "faults.json").read_text())
    except (OSError, ValueError):  # absent, or (never) mid-rename
        return []
    return [r for r in data if isinstance(r, dict)]


def _wait_for_fault(runner: Runner, lab_dir: Path, kind: str) -> dict[str, Any]:
    """Wait for the method to start, then for a ledger record of ``kind``; return it."""
    deadline = time.monotonic() + 90
    while not runner.injecting.wait(0.1):
        assert runner.proc.poll() is None and time.monotonic() < deadline, (
            f"the method never started:\n{runner.output[-4000:]}"
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [r for r in _ledger(lab_dir) if r.get("kind") == kind]
        if found:
            return found[0]
        assert runner.proc.poll() is None, f"runner exited early:\n{runner.output[-4000:]}"
        time.sleep(0.01)
    pytest.fail(f"no {kind} record in {lab_dir / 'faults.json'}:\n{runner.output[-4000:]}")


def _record_id(record: dict[str, Any]) -> Any:
    return record.get("id") or record.get("pid")


def _still_in_place(lab_dir: Path, record: dict[str, Any]) -> bool:
    """The record is still in the ledger (and, for a memory hog, the hog still runs)."""
    if not any(_record_id(r) == _record_id(record) for r in _ledger(lab_dir)):
        return False
    if record.get("kind") == "oom-kill":
        return _alive(int(record["pid"]))
    return True


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _our_processes(needles: list[str]) -> dict[int, str]:
    """Live processes (not zombies) whose command line names any of ``needles``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        cmd = _cmdline(int(entry.name))
        if cmd and any(n in cmd for n in needles) and _alive(int(entry.name)):
            found[int(entry.name)] = cmd
    return found


def _kill_load_generator(out: Path) -> int:
    """SIGKILL the load generator the killed runner left behind (found by its ``--out``)."""
    gens = {
        pid: cmd
        for pid, cmd in _our_processes([f"{out}/"]).items()
        if "chaoslib_infer.load " in cmd and f"--out {out}/" in cmd
    }
    for pid in gens:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in gens) and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(gens)


def _events(lab_dir: Path) -> list[dict[str, Any]]:
    path = lab_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _unmatched_injections(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``fault`` events ``injected`` without a later ``cleared``/``expired`` for the same fault
    (same ``fault_id``; memory hogs, recorded without an id, by ``hog_pid``)."""
    ended: set[tuple[str, Any]] = set()
    for ev in events:
        if ev.get("event") == "fault" and ev.get("phase") in ("cleared", "expired"):
            if ev.get("fault_id"):
                ended.add(("id", ev["fault_id"]))
            if ev.get("hog_pid"):
                ended.add(("hog", ev["hog_pid"]))
    missing = []
    for ev in events:
        if ev.get("event") != "fault" or ev.get("phase") != "injected":
            continue
        key = ("id", ev["fault_id"]) if ev.get("fault_id") else ("hog", ev.get("hog_pid"))
        if key not in ended:
            missing.append(ev)
    return missing


def _lab_leftovers(out: Path, lab_id: str, helper_pids: set[int]) -> list[str]:
    """Everything of this run still alive: processes, network namespaces, cgroups."""
    lab_dir = out / "lab"
    procs = _our_processes([f"{out}/", f"chaos-infer-{lab_id}"])
    event_pids = {int(e["pid"]) for e in _events(lab_dir) if isinstance(e.get("pid"), int)}
    meta_pids: set[int] = set()
    try:
        pids = json.loads((lab_dir / "lab.json").read_text()).get("pids") or {}
        meta_pids = {int(p) for k, p in pids.items() if k != "replicas" and p}
        meta_pids |= {int(p) for p in (pids.get("replicas") or {}).values() if p}
    except (OSError, ValueError):
        pass
    for pid in event_pids | meta_pids | helper_pids:
        # a recorded pid still running something of this run (pids get reused: check cmdline)
        cmd = _cmdline(pid)
        if pid not in procs and _alive(pid) and (str(lab_dir) in cmd or lab_id in cmd):
            procs[pid] = cmd
    left = [f"process {pid}: {cmd[:160]}" for pid, cmd in sorted(procs.items())]
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"netns {line.split()[0]}" for line in ns.splitlines() if lab_id in line]
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        for d in dirnames:
            if lab_id in d:
                left.append(f"cgroup {dirpath}/{d}")
        dirnames[:] = [d for d in dirnames if lab_id not in d]
    return left


def _helper_pids(records: list[dict[str, Any]]) -> set[int]:
    pids: set[int] = set()
    for r in records:
        for key in HELPER_PID_KEYS:
            if isinstance(r.get(key), int) and r[key] > 0:
                pids.add(int(r[key]))
    return pids


@pytest.fixture
def reap(tmp_path: Path) -> Iterator[None]:
    """Whatever happens, leave no process of this test's run behind (the lab itself is taken
    down by conftest's fixture; this catches an orphaned load generator or fault helper)."""
    yield
    for pid in _our_processes([f"{tmp_path}/"]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.lab
@pytest.mark.parametrize("how", INTERRUPTIONS)
@pytest.mark.parametrize("drill", list(DRILLS))
def test_interrupted_drill_leaves_no_fault(
    drill: str, how: str, tmp_path: Path, light_plan: dict[str, str], reap: None
) -> None:
    case = DRILLS[drill]
    out = tmp_path / "out"
    lab_dir = out / "lab"
    cli_args = ["drill", "run", drill, "--out", str(out)]
    if how == "exception":
        argv = [sys.executable, str(RAISE_AFTER), case.raise_after, *cli_args]
    else:
        argv = [sys.executable, "-m", "chaoslib_infer.cli", *cli_args]
    t0 = time.monotonic()
    runner = Runner(argv, light_plan)
    seen: list[dict[str, Any]] = []
    try:
        if how != "exception":
            record = _wait_for_fault(runner, lab_dir, case.ledger_kind)
            time.sleep(case.delay_s)
            seen = _ledger(lab_dir)
            assert _still_in_place(lab_dir, record), (
                f"the {case.ledger_kind} fault was gone {case.delay_s} s after it was recorded; "
                f"ledger now: {seen}\n{runner.output[-3000:]}"
            )
            sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
            runner.proc.send_signal(sig[how])
            signalled_at = time.time()
        code = runner.wait(timeout=150)
    finally:
        runner.kill()
    output = runner.output
    lab_id = json.loads((lab_dir / "lab.json").read_text())["lab_id"]

    if how == "sigkill":
        assert code == -signal.SIGKILL
        assert _kill_load_generator(out) == 1, "no orphaned load generator found"
        # the ledger survived the runner: the fault is still recorded
        pending = _ledger(lab_dir)
        assert any(_record_id(r) == _record_id(record) for r in pending), pending
        if case.persists:  # still in place: the rollback, not a timer, is what undoes it
            before = _cli("lab", "status", "--json", "--state-dir", str(lab_dir), env=light_plan)
            active = json.loads(before.stdout)["active_faults"]
            assert [_record_id(r) for r in active] == [_record_id(record)], before.stdout
        rb = _cli("rollback", "--state-dir", str(lab_dir), env=light_plan)
        assert rb.returncode == 0, rb.stdout + rb.stderr
        assert "undone" in rb.stdout or "nothing left to undo" in rb.stdout, rb.stdout
        status = _cli("lab", "status", "--json", "--state-dir", str(lab_dir), env=light_plan)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["active_faults"] == [], status.stdout
        down = _cli("lab", "down", "--state-dir", str(lab_dir), env=light_plan)
        assert down.returncode == 0, down.stdout + down.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["complete"] is False
        assert summary["in_progress"]["drill"] == drill
    else:
        # a crashed action: the tool failed, the drill is "error" (exit 2, docs/definitions.md)
        assert code == (2 if how == "exception" else 130), output[-4000:]
        summary = json.loads((out / "summary.json").read_text())
        journal = json.loads((out / drill / "journal.json").read_text())
        entry = summary["drills"][0]
        if how == "exception":
            assert entry["status"] == "error", json.dumps(entry)[:3000]
            m = re.search(r"raise_after: \S+ raised; ledger kinds: \[(.*)\]", output)
            assert m, output[-4000:]
            assert repr(case.ledger_kind) in m.group(1), m.group(0)  # the fault was in place
            failed = [r for r in journal["run"] if r.get("status") == "failed"]
            assert failed and "injected failure" in json.dumps(failed[0].get("exception")), (
                json.dumps(journal["run"])[:3000]
            )
        else:
            assert entry["status"] == "aborted", json.dumps(entry)[:3000]
            assert journal["status"] == "interrupted"
            # the rollbacks start at once, not after the cut-off activity's pause
            started = dt.datetime.fromisoformat(journal["rollbacks"][0]["start"]).timestamp()
            assert started - signalled_at < MAX_ROLLBACK_DELAY_S, started - signalled_at
        names = [r["activity"]["name"] for r in journal["rollbacks"]]
        expected = [
            rb["name"]
            for rb in yaml.safe_load(
                Path(light_plan["CHAOS_INFER_EXPERIMENTS"], f"{drill}.yaml").read_text()
            )["rollbacks"]
        ]
        assert names == expected, json.dumps(journal["rollbacks"])[:3000]
        assert all(r.get("status") == "succeeded" for r in journal["rollbacks"]), json.dumps(
            journal["rollbacks"]
        )[:3000]
        assert "lab: taking down" in output

    # the lab ends with no fault, whoever undid it
    assert _ledger(lab_dir) == []
    events = _events(lab_dir)
    assert any(
        e.get("event") == "fault"
        and e.get("phase") == "injected"
        and e.get("kind") == case.ledger_kind
        for e in events
    ), "the fault was never injected"
    assert _unmatched_injections(events) == []
    assert _lab_leftovers(out, lab_id, _helper_pids(seen)) == []
    print(f"{drill} {how}: exit {code}, {time.monotonic() - t0:.1f} s")


def test_a_crashed_action_is_an_error_even_when_the_after_hypothesis_fails() -> None:
    """The verdict of case ``exception``: an action that raised something other than
    ``ActivityFailed`` (a bug) makes the drill ``error``, whatever the after-hypothesis saw; an
    action's documented failure (``ActivityFailed``) leaves the verdict to the hypothesis."""
    from chaoslib_infer.evidence.journal import drill_status

    def journal(raised: str, activity_type: str = "action") -> dict[str, Any]:
        return {
            "status": "completed",
            "deviated": True,
            "steady_states": {
                "before": {"steady_state_met": True, "probes": []},
                "after": {"steady_state_met": False, "probes": []},
            },
            "run": [
                {
                    "activity": {"name": "act", "type": activity_type},
                    "status": "failed",
                    "exception": [
                        "Traceback ...\n",
                        f"chaoslib.exceptions.ActivityFailed: {raised}\n",
                    ],
                }
            ],
            "rollbacks": [],
        }

    assert drill_status(journal("RuntimeError: injected failure")) == "error"
    assert drill_status(journal("chaoslib_infer.lab.fleet.LabError: no lab")) == "error"
    assert drill_status(journal("chaoslib.exceptions.ActivityFailed: timed out")) == "deviated"
    assert drill_status(journal("RuntimeError: boom", activity_type="probe")) == "deviated"
    before_failed = journal("RuntimeError: boom")
    before_failed["steady_states"]["before"]["steady_state_met"] = False
    assert drill_status(before_failed) == "deviated"
