"""The field checks every ledger record's rebuild is made of (:mod:`chaoslib_infer.lab.registry`):
numbers, texts, ids and shapes; replica, node and pid names checked against the lab's own state
(``lab.json``, ``/proc``); :func:`base_record`, the fields every rebuilt record keeps; and
:class:`LedgerRefused`, raised (through :func:`refusal`) by any check that fails.

Split out of :mod:`chaoslib_infer.lab.registry` (its docstring states the policy), which keeps
one rebuilder per kind and the public surface, and re-exports :class:`LedgerRefused`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab.statedir import LabError

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "LedgerRefused",
    "MODE_RE",
    "TOKEN_RE",
    "base_record",
    "check_helper_pid",
    "check_int",
    "check_number",
    "check_own_pid",
    "check_replica",
    "check_replica_list",
    "check_text",
    "lab_nodes",
    "lab_pids",
    "lab_replicas",
    "refusal",
    "shorten",
]

_ID = re.compile(r"^[a-z][a-z0-9-]{0,40}-[0-9a-f]{8}$")
TOKEN_RE = re.compile(r"^nj[0-9a-f]{10}$")
MODE_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
_TEXT = re.compile(r"^[\x20-\x7e]{0,200}$")
_PID_MAX = 1 << 22
#: fields every rebuilt record keeps (bookkeeping: dates, the dead-man's retry state)
_COMMON = ("injected_at", "ttl_s", "deadman_retry_at", "deadman_error")


class LedgerRefused(LabError):
    """A ledger record that does not describe a fault of this lab; nothing of it is run."""


# --------------------------------------------------------------------------------------------
# field checks
# --------------------------------------------------------------------------------------------
def refusal(record: dict[str, Any], why: str) -> LedgerRefused:
    kind = record.get("kind")
    rid = record.get("id") or record.get("pid")
    label = " ".join(
        shorten(x) for x in (kind if kind is not None else "record", rid) if x is not None
    )
    return LedgerRefused(f"ledger record {label} refused: {why}")


def shorten(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return text if len(text) <= 60 else text[:57] + "..."


def check_number(record: dict[str, Any], key: str, required: bool = False) -> float | None:
    value = record.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise refusal(record, f"{key} must be a number, got {shorten(value)}")
    return float(value)


def check_int(record: dict[str, Any], key: str, value: Any, lo: int = 0, hi: int = _PID_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise refusal(record, f"{key} must be an integer in [{lo}, {hi}], got {shorten(value)}")
    return value


def check_text(record: dict[str, Any], key: str) -> str | None:
    """A free-text field kept for messages only (printable ASCII, 200 characters at most)."""
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not _TEXT.match(value):
        raise refusal(record, f"{key} must be a short printable text")
    return value


def lab_replicas(lab: Lab) -> dict[str, dict[str, Any]]:
    return {str(r.get("name")): dict(r) for r in lab.meta.get("replicas") or []}


def check_replica(record: dict[str, Any], lab: Lab, key: str = "replica", value: Any = None) -> str:
    name = record.get(key) if value is None else value
    known = lab_replicas(lab)
    if not isinstance(name, str) or name not in known:
        raise refusal(
            record,
            f"{key} {shorten(name)} is not a replica of this lab ({', '.join(known) or 'none'})",
        )
    return name


def check_replica_list(record: dict[str, Any], lab: Lab, key: str) -> list[str]:
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise refusal(record, f"{key} must be a list of replica names")
    return [check_replica(record, lab, key, v) for v in value]


def lab_nodes(lab: Lab) -> dict[str, dict[str, Any]]:
    return {str(n.get("name")): dict(n) for n in lab.meta.get("nodes") or []}


def lab_pids(lab: Lab) -> set[int]:
    """Every process in one of the lab's replica cgroups (``cgroup.procs``), now."""
    pids: set[int] = set()
    for rep in lab.meta.get("replicas") or []:
        try:
            text = (Path(str(rep.get("cgroup"))) / "cgroup.procs").read_text()
        except (OSError, ValueError):
            continue
        pids.update(int(x) for x in text.split() if x.isdigit())
    return pids


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields if fields and fields[0] not in ("Z", "X") else None


def _start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def check_own_pid(
    record: dict[str, Any], lab: Lab, key: str, pid: Any, start: Any, owned: set[int]
) -> int | None:
    """``pid`` when it is a live process of the lab; None when it is gone or reused (the
    recorded start time differs): nothing to undo there.

    Raises:
        LedgerRefused: a live process (same start time, when one is recorded) outside the lab.
    """
    pid = check_int(record, key, pid, 1)
    now = _start_time(pid)
    if now is None:
        return None
    if start is not None and str(start) != now:
        return None  # the recorded process is gone; the pid belongs to someone else now
    if pid not in owned:
        raise refusal(record, f"{key} {pid} is not a process of this lab (not in its cgroups)")
    return pid


def check_helper_pid(record: dict[str, Any], key: str) -> int:
    """A helper's pid (timer, shim, controller): the module recognises it by its command line."""
    value = record.get(key)
    return 0 if value in (None, 0) else check_int(record, key, value, 1)


def _check_id(record: dict[str, Any]) -> str | None:
    rid = record.get("id")
    if rid is None:
        return None
    if not isinstance(rid, str) or not _ID.match(rid) or not rid.startswith(f"{record['kind']}-"):
        raise refusal(record, f"id {shorten(rid)} is not a fault id of this lab")
    return rid


def base_record(record: dict[str, Any], module: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": record["kind"]}
    if module is not None:
        out["module"] = module
    rid = _check_id(record)
    if rid is not None:
        out["id"] = rid
    for key in _COMMON:
        if key == "deadman_error":
            if record.get(key) is not None:
                out[key] = str(record[key])[:300]
            continue
        value = check_number(record, key)
        if value is not None:
            out[key] = value
    return out
