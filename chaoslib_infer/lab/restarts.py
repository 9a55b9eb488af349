"""Simultaneous restarts: K replicas restarted at the same instant through supervisord.

The fault behind drill 4 (``experiments/simultaneous-restarts.yaml``). :func:`restart` records the
fault with ``lab.add_fault`` (kind ``simultaneous-restarts``, module this one), then releases one
thread per replica from a barrier; each calls supervisord's XML-RPC on its own connection:

- ``method="kill"``: ``supervisor.signalProcess(name, "KILL")``: the engine dies at once (in-flight
  requests are lost) and supervisord respawns it (``autorestart``); the new process pays the
  engine's weight-load delay and warm-up again.
- ``method="stop-start"``: ``supervisor.stopProcess(name)`` (SIGTERM, graceful drain up to the
  engine's shutdown grace, then SIGKILL after ``stopwaitsecs``) followed by ``startProcess``.

:func:`wait_restarted` then waits for the lab's ground truth of every restarted replica: its
``exit`` event (supervisord's reap time), the ``start`` of a new pid, its ``ready`` event, and the
first request it served again (``Lab.served``: engine ledger / HAProxy log); then it forgets the
fault. :func:`undo_fault` (rollback, ``lab.clear_faults``) starts any target supervisord does not
run (stopped, exited, fatal: e.g. a runner killed between stop and start); :func:`fault_active`
is true while a target is not RUNNING. The record's ``ttl_s`` lets the lab's fault watchdog, where
the lab runs one, do the same if the runner dies.
"""

from __future__ import annotations

import http.client
import threading
import time
import xmlrpc.client
from typing import Any

from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.lab.supervisor_rpc import rpc, start_process

__all__ = [
    "KIND",
    "METHODS",
    "MODULE",
    "fault_active",
    "ground_truth",
    "pick_targets",
    "restart",
    "undo_fault",
    "wait_restarted",
]

KIND = "simultaneous-restarts"
MODULE = "chaoslib_infer.lab.restarts"
METHODS = ("kill", "stop-start")
_RPC_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)


def pick_targets(names: list[str], k: int | str) -> tuple[list[str], list[str]]:
    """Split replica ``names`` into ``(targets, survivors)``.

    Args:
        names: every replica name, in order.
        k: ``"all-but-one"`` (every replica but the last), ``"all"``, or a count 1..N (the first
            ``k`` replicas; a numeric string is accepted).

    Raises:
        LabError: ``k`` is not one of those, or the lab has no replica.
    """
    if not names:
        raise LabError("the lab has no replica")
    n = len(names)
    if k == "all":
        count = n
    elif k in ("all-but-one", "auto", "", None):
        count = max(1, n - 1)
    else:
        try:
            count = int(k)
        except (TypeError, ValueError):
            raise LabError(f"k must be 'all', 'all-but-one' or 1..{n}, got {k!r}") from None
        if not 1 <= count <= n:
            raise LabError(f"k must be between 1 and {n} (the lab's replicas), got {count}")
    return names[:count], names[count:]


def _infos(lab: Lab) -> dict[str, dict[str, Any]]:
    try:
        return {p["name"]: p for p in rpc(lab.state_dir, 2.0).supervisor.getAllProcessInfo()}
    except _RPC_ERRORS as exc:
        raise LabError(f"supervisord of the lab in {lab.state_dir} not answering: {exc}") from exc


