"""What the lab actions and probes share: the attached lab, the replica picked, the fault log.

Used by the rooms' lab actions and probes (``chaoslib_infer/drills/<drill>/actions.py``,
``probes.py``) and the shared activities (:mod:`chaoslib_infer.activities.engine_faults`,
:mod:`chaoslib_infer.activities.health`). The lab is found through ``infer_lab_dir`` in the
experiment's configuration (:mod:`chaoslib_infer.settings`); every injected fault is appended to
the drill's fault log (``<infer_run_dir>/faults.jsonl``) so figures can be computed after the run.
"""

from __future__ import annotations

import json
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.load.records import read_records

__all__ = ["attach_lab", "last_fault", "log_fault", "pick_replica", "run_records"]


def attach_lab(configuration: dict[str, Any] | None) -> Lab:
    """The running lab of ``infer_lab_dir`` (:meth:`chaoslib_infer.lab.fleet.Lab.attach`).

    Raises:
        ActivityFailed: no lab there (the :class:`LabError`'s message).
    """
    try:
        return Lab.attach(settings.lab_dir(configuration))
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc


def log_fault(configuration: dict[str, Any] | None, entry: dict[str, Any]) -> None:
    """Append ``entry`` (one JSON line) to the drill's fault log (``<infer_run_dir>/faults.jsonl``)."""
    with settings.faults_path(configuration).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()


def last_fault(configuration: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The last line of the fault log whose ``kind`` is ``kind`` (unparsable lines skipped), or
    None (no log, no such line)."""
    path = settings.faults_path(configuration)
    if not path.exists():
        return None
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("kind") == kind:
            last = entry
    return last


def pick_replica(lab: Lab, replica: str) -> str:
    """``replica`` checked against the lab's replicas; ``"auto"`` (or empty) is the first one.

    Raises:
        ActivityFailed: the lab has no replica, or none named ``replica``.
    """
    names = lab.replica_names()
    if replica in ("auto", "", None):
        if not names:
            raise ActivityFailed("the lab has no replica")
        return names[0]
    if replica not in names:
        raise ActivityFailed(f"unknown replica {replica!r}; the lab has {', '.join(names)}")
    return replica


def run_records(configuration: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The drill's load records so far (``<infer_run_dir>/records.jsonl``; [] before any)."""
    path = settings.records_path(configuration)
    return read_records(path) if path.exists() else []
