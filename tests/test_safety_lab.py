"""Safety end to end against the real lab: a runner killed with SIGKILL, the lab's dead-man
watchdog, the rollback ledger, stop conditions, secrets.

Each test runs ``chaos-infer`` (or ``chaos run``) as a subprocess with a small experiment written
here (faults from :mod:`chaoslib_infer.lab.testfault` and, where it exists, the real cgroup
freeze of :mod:`chaoslib_infer.lab.freeze`) and checks the lab's own ground truth: ``faults.json``
(the ledger), ``events.jsonl`` (``expired``/``cleared`` fault events), the processes' states.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from labutil import WAIT_SLACK, BackgroundRun, background_load_control, cli, echo_key_probe

from chaoslib_infer.lab.fleet import Lab

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.lab]
HAS_FREEZE = importlib.util.find_spec("chaoslib_infer.activities.upstream") is not None
KEY = "sk-fake-9c1d2e3f4a5b6c7d8e9f"


# ---- helpers --------------------------------------------------------------------------------
def _cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=timeout, env=env)


class Runner(BackgroundRun):
    """``chaos-infer gameday`` in the background; stdout lines collected by a thread."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "chaoslib_infer.cli", "gameday", *args]
        super().__init__(argv, {**os.environ, **(env or {})})

    def wait(self, timeout: float = 180) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.wait(10)


def _wait_for(
    pred: Callable[[], Any], timeout_s: float, what: str, runner: Runner | None = None
) -> Any:
    timeout_s *= WAIT_SLACK
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if runner is not None and runner.proc.poll() is not None:
            raise AssertionError(
                f"runner exited ({runner.proc.returncode}) before {what}:\n{runner.output[-3000:]}"
            )
        time.sleep(0.05)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}"
        + (f"\n{runner.output[-3000:]}" if runner else "")
    )


def _ledger(lab_dir: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads((lab_dir / "faults.json").read_text()))
    except (OSError, ValueError):
        return []