def restart(lab: Lab, replicas: list[str], method: str = "kill") -> dict[str, Any]:
    """Restart ``replicas`` at the same instant (fault recorded first); returns at once.

    Args:
        lab: the running lab.
        replicas: replica names to restart.
        method: ``"kill"`` (SIGKILL, supervisord respawns) or ``"stop-start"``.

    Returns:
        ``{"id" (fault id), "replicas", "method", "fault_at" (unix s, the barrier released the
        calls), "killed_pids" ({replica: pid}), "calls" ({replica: {"start", "end" (unix s),
        "error"}})}``.

    Raises:
        LabError: unknown method or replica, a replica not RUNNING, a fault already active on
            one, or every supervisord call failed.
    """
    if method not in METHODS:
        raise LabError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not replicas:
        raise LabError("no replica to restart")
    known = lab.replica_names()
    for name in replicas:
        if name not in known:
            raise LabError(f"unknown replica {name!r}; the lab has {', '.join(known)}")
    infos = _infos(lab)
    pids: dict[str, int] = {}
    for name in replicas:
        info = infos.get(name, {})
        if info.get("statename") != "RUNNING" or not info.get("pid"):
            raise LabError(f"replica {name} is not running ({info.get('statename', 'unknown')})")
        pids[name] = int(info["pid"])
    active = lab.status()["active_faults"]
    busy = {f.get("replica") for f in active} | {r for f in active for r in f.get("replicas") or []}
    if busy & set(replicas):
        raise LabError(f"a fault is already active on {', '.join(sorted(busy & set(replicas)))}")
    record = {
        "kind": KIND,
        "module": MODULE,
        "replica": replicas[0] if len(replicas) == 1 else None,
        "replicas": list(replicas),
        "method": method,
        "pids": pids,
        "ttl_s": 60.0,
    }
    fault_id = lab.add_fault(record)
    barrier = threading.Barrier(len(replicas) + 1)
    calls: dict[str, dict[str, Any]] = {}

    def _one(name: str) -> None:
        proxy = rpc(lab.state_dir, 10.0)
        entry: dict[str, Any] = {"start": None, "end": None, "error": None}
        calls[name] = entry
        try:
            barrier.wait(timeout=10.0)
        except threading.BrokenBarrierError:
            entry["error"] = "barrier broken"
            return
        entry["start"] = time.time()
        try:
            if method == "kill":
                proxy.supervisor.signalProcess(name, "KILL")
            else:
                proxy.supervisor.stopProcess(name, True)
                proxy.supervisor.startProcess(name, False)
        except _RPC_ERRORS as exc:
            entry["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        entry["end"] = time.time()

    threads = [threading.Thread(target=_one, args=(n,), daemon=True) for n in replicas]
    for th in threads:
        th.start()
    fault_at = time.time()  # no call can land before this instant
    try:
        barrier.wait(timeout=10.0)
    except threading.BrokenBarrierError as exc:
        lab.remove_fault(fault_id)
        raise LabError("could not release the restart calls together (barrier broken)") from exc
    for th in threads:
        th.join(timeout=30.0)
    errors = {n: c["error"] for n, c in calls.items() if c.get("error")}
    if len(errors) == len(replicas):
        lab.remove_fault(fault_id)
        raise LabError(f"every restart call failed: {errors}")
    return {
        "id": fault_id,
        "replicas": list(replicas),
        "method": method,
        "fault_at": fault_at,
        "killed_pids": pids,
        "calls": calls,
    }


def wait_restarted(lab: Lab, result: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until every replica of ``result`` (from :func:`restart`) serves again; forget the fault.

    Ground truth, per replica, from the lab: ``died_at`` (its ``exit`` event for the old pid),
    ``started_at`` / ``new_pid`` (the next ``start`` event), ``ready_at`` (the next ``ready``
    event), ``serving_again_at`` (``Lab.served`` after ``died_at``).

    Returns:
        ``result`` plus ``restarts`` ({replica: those fields}), ``all_serving_at`` (unix s, the last
        replica to serve again) and ``all_serving_s`` (from ``fault_at``).

    Raises:
        LabError: not every replica served again within ``timeout_s`` seconds (the fault is
            undone: stopped replicas are started).
    """
    fault_at = float(result["fault_at"])
    pending = {n: int(p) for n, p in result["killed_pids"].items()}
    restarts: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + float(timeout_s)
    try:
        while pending:
            events = lab.events()
            for name in list(pending):
                row = ground_truth(events, name, pending[name], fault_at)
                if row.get("died_at") is not None:
                    row["serving_again_at"] = lab.served(name, float(row["died_at"]))
                if row.get("serving_again_at") is not None and row.get("ready_at") is not None:
                    restarts[name] = row
                    del pending[name]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise LabError(
                    f"{', '.join(sorted(pending))} did not serve again within {timeout_s:g} s "
                    "of the restart"
                )
            time.sleep(0.1)
    finally:
        lab.remove_fault(str(result["id"]))
    last = max(float(r["serving_again_at"]) for r in restarts.values())
    return {
        **result,
        "restarts": restarts,
        "all_serving_at": last,
        "all_serving_s": last - fault_at,
    }


def ground_truth(
    events: list[dict[str, Any]], replica: str, old_pid: int, fault_at: float
) -> dict[str, Any]:
    """One replica's restart from the lab's ``events.jsonl``: ``died_at``, ``cause``,
    ``started_at``, ``new_pid``, ``ready_at`` (unix s; None where not seen yet)."""
    row: dict[str, Any] = {
        "died_at": None,
        "cause": None,
        "started_at": None,
        "new_pid": None,
        "ready_at": None,
    }
    for e in events:
        if e.get("replica") != replica:
            continue
        ev = e.get("event")
        t = float(e.get("t", 0.0))
        if row["died_at"] is None:
            if ev == "exit" and int(e.get("pid") or 0) == old_pid and t >= fault_at - 1.0:
                row["died_at"], row["cause"] = t, e.get("cause")
        elif row["started_at"] is None:
            if ev == "start" and int(e.get("pid") or 0) != old_pid:
                row["started_at"], row["new_pid"] = t, int(e.get("pid") or 0)
        elif row["ready_at"] is None and ev == "ready":
            row["ready_at"] = t
    return row


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Start every target replica supervisord does not run (idempotent).

    Returns:
        What was started, or None when every target was running (or starting) already.
    """
    try:
        infos = _infos(lab)
    except LabError:
        return None  # lab down: nothing to restart
    started = []
    for name in record.get("replicas") or []:
        state = infos.get(name, {}).get("statename")
        if state in ("STOPPED", "EXITED", "FATAL", "BACKOFF"):
            try:  # False: supervisord's autorestart got there first, which is what we want
                if start_process(lab.state_dir, name, 10.0):
                    started.append(name)
            except _RPC_ERRORS as exc:
                raise LabError(f"cannot start {name}: {exc}") from exc
    return f"simultaneous-restarts: started {', '.join(started)}" if started else None


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while a target replica is not RUNNING in supervisord (restarting, stopped)."""
    try:
        infos = _infos(lab)
    except LabError:
        return False  # no supervisord: no lab, nothing running to restart
    return any(infos.get(n, {}).get("statename") != "RUNNING" for n in record.get("replicas") or [])
