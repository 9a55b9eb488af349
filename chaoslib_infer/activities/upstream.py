"""Compatibility alias: the upstream-timeout drill's activities moved to its room.

They live in ``chaoslib_infer/drills/upstream_timeout/``; this module re-exports them so experiments
naming ``chaoslib_infer.activities.upstream`` keep running. New experiments name the room's module.
"""

from __future__ import annotations

from chaoslib_infer.drills.upstream_timeout.actions import (
    KIND as KIND,
)
from chaoslib_infer.drills.upstream_timeout.actions import (
    freeze_replica,
    thaw_replicas,
)

__all__ = [
    "freeze_replica",
    "thaw_replicas",
]
