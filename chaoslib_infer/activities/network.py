"""Compatibility alias: the network-jitter drill's activities moved to its room.

They live in ``chaoslib_infer/drills/network_jitter/``; this module re-exports them so experiments
naming ``chaoslib_infer.activities.network`` keep running. New experiments name the room's module.

The lab's fault ledger names this module (``FAULT_MODULE``,
:data:`chaoslib_infer.lab.registry.FAULT_MODULES`): its ``fault_active`` / ``undo_fault`` are
re-exported too.
"""

from __future__ import annotations

from chaoslib_infer.drills.network_jitter.actions import (
    FAULT_KIND as FAULT_KIND,
)
from chaoslib_infer.drills.network_jitter.actions import (
    FAULT_MODULE as FAULT_MODULE,
)
from chaoslib_infer.drills.network_jitter.actions import (
    fault_active as fault_active,
)
from chaoslib_infer.drills.network_jitter.actions import (
    inject_network_jitter,
    remove_network_jitter,
)
from chaoslib_infer.drills.network_jitter.actions import (
    undo_fault as undo_fault,
)

__all__ = [
    "inject_network_jitter",
    "remove_network_jitter",
]
