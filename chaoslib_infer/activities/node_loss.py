"""Compatibility alias: the node-loss drill's activities moved to its room.

They live in ``chaoslib_infer/drills/node_loss/``; this module re-exports them so experiments
naming ``chaoslib_infer.activities.node_loss`` keep running. New experiments name the room's module.
"""

from __future__ import annotations

from chaoslib_infer.drills.node_loss.actions import (
    lose_node,
)

__all__ = [
    "lose_node",
]