def _events(lab_dir: Path) -> list[dict[str, Any]]:
    out = []
    for line in (lab_dir / "events.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if _state(p) not in (None, "Z", "X")]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _lab_pids(lab_dir: Path) -> list[int]:
    pids = [int(e["pid"]) for e in _events(lab_dir) if e.get("pid")]
    meta = json.loads((lab_dir / "lab.json").read_text())
    pids += [int(p) for k, p in meta.get("pids", {}).items() if isinstance(p, int)]
    return pids


def _kill_orphan_load(drill_dir: Path) -> None:
    """The load generator of a SIGKILLed runner (its own session) is ours to stop."""
    try:
        pid = int((drill_dir / "load.pid").read_text())
    except (OSError, ValueError):
        return
    if "chaoslib_infer.load" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
        os.kill(pid, signal.SIGKILL)


def _kill_at_ledger(runner: Runner, lab_dir: Path, n: int, what: str, drill_dir: Path) -> None:
    """Once the lab's ledger holds ``n`` faults (within 90 s), SIGKILL the runner, then its load
    generator (of the drill run in ``drill_dir``)."""
    try:
        _wait_for(lambda: len(_ledger(lab_dir)) == n, 90, what, runner)
        time.sleep(0.3)
    finally:
        runner.kill()
    _kill_orphan_load(drill_dir)


def _experiment(
    method: list[dict[str, Any]],
    *,
    rate: float = 6,
    warmup_s: float = 2,
    controls: list[dict[str, Any]] | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    def env(key: str, default: str) -> dict[str, str]:
        return {"type": "env", "key": key, "default": default}

    return {
        "version": "1.0.0",
        "title": "safety test drill",
        "description": "a small drill for the safety tests",
        "configuration": {
            "infer_lab_dir": env("CHAOS_INFER_LAB_DIR", ".chaos-infer/lab"),
            "infer_run_dir": env("CHAOS_INFER_RUN_DIR", "chaos-infer-run/safety"),
            "infer_base_url": env("CHAOS_INFER_BASE_URL", ""),
            "window_s": 4,
            "slo_availability": env("CHAOS_INFER_SLO_AVAILABILITY", "0.9"),
            **(configuration or {}),
        },
        "controls": [
            background_load_control(
                rate_rps=rate, warmup_s=warmup_s, max_duration_s=90, max_tokens=16, timeout_s=5
            ),
            *(controls or []),
        ],
        "steady-state-hypothesis": {
            "title": "available",
            "probes": [
                {
                    "type": "probe",
                    "name": "availability-meets-slo",
                    "tolerance": {"type": "jsonpath", "path": "$.passed", "expect": True},
                    "provider": {
                        "type": "python",
                        "module": "chaoslib_infer.activities.slo",
                        "func": "slo_check",
                        "arguments": {"metric": "availability", "window_s": "${window_s}"},
                    },
                }
            ],
        },
        "method": method,
        "rollbacks": [
            {
                "type": "action",
                "name": "clear-lab-faults",
                "provider": {
                    "type": "python",
                    "module": "chaoslib_infer.activities.lab",
                    "func": "clear_lab_faults",
                },
            }
        ],
        "runtime": {"rollbacks": {"strategy": "always"}},
    }


def _action(
    name: str,
    func: str,
    module: str = "chaoslib_infer.lab.testfault",
    pause_s: float = 0,
    **arguments: Any,
) -> dict[str, Any]:
    act: dict[str, Any] = {
        "type": "action",
        "name": name,
        "provider": {"type": "python", "module": module, "func": func, "arguments": arguments},
    }
    if pause_s:
        act["pauses"] = {"after": pause_s}
    return act


def _plan(tmp: Path, name: str, experiment: dict[str, Any], replicas: int, extra: str = "") -> Path:
    exp = tmp / f"{name}.yaml"
    exp.write_text(yaml.safe_dump(experiment, sort_keys=False))
    plan = tmp / f"plan-{name}.yaml"
    plan.write_text(
        f"name: safety-{name}\nlab: {{replicas: {replicas}, engine: sim}}\n{extra}"
        f"drills:\n  - name: {name}\n    experiment: {exp}\n"
    )
    return plan


# ---- 1. SIGKILLed runner: the watchdog expires faults, `rollback` replays the rest ----------
def test_killed_runner_watchdog_expires_faults_rollback_and_report(tmp_path: Path) -> None:
    out = tmp_path / "gd"
    lab_dir = out / "lab"
    m1, m2 = tmp_path / "marker-ttl3", tmp_path / "marker-ttl120"
    method = [
        _action("marker-ttl-3s", "inject_marker_fault", path=str(m1), ttl_s=3),
        _action("marker-ttl-120s", "inject_marker_fault", path=str(m2), ttl_s=120),
    ]
    if HAS_FREEZE:  # the real cgroup freeze (upstream-timeout drill), held long after the kill
        method.append(_action("freeze-r1", "freeze_replica", module="chaoslib_infer.activities.upstream",
                              replica="r1", hold_s=40, ttl_s=4))  # fmt: skip
    else:
        method.append(
            _action("sigstop-r1", "stop_replica_process", replica="r1", ttl_s=4, pause_s=40)
        )
    plan = _plan(tmp_path, "killed", _experiment(method), replicas=2)
    runner = Runner(str(plan), "--out", str(out))
    _kill_at_ledger(runner, lab_dir, 3, "three faults in the ledger", out / "killed")
    records = {r["id"]: r for r in _ledger(lab_dir)}
    assert len(records) == 3 and m1.exists() and m2.exists()
    short = [r for r in records.values() if float(r["ttl_s"]) < 100]
    assert len(short) == 2
    last_deadline = max(float(r["injected_at"]) + float(r["ttl_s"]) for r in short)

    def expired_events() -> dict[str, dict[str, Any]]:
        # the watchdog claims a record, undoes it, then logs "expired": wait for the log
        return {e["fault_id"]: e for e in _events(lab_dir) if e.get("phase") == "expired"}

    _wait_for(lambda: len(expired_events()) == 2, last_deadline - time.time() + 3.0, "watchdog")
    expired = expired_events()
    assert set(expired) == {r["id"] for r in short}
    assert not m1.exists() and m2.exists()
    assert [r["id"] for r in _ledger(lab_dir)] == [
        r["id"] for r in records.values() if r not in short
    ]
    for rec in short:  # undone by the watchdog within one check period of its deadline
        lag = expired[rec["id"]]["t"] - (float(rec["injected_at"]) + float(rec["ttl_s"]))
        assert 0.0 <= lag <= 1.5, (rec["kind"], lag)
    frozen = next(r for r in short if r["kind"] != "test-marker")
    module = importlib.import_module(frozen["module"])
    assert module.fault_active(Lab.attach(lab_dir), frozen) is False
    for pid in frozen.get("pids") or [frozen.get("pid")]:
        assert _state(int(pid)) not in ("T", "t"), f"pid {pid} still stopped after its TTL"
    # the killed run left a summary marked incomplete, with the drill in progress
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["in_progress"]["drill"] == "killed"
    partial = json.loads((out / "killed" / "journal.json").read_text())
    assert partial["status"] == "running"
    assert partial["steady_states"]["before"]["steady_state_met"] is True
    # `lab up` refuses the state dir with a pending fault; `rollback` undoes it
    up = _cli("lab", "up", "--port", "0", "--state-dir", str(lab_dir))
    assert (
        up.returncode == 2 and "pending fault" in up.stderr and "chaos-infer rollback" in up.stderr
    )
    assert len(up.stderr.strip().splitlines()) == 1
    rb = _cli("rollback", "--state-dir", str(lab_dir))
    assert rb.returncode == 0, rb.stderr
    assert f"removed {m2}" in rb.stdout and not m2.exists()
    status = json.loads(_cli("lab", "status", "--json", "--state-dir", str(lab_dir)).stdout)
    assert status["active_faults"] == [] and _ledger(lab_dir) == []
    again = _cli("rollback", "--state-dir", str(lab_dir))
    assert again.returncode == 0 and "nothing pending" in again.stdout
    # `report` renders the killed run
    rep = _cli("report", str(out))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False
    drill = summary["drills"][0]
    assert drill["name"] == "killed" and drill["status"] == "incomplete"
    assert drill["figures"]["requests"] > 0
    assert "INCOMPLETE" in (out / "index.html").read_text()
    assert (out / "killed" / "evidence.html").stat().st_size > 0
    down = _cli("lab", "down", "--state-dir", str(lab_dir))
    assert down.returncode == 0, down.stderr
    assert _alive(_lab_pids(lab_dir)) == []


# ---- 2. the next game day on the same folder plays a killed run's pending records ------------
def test_gameday_rolls_back_a_killed_runs_faults_on_start(tmp_path: Path) -> None:
    out = tmp_path / "gd"
    lab_dir = out / "lab"
    marker = tmp_path / "left-behind"
    first = _experiment(
        [
            _action("marker", "inject_marker_fault", path=str(marker), ttl_s=120),
            _action("sigstop-r0", "stop_replica_process", replica="r0", ttl_s=120, pause_s=40),
        ]
    )
    runner = Runner(str(_plan(tmp_path, "first", first, replicas=2)), "--out", str(out))
    _kill_at_ledger(runner, lab_dir, 2, "two faults in the ledger", out / "first")
    stopped = next(r for r in _ledger(lab_dir) if r["kind"] == "test-sigstop")
    old_pids = _lab_pids(lab_dir)
    assert marker.exists() and _state(int(stopped["pid"])) == "T"
    second = _experiment([_action("echo", "echo", value="second run", pause_s=1)])
    rerun = Runner(str(_plan(tmp_path, "second", second, replicas=1)), "--out", str(out))
    code = rerun.wait(180)
    assert code == 3, rerun.output[-3000:]  # no fault injected: the drill is inconclusive
    text = rerun.output
    assert "2 pending fault record(s) left by a previous run" in text
    assert f"removed {marker}" in text and f"SIGCONT pid {stopped['pid']}" in text
    assert "a lab left running by a previous run" in text
    assert text.index("SIGCONT") < text.index("lab: bringing up")
    assert not marker.exists()
    assert _alive(old_pids) == []  # the orphaned lab was taken down
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["drills"][0]["status"] == "inconclusive"
    assert summary["drills"][0]["reasons"][0].startswith("fault not confirmed by ground truth")
    assert _ledger(lab_dir) == [] and _alive(_lab_pids(lab_dir)) == []


# ---- 3. stop conditions: a collapsing drill is aborted, rollbacks play ----------------------
def _collapse_method() -> list[dict[str, Any]]:
    # one replica, SIGSTOPped: HAProxy ejects it (~1 s) and answers 503 while the drill "waits"
    return [
        _action("sigstop-only-replica", "stop_replica_process", replica="r0", ttl_s=60, pause_s=40)
    ]


GUARD = {"availability_floor": 0.5, "window_s": 3, "for_s": 2, "min_requests": 3}


def _check_aborted_journal(journal: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    assert journal["status"] == "interrupted"
    stop = journal["stop_condition"]
    assert stop["guard"] == "availability_floor" and stop["value"] < 0.5
    fault = json.loads((run_dir / "faults.jsonl").read_text().splitlines()[0])
    # tripped within the guard's window + sustain (+ HAProxy's ejection and the 1 s check period)
    assert 0 < stop["at"] - fault["fault_at"] <= GUARD["window_s"] + GUARD["for_s"] + 3.0, stop
    assert stop["at"] - stop["since"] >= GUARD["for_s"]
    rollbacks = journal["rollbacks"]
    assert [r["activity"]["name"] for r in rollbacks] == ["clear-lab-faults"]
    assert rollbacks[0]["status"] == "succeeded"
    assert any(f"SIGCONT pid {fault['pid']}" in line for line in rollbacks[0]["output"])
    assert journal["duration"] < 40  # the 40 s pause was cut short
    return fault


def test_stop_condition_aborts_collapsing_drill_in_gameday(tmp_path: Path) -> None:
    out = tmp_path / "gd"
    extra = "stop_conditions: " + json.dumps(GUARD) + "\n"
    plan = _plan(
        tmp_path, "collapse", _experiment(_collapse_method(), rate=10, warmup_s=3), 1, extra
    )
    proc = _cli("gameday", str(plan), "--out", str(out), timeout=180)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "stopped by stop condition availability_floor" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    drill = summary["drills"][0]
    assert drill["status"] == "aborted"
    assert summary["stopped_by"]["guard"] == "availability_floor"
    journal = json.loads((out / "collapse" / "journal.json").read_text())
    fault = _check_aborted_journal(journal, out / "collapse")
    assert drill["stop_condition"]["at"] == journal["stop_condition"]["at"]
    cleared = [e for e in _events(out / "lab") if e.get("phase") == "cleared"]
    assert [e["fault_id"] for e in cleared] == [fault["fault_id"]]
    assert "STOPPED" in (out / "index.html").read_text()
    assert _alive(_lab_pids(out / "lab")) == []


def test_stop_condition_aborts_collapsing_drill_with_chaos_run(tmp_path: Path) -> None:
    lab_dir, run_dir = tmp_path / "lab", tmp_path / "run"
    guard = {"name": "stop-conditions",
             "provider": {"type": "python", "module": "chaoslib_infer.controls.guard", "arguments": GUARD}}  # fmt: skip
    exp = tmp_path / "collapse.yaml"
    exp.write_text(
        yaml.safe_dump(_experiment(_collapse_method(), rate=10, warmup_s=3, controls=[guard]))
    )
    up = _cli("lab", "up", "--replicas", "1", "--port", "0", "--state-dir", str(lab_dir))
    assert up.returncode == 0, up.stderr
    try:
        env = {"CHAOS_INFER_LAB_DIR": str(lab_dir), "CHAOS_INFER_RUN_DIR": str(run_dir)}
        chaos = Path(sys.executable).parent / "chaos"
        proc = subprocess.run(
            [str(chaos), "--no-version-check", "run", "--journal-path", str(tmp_path / "journal.json"), str(exp)],
            capture_output=True, text=True, timeout=180, cwd=tmp_path, env={**os.environ, **env},
        )  # fmt: skip
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        journal = json.loads((tmp_path / "journal.json").read_text())
        fault = _check_aborted_journal(journal, run_dir)
        status = json.loads(_cli("lab", "status", "--json", "--state-dir", str(lab_dir)).stdout)
        assert status["active_faults"] == []
        assert _state(int(fault["pid"])) in ("S", "R")
    finally:
        down = _cli("lab", "down", "--state-dir", str(lab_dir))
        assert down.returncode == 0, down.stderr


# ---- 4. secrets: the API key never lands in a file the run writes ---------------------------
def test_api_key_is_used_but_never_written(tmp_path: Path) -> None:
    out = tmp_path / "gd"
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    exp = _experiment(
        # a probe that hands the key to Chaos Toolkit, which journals and logs activity outputs
        [echo_key_probe(2)],
        configuration={"infer_api_key": {"type": "env", "key": "CHAOS_INFER_API_KEY"}},
    )
    plan = _plan(tmp_path, "secret", exp, replicas=1)
    env = {k: v for k, v in os.environ.items() if k != "CHAOS_INFER_API_KEY"}
    runner = Runner(str(plan), "--out", str(out), "--api-key-file", str(key_file), env=env)
    pid = _wait_for(lambda: (out / "secret" / "load.pid").exists() and int((out / "secret" / "load.pid").read_text()),
                    90, "the load generator", runner)  # fmt: skip
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    runner_cmdline = Path(f"/proc/{runner.proc.pid}/cmdline").read_bytes()
    # the lab's children (supervisord, replicas, HAProxy, watchdog) never get the key (issue 13)
    lab_env = [e for p in _lab_pids(out / "lab") if (e := _environ(p))]
    assert lab_env and not [e for e in lab_env if KEY.encode() in e]
    # the drill injects no fault (a probe echoes the key): nothing to judge, inconclusive (exit 3)
    assert runner.wait(180) == 3, runner.output[-3000:]
    assert KEY.encode() not in cmdline + runner_cmdline  # never on a command line (ps)
    assert f"CHAOS_INFER_API_KEY={KEY}".encode() in environ.split(b"\0")  # the load got it
    assert KEY not in runner.output
    leaks = [
        p
        for p in out.rglob("*")
        if p.is_file() and not p.is_symlink() and KEY.encode() in p.read_bytes()
    ]
    assert leaks == []
    # the key did reach Chaos Toolkit's journal and log: it was scrubbed, not just absent
    for name in ("journal.json", "chaostoolkit.log"):
        assert "[REDACTED]" in (out / "secret" / name).read_text(), name
    journal = json.loads((out / "secret" / "journal.json").read_text())
    assert journal["run"][0]["output"] == {"value": "[REDACTED]"}
    assert _alive(_lab_pids(out / "lab")) == []
