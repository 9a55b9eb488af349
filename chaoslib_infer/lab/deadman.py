"""Dead-man switch: undo every fault whose time to live has run out, from outside the runner.

Run by the lab's supervisord as ``[program:watchdog]``::

    python -m chaoslib_infer.lab.deadman --state-dir STATE_DIR [--interval-s 0.5]

Every fault record in the lab's ledger (``faults.json``, see :mod:`chaoslib_infer.lab.ledger`)
carries ``injected_at`` (unix s) and ``ttl_s`` (seconds; :data:`DEFAULT_FAULT_TTL_S` when absent).
Once ``injected_at + ttl_s`` has passed, the watchdog claims the record (removes it from the ledger
under the ledger's lock, so a concurrent rollback never undoes it twice), undoes it through the
record's module ``undo_fault(lab, record)`` (or kills the memory hog of a module-less ``oom-kill``
record) and appends ``{"event": "fault", "phase": "expired", ...}`` to ``events.jsonl``.

The watchdog runs as root and the ledger sits in a folder others may write, so a record is never
run as it stands: :mod:`chaoslib_infer.lab.registry` rebuilds it from the fields that check out
against the lab (registered module and kind, this lab's replica/node/namespace names, pids in the
lab's cgroups, no stored argv). A record that does not is refused (``undo REFUSED: ...`` in the
log, nothing of it runs) and put back, like a failed undo, for a human to look at.

Because it runs under the lab's supervisord, in the lab's control cgroup, it keeps working when the
process that injected the fault (``chaos-infer gameday``, ``chaos run``) is killed with SIGKILL,
and supervisord restarts it if it dies. A failed undo puts the record back (with
``deadman_error`` and a retry time ``deadman_retry_at`` 5 s later) and is logged; it is retried.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import registry
from chaoslib_infer.lab.fleet import DEFAULT_FAULT_TTL_S, Lab, LabError
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event

__all__ = ["deadline", "expire_once", "main", "undo_record"]

RETRY_S = 5.0


def deadline(record: dict[str, Any]) -> float:
    """Unix time after which ``record`` must be undone: ``injected_at + ttl_s``.

    A record without ``injected_at`` expires at once (it cannot be dated); one without ``ttl_s``
    gets :data:`DEFAULT_FAULT_TTL_S`; a pending retry (``deadman_retry_at``) postpones it.
    """
    try:
        injected = float(record.get("injected_at") or 0.0)
        ttl = float(record.get("ttl_s") or DEFAULT_FAULT_TTL_S)
    except (TypeError, ValueError):
        return 0.0
    return max(injected + ttl, float(record.get("deadman_retry_at") or 0.0))


def undo_record(lab: Lab, record: dict[str, Any]) -> str:
    """Undo one fault record (the same way :meth:`Lab.clear_faults` does) and describe it.

    The record is rebuilt from validated fields first (:func:`chaoslib_infer.lab.registry.
    validate`): only a registered fault module is imported, only names, pids and namespaces of
    this lab reach it, no stored argv is run.

    Raises:
        LedgerRefused: the record is not a fault of this lab (nothing ran).
        Exception: whatever the fault module's ``undo_fault`` raises.
    """
    note = registry.undo(lab, record)
    if note:
        return note
    if record.get("module"):
        return f"{record.get('kind')} {record.get('id')}: nothing left to undo"
    return f"{record.get('kind')} on {record.get('replica')}: nothing left to undo"


def expire_once(lab: Lab, now: float | None = None) -> list[str]:
    """Undo every fault of ``lab`` whose deadline has passed; return one line per fault.

    Args:
        lab: the lab (its ``faults.json`` ledger and ``events.jsonl``).
        now: the current unix time (default ``time.time()``).

    Returns:
        ``"expired <kind> <id> (ttl N s): <what was undone>"`` lines (``undo FAILED`` on failure).
    """
    now = time.time() if now is None else now
    with lab.edit_faults() as faults:
        due = [f for f in faults if deadline(f) <= now]
        if due:
            ids = {id(f) for f in due}
            faults[:] = [f for f in faults if id(f) not in ids]
    lines: list[str] = []
    for record in due:
        fid = record.get("id") or record.get("pid")
        try:
            note = undo_record(lab, record)
            ok = True
        except Exception as exc:  # keep the record: a fault must never be forgotten
            ok = False
            if isinstance(exc, registry.LedgerRefused):  # nothing of it ran
                note = f"undo REFUSED: {exc}"
            else:
                note = f"undo FAILED: {type(exc).__name__}: {exc}"
            retry = {
                **record,
                "deadman_error": note,
                "deadman_retry_at": time.time() + RETRY_S,
            }
            with lab.edit_faults() as faults:
                faults.append(retry)
        lines.append(f"expired {record.get('kind')} {fid} (ttl {record.get('ttl_s')} s): {note}")
        if ok:
            append_event(
                lab.state_dir / EVENTS_FILE,
                {
                    "t": time.time(),
                    "event": "fault",
                    "kind": record.get("kind"),
                    "replica": record.get("replica"),
                    "phase": "expired",
                    "fault_id": record.get("id"),
                    "injected_at": record.get("injected_at"),
                    "ttl_s": record.get("ttl_s"),
                    "note": note,
                },
            )
    return lines


def _log(msg: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} deadman: {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Watch the lab in ``--state-dir`` until SIGTERM/SIGINT (or once, with ``--once``).

    Returns:
        0 on a clean stop; 2 on bad arguments.
    """
    parser = argparse.ArgumentParser(
        prog="python -m chaoslib_infer.lab.deadman",
        description="Undo lab faults whose ttl_s has passed (the lab's dead-man switch).",
    )
    parser.add_argument("--state-dir", required=True, type=Path, help="lab state directory")
    parser.add_argument(
        "--interval-s", type=float, default=0.5, help="seconds between checks (0.5)"
    )
    parser.add_argument("--once", action="store_true", help="check once and exit")
    args = parser.parse_args(argv)
    if not args.interval_s > 0:
        parser.error("--interval-s must be > 0")
    stop: list[int] = []

    def _stop(signum: int, frame: Any) -> None:
        stop.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    _log(f"watching {args.state_dir} every {args.interval_s:g} s")
    lab: Lab | None = None
    while not stop:
        try:
            lab = lab or Lab.attach(args.state_dir)
            for line in expire_once(lab):
                _log(line)
        except LabError as exc:
            _log(f"cannot check: {exc}")
        except Exception as exc:  # never die on one bad tick: supervisord would have to respawn us
            _log(f"check failed: {type(exc).__name__}: {exc}")
        if args.once:
            break
        time.sleep(args.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
