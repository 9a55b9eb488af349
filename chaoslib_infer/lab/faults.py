"""The lab's fault ledger (``state_dir/faults.json``): the rollback ledger of every fault kind.

A fault is recorded *before* it is injected (:func:`add`) and forgotten once undone
(:func:`remove`, :func:`clear`); the dead-man watchdog (:mod:`chaoslib_infer.lab.deadman`)
undoes a record whose ``injected_at + ttl_s`` has passed. Every undo goes through the registry
(:mod:`chaoslib_infer.lab.registry`), which rebuilds the record from validated fields first.
``Lab.add_fault`` / ``remove_fault`` / ``clear_faults`` / ``active_faults`` / ``edit_faults`` are
these functions; the ledger's file format is described in :mod:`chaoslib_infer.lab.ledger`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab import registry
from chaoslib_infer.lab.groundtruth import EVENT_FIELDS
from chaoslib_infer.lab.processes import is_hog, kill
from chaoslib_infer.lab.statedir import DEFAULT_FAULT_TTL_S, FAULTS_FILE, LabError, write_json

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = ["active", "add", "clear", "edit", "remove"]


@contextlib.contextmanager
def edit(state_dir: Path) -> Iterator[list[dict[str, Any]]]:
    """Locked read-modify-write of ``faults.json``: yields the records (a list to change in
    place), written back durably on exit (``faults.json.lock``, ``flock`` exclusive)."""
    lock_path = state_dir / (FAULTS_FILE + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = state_dir / FAULTS_FILE
        try:
            faults: list[dict[str, Any]] = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            faults = []
        yield faults
        write_json(path, faults)


def active(lab: Lab) -> list[dict[str, Any]]:
    """The ledger's records still in effect, each checked by its module (``fault_active``); a
    refused record is reported with ``refused`` (nothing of it ran), one whose state cannot be
    told is reported as active: a fault is never hidden."""
    try:
        faults = json.loads((lab.state_dir / FAULTS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    out = []
    for f in faults:
        try:
            if registry.fault_active(lab, f):
                out.append(f)
        except registry.LedgerRefused as exc:  # nothing of it ran; never hide it either
            out.append({**f, "refused": str(exc)} if isinstance(f, dict) else f)
        except Exception:  # an unknown state is reported as active: never hide a fault
            out.append(f)
    return out


def add(lab: Lab, record: dict[str, Any]) -> str:
    """Record a fault before it is injected; see :meth:`chaoslib_infer.lab.fleet.Lab.add_fault`.

    Raises:
        LabError: no ``kind`` or ``module``, or a ``ttl_s`` that is not a positive number.
    """
    if "kind" not in record or "module" not in record:
        raise LabError("a fault record needs 'kind' and 'module'")
    ttl = record.get("ttl_s")
    if ttl is not None:
        try:
            seconds = float("nan") if isinstance(ttl, bool) else float(ttl)
        except (TypeError, ValueError):
            seconds = float("nan")
        if not 0 < seconds < float("inf"):
            raise LabError(f"a fault record's ttl_s must be a positive number, got {ttl!r}")
        ttl = seconds
    fault_id = f"{record['kind']}-{os.urandom(4).hex()}"
    entry = {
        **record,
        "id": fault_id,
        "injected_at": record.get("injected_at", time.time()),
        "ttl_s": float(ttl if ttl is not None else DEFAULT_FAULT_TTL_S),
    }
    with lab.edit_faults() as faults:
        faults.append(entry)
    described = {k: record[k] for k in EVENT_FIELDS if k in record}
    lab.fault_event(
        record.get("replica"), "injected", kind=record["kind"], fault_id=fault_id, **described
    )
    return fault_id


def remove(lab: Lab, fault_id: str, undo: bool = True) -> str | None:
    """Undo (unless ``undo`` is False) and forget one recorded fault. Unknown id: ``None``.

    Raises:
        LedgerRefused: the record does not validate (it stays in the ledger).
        Exception: whatever its module's ``undo_fault`` raises (it stays in the ledger).
    """
    with lab.edit_faults() as faults:
        found = [f for f in faults if f.get("id") == fault_id]
    if not found:
        return None
    f = found[0]
    note = None
    if undo and f.get("module"):
        # undo first: if it raises, the record stays in the ledger for `chaos-infer rollback`;
        # only the record rebuilt from validated fields reaches the module (LedgerRefused)
        note = registry.undo(lab, f)
    with lab.edit_faults() as faults:
        faults[:] = [x for x in faults if x.get("id") != fault_id]
    lab.fault_event(f.get("replica"), "cleared", kind=f.get("kind"), fault_id=fault_id)
    return note


def clear(lab: Lab) -> list[str]:
    """Undo every recorded fault (each through its module's ``undo_fault``) and kill leftover
    memory hogs (faults.json and any hog found in replica cgroups). Returns what was undone.

    A record that does not validate, or whose undo fails, is put back in the ledger and reported
    (``undo REFUSED`` / ``undo FAILED``); the others are still undone.
    """
    undone: list[str] = []
    with lab.edit_faults() as faults:
        known = list(faults)
        faults.clear()
    seen: set[int] = set()
    for f in known:
        try:  # a record that is not a fault of this lab runs nothing and stays
            clean = registry.validate(lab, f)
        except registry.LedgerRefused as exc:
            undone.append(f"undo REFUSED: {exc}")
            with lab.edit_faults() as faults:
                faults.append(f)
            continue
        if f.get("module"):
            try:
                note = registry.undo(lab, f)
            except Exception as exc:  # keep undoing the others; report this one
                note = f"{f.get('kind')} {f.get('id')}: undo FAILED: {exc}"
                with lab.edit_faults() as faults:
                    faults.append(f)
            undone.append(note or f"{f.get('kind')} {f.get('id')}: nothing left to undo")
            lab.fault_event(f.get("replica"), "cleared", kind=f.get("kind"), fault_id=f.get("id"))
            continue
        pid = int(clean.get("pid") or 0)  # 0: the hog is gone (or its pid was reused)
        seen.add(int(f.get("pid") or 0))
        if is_hog(pid):
            kill(pid)
            undone.append(f"oom-kill on {f.get('replica')}: killed memory hog pid {pid}")
        # the event names the fault it clears (the recorded hog), whether or not its process
        # was still there to kill: the ground truth pairs it with its 'injected' event
        lab.fault_event(str(f.get("replica")), "cleared", hog_pid=int(f.get("pid") or 0) or pid)
    for rep in lab.meta["replicas"]:
        for pid in lab.replica_cgroup(rep["name"]).pids():
            if pid not in seen and is_hog(pid):
                kill(pid)
                undone.append(f"oom-kill on {rep['name']}: killed stray memory hog pid {pid}")
                lab.fault_event(rep["name"], "cleared", hog_pid=pid)
    return undone
