"""The shared lab rollback :func:`clear_lab_faults`, and a compatibility alias.

``oom_kill_replica`` lives in the oom-kill drill's room
(:mod:`chaoslib_infer.drills.oom_kill.actions`) and is re-exported here so experiments naming
``chaoslib_infer.activities.lab`` keep running. The helpers the lab activities share (the attached
lab, the fault log) are public in :mod:`chaoslib_infer.lab.activity`.
"""

from __future__ import annotations

from typing import Any

from chaoslib_infer import settings
from chaoslib_infer.drills.oom_kill.actions import oom_kill_replica
from chaoslib_infer.lab.fleet import Lab, LabError

__all__ = ["clear_lab_faults", "oom_kill_replica"]


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
