"""Compatibility alias: the oom-kill drill's probe moved to its room.

It lives in :mod:`chaoslib_infer.drills.oom_kill.probes`; this module re-exports it so experiments
naming ``chaoslib_infer.activities.lab_probes`` keep running. New experiments name the room's module.
"""

from __future__ import annotations

from chaoslib_infer.drills.oom_kill.probes import wait_for_replica_serving

__all__ = ["wait_for_replica_serving"]
