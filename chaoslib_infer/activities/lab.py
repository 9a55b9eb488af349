"""Actions and probes against the local lab (real processes, real cgroups, real HAProxy).

The lab is found through ``infer_lab_dir`` in the experiment's configuration (see
:mod:`chaoslib_infer.settings`); bring it up first with ``chaos-infer lab up`` or let
``chaos-infer gameday`` do it. Every injected fault is appended to the drill's fault log
(``<infer_run_dir>/faults.jsonl``) so figures can be computed after the run.
"""

from __future__ import annotations

import json
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.lab.fleet import Lab, LabError

__all__ = ["clear_lab_faults", "oom_kill_replica"]


def _lab(configuration: dict[str, Any] | None) -> Lab:
    try:
        return Lab.attach(settings.lab_dir(configuration))
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc


def _log_fault(configuration: dict[str, Any] | None, entry: dict[str, Any]) -> None:
    with settings.faults_path(configuration).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()


def _last_fault(configuration: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
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


def _pick_replica(lab: Lab, replica: str) -> str:
    names = lab.replica_names()
    if replica in ("auto", "", None):
        if not names:
            raise ActivityFailed("the lab has no replica")
        return names[0]
    if replica not in names:
        raise ActivityFailed(f"unknown replica {replica!r}; the lab has {', '.join(names)}")
    return replica


def oom_kill_replica(
    replica: str = "auto", timeout_s: float = 30.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """OOM-kill one replica's model-server process through memory pressure inside its own cgroup.

    A memory hog joins the replica's memory cgroup with ``oom_score_adj = -1000`` and allocates until
    the cgroup hits its limit, so the *kernel* OOM killer picks the model server (as it would pick a
    vLLM worker whose KV cache or a fragmented allocator outgrew the container limit). The hog frees
    its memory and exits once the cgroup's ``oom_kill`` counter rises; supervisord then restarts the
    server, paying its weight-load delay and warm-up.

    Args:
        replica: replica name (``r0``...) or ``"auto"`` for the first replica.
        timeout_s: seconds to wait for the kernel OOM kill before giving up (the hog is removed).
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"replica", "fault_at" (unix s), "oom_kills_before", "oom_kills_after", "killed_pid",
        "hog_pid", "cgroup"}``.

    Raises:
        ActivityFailed: no lab, unknown replica, or no OOM kill within ``timeout_s``.
    """
    lab = _lab(configuration)
    name = _pick_replica(lab, replica)
    try:
        result = lab.oom_kill(name, timeout_s=float(timeout_s))
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    _log_fault(configuration, {"kind": "oom-kill", **result})
    return result


def clear_lab_faults(configuration: dict[str, Any] | None = None) -> list[str]:
    """Rollback: undo every active lab fault (memory hogs, ...). Safe to call when none is active.

    Returns:
        Human-readable descriptions of what was undone (empty when nothing was active).
    """
    try:
        lab = Lab.attach(settings.lab_dir(configuration))
    except LabError:
        return []
    return lab.clear_faults()
