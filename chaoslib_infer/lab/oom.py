"""The oom-kill fault: a memory hog in a replica's cgroup until the kernel OOM-kills its engine.

``Lab.oom_kill`` is :func:`oom_kill`. The hog (:mod:`chaoslib_infer.lab.hog`) is recorded in the
lab's fault ledger as a module-less ``oom-kill`` record while it runs (the lab's rollback and the
dead-man kill a hog left behind) and is removed as soon as the kernel has killed the engine.
"""

from __future__ import annotations

import select
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab.hog import HOG_MODULE
from chaoslib_infer.lab.processes import lab_child_env, wait_dead
from chaoslib_infer.lab.statedir import LabError, tail

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = ["oom_kill"]


def oom_kill(lab: Lab, replica: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Make the kernel OOM-kill ``replica``'s engine with a memory hog in its cgroup.

    Returns:
        ``{"replica", "fault_at", "oom_kills_before", "oom_kills_after", "killed_pid",
        "hog_pid", "cgroup", "injected_at", "oom_observed_at"}``, unix s: the cgroup's OOM
        counter is read about every millisecond; ``fault_at`` is when the last read that saw no
        kill began, ``oom_observed_at`` when the read that saw it returned (the kill lies
        between them: a few ms, more on a busy machine), ``injected_at`` when the hog started.

    Raises:
        LabError: unknown or not running replica, a fault already active on it, or no OOM
            kill within ``timeout_s`` (the hog is removed).
    """
    cg = lab.replica_cgroup(replica)
    if not lab.supervisord_alive():
        raise LabError(f"the lab in {lab.state_dir} is not running")
    if any(f.get("replica") == replica for f in lab.active_faults()):
        raise LabError(f"an oom-kill fault is already active on {replica}")
    info = lab.process_infos().get(replica, {})
    killed_pid = int(info.get("pid") or 0)
    if info.get("statename") != "RUNNING" or not killed_pid:
        raise LabError(f"replica {replica} is not running ({info.get('statename', 'unknown')})")
    before = cg.oom_kills()
    (lab.state_dir / "logs").mkdir(exist_ok=True)
    env = lab_child_env()  # lab children never get the API key
    # no kill can happen before the hog starts: the first bound on the kill's time
    clear_at = time.time()
    with open(lab.state_dir / "logs" / "hog.log", "ab") as err:
        hog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                HOG_MODULE,
                "--cgroup",
                str(cg.path),
                "--version",
                str(cg.version),
                "--ttl-s",
                f"{max(timeout_s + 5.0, 10.0):g}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            start_new_session=True,
        )
    injected_at = time.time()
    with lab.edit_faults() as faults:
        faults.append(
            {
                "kind": "oom-kill",
                "replica": replica,
                "pid": hog.pid,
                "hog_pid": hog.pid,
                "cgroup": str(cg.path),
                "target_pid": killed_pid,
                "injected_at": injected_at,
            }
        )
    lab.fault_event(replica, "injected", hog_pid=hog.pid, target_pid=killed_pid)
    try:
        assert hog.stdout is not None
        ready, _, _ = select.select([hog.stdout], [], [], 10.0)
        line = hog.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("armed"):
            raise LabError(
                f"memory hog failed to start in {cg.path}: {tail(lab.state_dir / 'logs' / 'hog.log') or 'no output'}"
            )
        deadline = time.monotonic() + timeout_s
        read_at = time.time()
        after = cg.oom_kills()
        while after <= before:
            clear_at = read_at  # no kill yet when this read began
            if hog.poll() is not None:
                raise LabError(
                    f"memory hog exited ({hog.returncode}) before any OOM kill in {replica}"
                )
            if time.monotonic() > deadline:
                raise LabError(
                    f"no OOM kill in {replica}'s cgroup within {timeout_s:g} s "
                    f"(usage {cg.usage_bytes() >> 20} MiB of {(cg.limit_bytes() or 0) >> 20} MiB); hog removed"
                )
            time.sleep(0.001)
            read_at = time.time()
            after = cg.oom_kills()
        observed_at = time.time()
        # the kill happened between the last read that saw none and this one: fault_at is the
        # earlier bound, so the engine's death (its exit event) never reads before the fault
        fault_at = clear_at
        # The hog's job is done: free its memory *now* rather than when it gets scheduled
        # (it exits by itself too), so the restarted engine never meets a full cgroup.
        hog.kill()
        hog.wait(timeout=5.0)
        if not wait_dead(killed_pid, 3.0):
            raise LabError(
                f"the kernel OOM kill in {replica}'s cgroup did not kill its engine pid {killed_pid}"
            )
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        if hog.stdout is not None:
            hog.stdout.close()
        with lab.edit_faults() as faults:
            faults[:] = [f for f in faults if f.get("pid") != hog.pid]
        lab.fault_event(replica, "cleared", hog_pid=hog.pid, hog_exit=hog.returncode)
    return {
        "replica": replica,
        "fault_at": fault_at,
        "oom_observed_at": observed_at,
        "oom_kills_before": before,
        "oom_kills_after": after,
        "killed_pid": killed_pid,
        "hog_pid": hog.pid,
        "cgroup": str(cg.path),
        "injected_at": injected_at,
    }
