"""The rollback ledger: the lab's ``faults.json``, read and replayed from outside any drill.

Every fault that stays in place is recorded with :meth:`chaoslib_infer.lab.fleet.Lab.add_fault`
*before* it is injected; the record names the module whose ``undo_fault(lab, record)`` removes it.
The file is written atomically (temporary sibling + fsync + rename + directory fsync), so a runner
killed at any instant leaves either the old or the new ledger, never half of one.

This module answers two questions for the command line and the game day:

- :func:`pending_faults`: which records are still in the ledger (left by a run that was killed, or
  by a rollback that failed)?
- :func:`rollback`: undo them all now (``chaos-infer rollback``), reporting what was undone;
  every record is first rebuilt from validated fields (:mod:`chaoslib_infer.lab.registry`),
  and a ledger holding one record that is not a fault of this lab is refused whole
  (:func:`refuse_if_tampered`): nothing is undone, nothing of it runs.

Policy (documented in ``docs/safety.md``): ``chaos-infer lab up`` refuses a state directory with
pending records (run ``chaos-infer rollback`` first, so a human sees what was left behind); the game
day plays them itself on start-up, before it brings its lab up, and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.fleet import FAULTS_FILE, LAB_FILE, Lab, LabError
from chaoslib_infer.lab.registry import LedgerRefused, check_ledger

__all__ = [
    "RollbackResult",
    "describe",
    "pending_faults",
    "refuse_if_pending",
    "refuse_if_tampered",
    "rollback",
]


@dataclass
class RollbackResult:
    """What :func:`rollback` found and did.

    Attributes:
        state_dir: the lab state directory.
        lab_found: whether ``lab.json`` exists there (no lab: nothing can be pending).
        pending: the ledger records found before the rollback.
        undone: one line per undo (from each fault module's ``undo_fault``).
        failed: the lines of ``undone`` that report a failed undo (the record stays in the ledger).
    """

    state_dir: Path
    lab_found: bool
    pending: list[dict[str, Any]] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def pending_faults(state_dir: Path) -> list[dict[str, Any]]:
    """Return the records in ``state_dir/faults.json`` (empty when there is no file).

    Every record counts, active or not: a record whose fault already vanished is still replayed
    (its ``undo_fault`` is idempotent) and then forgotten.

    Raises:
        LabError: the ledger exists but cannot be read or is not a JSON list (never silently
            treated as empty: that would forget faults that are still in place).
    """
    path = Path(state_dir) / FAULTS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LabError(f"cannot read the fault ledger {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as exc:
        raise LabError(
            f"the fault ledger {path} is not valid JSON ({exc.msg}); fix it by hand"
        ) from exc
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise LabError(f"the fault ledger {path} is not a list of records; fix it by hand")
    return data


def describe(record: dict[str, Any]) -> str:
    """One line for a ledger record: ``kind id on replica (injected at ..., ttl ... s)``."""
    parts = [str(record.get("kind", "?")), str(record.get("id") or record.get("pid") or "")]
    if record.get("replica"):
        parts.append(f"on {record['replica']}")
    line = " ".join(p for p in parts if p)
    if record.get("ttl_s"):
        line += f" (ttl {float(record['ttl_s']):g} s)"
    return line


def refuse_if_pending(state_dir: Path) -> None:
    """Raise when ``state_dir`` holds pending fault records (``chaos-infer lab up`` calls this).

    Raises:
        LabError: one line naming the pending faults and the command that undoes them.
    """
    pending = pending_faults(state_dir)
    if pending:
        what = "; ".join(describe(r) for r in pending[:5])
        more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
        raise LabError(
            f"{state_dir} has {len(pending)} pending fault(s) from a previous run ({what}{more}); "
            f"run `chaos-infer rollback --state-dir {state_dir}` first"
        )


def refuse_if_tampered(lab: Lab, records: list[dict[str, Any]]) -> None:
    """Check every record against the lab before anything is undone (``chaos-infer rollback``
    and a game day's start-up replay).

    Raises:
        LedgerRefused: one line: how many records do not belong to this lab, the first reason,
            and that nothing was undone.
    """
    refused = check_ledger(lab, records)
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise LedgerRefused(
            f"{lab.state_dir / FAULTS_FILE}: {refused[0]}{more}; nothing was undone: the ledger "
            "is data, not a plan; fix or remove the record by hand"
        )


def rollback(state_dir: Path) -> RollbackResult:
    """Undo every pending fault of the lab in ``state_dir`` (:meth:`Lab.clear_faults`).

    Works whether the lab still runs (a runner was killed and left it up) or not (each module's
    ``undo_fault`` copes with processes that are gone). Records whose undo fails stay in the
    ledger and are listed in ``failed``.

    Args:
        state_dir: the lab state directory (``lab.json``, ``faults.json``).

    Returns:
        A :class:`RollbackResult`; ``lab_found`` is False (and nothing is done) without ``lab.json``.

    Raises:
        LabError: the ledger or ``lab.json`` is unreadable.
        LedgerRefused: a record is not a fault of this lab (see :func:`refuse_if_tampered`);
            nothing was undone.
    """
    state_dir = Path(state_dir).resolve()
    result = RollbackResult(state_dir=state_dir, lab_found=(state_dir / LAB_FILE).exists())
    if not result.lab_found:
        return result
    result.pending = pending_faults(state_dir)
    lab = Lab.attach(state_dir)
    refuse_if_tampered(lab, result.pending)
    result.undone = lab.clear_faults()
    result.failed = [line for line in result.undone if "undo FAILED" in line]
    return result
