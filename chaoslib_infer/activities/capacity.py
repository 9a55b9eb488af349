"""Compatibility alias: the quota-cut and traffic-spike drills' activities moved to their rooms.

They live in ``chaoslib_infer/drills/quota_cut/`` and ``chaoslib_infer/drills/traffic_spike/``;
this module re-exports them so experiments
naming ``chaoslib_infer.activities.capacity`` keep running. New experiments name the room's module.
"""

from __future__ import annotations

from chaoslib_infer.drills.quota_cut.actions import (
    cut_replica_quota,
)
from chaoslib_infer.drills.traffic_spike.actions import (
    inject_traffic_spike,
    wait_for_spike_over,
)

__all__ = [
    "cut_replica_quota",
    "inject_traffic_spike",
    "wait_for_spike_over",
]
