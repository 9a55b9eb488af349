"""Compatibility alias: the network-jitter drill's activities moved to its room.

They live in ``chaoslib_infer/drills/network_jitter/``; this module re-exports them so experiments
naming ``chaoslib_infer.activities.network_probes`` keep running. New experiments name the room's module.
"""

from __future__ import annotations

from chaoslib_infer.drills.network_jitter.probes import (
    duplicates_check,
)

__all__ = [
    "duplicates_check",
]
