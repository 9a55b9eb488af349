"""Compatibility alias: the simultaneous-restarts drill's activities moved to its room.

They live in ``chaoslib_infer/drills/simultaneous_restarts/``; this module re-exports them so experiments
naming ``chaoslib_infer.activities.restarts`` keep running. New experiments name the room's module.
"""

from __future__ import annotations

from chaoslib_infer.drills.simultaneous_restarts.actions import (
    KIND as KIND,
)
from chaoslib_infer.drills.simultaneous_restarts.actions import (
    restart_replicas,
)

__all__ = [
    "restart_replicas",
]
