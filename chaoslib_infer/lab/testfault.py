"""Faults for testing the safety machinery (rollback ledger, dead-man switch, stop conditions).

Not a drill: these are the smallest real faults that exercise the same path as the drills' own
(record with :meth:`Lab.add_fault` *before* injecting, undo through :func:`undo_fault`):

- ``test-marker``: creates a marker file; undoing removes it. Harmless, instant, easy to observe
  from a test (the file exists exactly while the fault is in place).
- ``test-sigstop``: stops one replica's engine process with SIGSTOP (a frozen server: it accepts
  connections in the kernel backlog but answers nothing, HAProxy's health check marks it DOWN);
  undoing sends SIGCONT. With a one-replica lab this collapses availability within ~1-2 s.

Both are Chaos Toolkit actions (``chaoslib_infer.lab.testfault``), logged to the drill's fault
log like every drill's fault. ``echo`` is a probe that returns its argument (tests use it to show
that a secret reaching the journal and the log is scrubbed from both).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab import procfs
from chaoslib_infer.lab.activity import attach_lab, log_fault
from chaoslib_infer.lab.fleet import Lab, LabError

__all__ = ["echo", "fault_active", "inject_marker_fault", "stop_replica_process", "undo_fault"]

MODULE = "chaoslib_infer.lab.testfault"
KIND_MARKER = "test-marker"
KIND_SIGSTOP = "test-sigstop"


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks, as the record keeps it: a string):
    tells a reused pid apart."""
    ticks = procfs.start_time(pid)
    return None if ticks is None else str(ticks)


def inject_marker_fault(
    path: str, ttl_s: float = 120.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Record, then create, a marker file (the ``test-marker`` fault).

    Args:
        path: the marker file to create (its folder must exist).
        ttl_s: dead-man time to live of the fault record, seconds.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"kind", "fault_id", "path", "fault_at" (unix s), "ttl_s"}``.

    Raises:
        ActivityFailed: no lab, or the file cannot be created (the record is removed again).
    """
    lab = attach_lab(configuration)
    marker = Path(path).resolve()
    fault_id = lab.add_fault(
        {"kind": KIND_MARKER, "module": MODULE, "path": str(marker), "ttl_s": float(ttl_s)}
    )
    try:
        marker.write_text(fault_id, encoding="utf-8")
    except OSError as exc:
        lab.remove_fault(fault_id)
        raise ActivityFailed(f"cannot create marker {marker}: {exc.strerror or exc}") from exc
    result = {
        "kind": KIND_MARKER,
        "fault_id": fault_id,
        "path": str(marker),
        "fault_at": time.time(),
        "ttl_s": float(ttl_s),
    }
    log_fault(configuration, result)
    return result


def stop_replica_process(
    replica: str = "r0", ttl_s: float = 120.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Record, then SIGSTOP, one replica's engine process (the ``test-sigstop`` fault).

    Args:
        replica: replica name (``r0``...).
        ttl_s: dead-man time to live of the fault record, seconds.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"kind", "fault_id", "replica", "pid", "fault_at" (unix s), "ttl_s"}``.

    Raises:
        ActivityFailed: no lab, unknown or not running replica.
    """
    lab = attach_lab(configuration)
    try:
        pid = lab.replica_pid(replica)
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    if not pid:
        raise ActivityFailed(f"replica {replica} is not running")
    fault_id = lab.add_fault(
        {
            "kind": KIND_SIGSTOP,
            "module": MODULE,
            "replica": replica,
            "pid": pid,
            "start_time": _start_time(pid),
            "ttl_s": float(ttl_s),
        }
    )
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError as exc:
        lab.remove_fault(fault_id)
        raise ActivityFailed(f"replica {replica} pid {pid} exited before SIGSTOP") from exc
    result = {
        "kind": KIND_SIGSTOP,
        "fault_id": fault_id,
        "replica": replica,
        "pid": pid,
        "fault_at": time.time(),
        "ttl_s": float(ttl_s),
    }
    log_fault(configuration, result)
    return result


def _same_process(record: dict[str, Any]) -> bool:
    pid = int(record.get("pid") or 0)
    return (
        bool(pid) and _start_time(pid) is not None and _start_time(pid) == record.get("start_time")
    )


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Undo a ``test-marker`` (remove the file) or ``test-sigstop`` (SIGCONT) fault; idempotent.

    Returns:
        What was undone, or ``None`` when nothing was left to undo.
    """
    if record.get("kind") == KIND_MARKER:
        marker = Path(str(record.get("path")))
        try:
            marker.unlink()
        except FileNotFoundError:
            return None
        return f"{KIND_MARKER} {record.get('id')}: removed {marker}"
    if record.get("kind") == KIND_SIGSTOP:
        pid = int(record.get("pid") or 0)
        if not _same_process(record):
            return None
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return None
        return f"{KIND_SIGSTOP} on {record.get('replica')}: SIGCONT pid {pid}"
    raise LabError(f"{MODULE} does not know fault kind {record.get('kind')!r}")


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while the marker exists / the recorded process is still stopped."""
    if record.get("kind") == KIND_MARKER:
        return Path(str(record.get("path"))).exists()
    if record.get("kind") == KIND_SIGSTOP:
        return _same_process(record) and procfs.state(int(record["pid"])) in ("T", "t")
    return True


def echo(value: Any = None) -> dict[str, Any]:
    """Probe: return ``{"value": value}`` (for tests of what reaches the journal and the log)."""
    return {"value": value}
