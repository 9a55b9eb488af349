"""Helpers shared by the lab tests (imported as ``from labutil import ...``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (zombies and dead processes count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def alive_pids(pids: Iterable[int]) -> list[int]:
    """The pids of ``pids`` that are still live processes (see :func:`pid_alive`)."""
    return [pid for pid in pids if pid_alive(pid)]


def check_verdict(drill: dict[str, Any], allowed: tuple[str, ...] = ("passed", "failed")) -> None:
    """A drill's verdict agrees with its own criteria rows and reasons.

    ``failed`` has reasons, and every failing row is named in one (``(criterion)``), unless the
    reason is a defect before the fault or a fault left behind (they stand alone); ``passed`` has no reason and no failing row.
    """
    status = drill["status"]
    assert status in allowed, (status, drill.get("reasons"))
    failing = [r for r in drill["verdict"]["rows"] if r["result"] == "fail"]
    reasons = drill["reasons"]
    if status == "passed":
        assert not failing and not reasons, (failing, reasons)
    elif status == "failed":
        assert reasons
        own = ("the service did not meet its SLOs before the fault", "fault left behind")
        if not reasons[0].startswith(own):
            for row in failing:
                assert any(f"({row['criterion']})" in r for r in reasons), (row, reasons)


def run_gameday(
    plan: Path, out: Path, timeout_s: float = 600.0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``chaos-infer gameday PLAN --out OUT`` as a user would (a child process from the
    repository root, this environment); return the process and ``summary.json``.

    Raises:
        AssertionError: no summary was written (with the output's tail).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "gameday", str(plan), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=dict(os.environ),
    )
    summary_file = out / "summary.json"
    assert summary_file.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
    summary: dict[str, Any] = json.loads(summary_file.read_text())
    return proc, summary


def plan_copy(base: Path, edit: Callable[[str, dict[str, Any]], None]) -> dict[str, str]:
    """Copy the default plan (``drills/gameday.yaml``) and its experiments into ``base``, each
    experiment changed in place by ``edit(drill_name, experiment)``; return the environment
    (``CHAOS_INFER_PLAN``, ``CHAOS_INFER_EXPERIMENTS``) that makes ``chaos-infer drill run`` and
    ``gameday`` use the copies."""
    exp_dir = base / "experiments"
    exp_dir.mkdir(parents=True)
    plan = yaml.safe_load((ROOT / "drills" / "gameday.yaml").read_text())
    for drill in plan["drills"]:
        name = drill["name"]
        exp = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
        edit(name, exp)
        (exp_dir / f"{name}.yaml").write_text(yaml.safe_dump(exp, sort_keys=False))
        drill["experiment"] = str(exp_dir / f"{name}.yaml")
    (base / "gameday.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    return {"CHAOS_INFER_PLAN": str(base / "gameday.yaml"), "CHAOS_INFER_EXPERIMENTS": str(exp_dir)}


@dataclass(frozen=True)
class GamedayRun:
    """One finished ``chaos-infer gameday`` run: the process, its ``--out`` folder, its wall time
    (seconds) and ``summary.json``; :meth:`drill` is one drill's entry by name."""

    proc: subprocess.CompletedProcess[str]
    out: Path
    elapsed_s: float
    summary: dict[str, Any]

    def drill(self, name: str) -> dict[str, Any]:
        """The summary entry of drill ``name``. Raises KeyError when the run has no such drill."""
        for d in self.summary["drills"]:
            if d["name"] == name:
                return dict(d)
        raise KeyError(name)


def run_default_gameday(out: Path, timeout_s: float = 900.0) -> GamedayRun:
    """Run the README's main job (``chaos-infer gameday --out OUT``: the default plan on the
    default lab) as a user would; return the run. The suite runs it once (the session fixture
    ``default_gameday`` in conftest.py) and every test that only reads a drill's outcome of the
    default plan reads it there instead of bringing up a lab of its own."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "gameday", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=dict(os.environ),
    )
    elapsed = time.monotonic() - t0
    summary_file = out / "summary.json"
    assert summary_file.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
    return GamedayRun(proc, out, elapsed, json.loads(summary_file.read_text()))
