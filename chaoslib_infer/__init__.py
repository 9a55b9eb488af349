"""chaoslib-infer: chaos and disaster-recovery drills for LLM inference services.

Chaos Toolkit extension: experiments reference the actions and probes in
``chaoslib_infer.activities`` and the load control in ``chaoslib_infer.controls.load``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["ACTION_MODULES", "MIXED_MODULES", "PROBE_MODULES", "__version__", "discover"]

#: Modules whose ``__all__`` lists Chaos Toolkit actions.
ACTION_MODULES = (
    "chaoslib_infer.activities.lab",
    "chaoslib_infer.activities.network",
    "chaoslib_infer.activities.engine_faults",
    "chaoslib_infer.activities.capacity",
    "chaoslib_infer.activities.upstream",
    "chaoslib_infer.activities.restarts",
    "chaoslib_infer.activities.node_loss",
    "chaoslib_infer.activities.k8s",
)
#: Modules whose ``__all__`` lists Chaos Toolkit probes.
PROBE_MODULES = (
    "chaoslib_infer.activities.slo",
    "chaoslib_infer.activities.criteria",
    "chaoslib_infer.activities.lab_probes",
    "chaoslib_infer.activities.network_probes",
    "chaoslib_infer.activities.health",
    "chaoslib_infer.activities.node_loss_probes",
    "chaoslib_infer.activities.prometheus",
    "chaoslib_infer.activities.gpu",
)
#: Modules listing both kinds: ``{module: names of its probes}``; the rest are actions.
MIXED_MODULES = {
    "chaoslib_infer.activities.k8s_observe": frozenset(
        {"k8s_ready_endpoints", "k8s_restart_counts", "k8s_oomkilled_pods", "k8s_wait_scale_out"}
    ),
}


def discover(discover_system: bool = True) -> dict[str, Any]:
    """Describe this extension for ``chaos discover chaoslib-infer --no-install``.

    Args:
        discover_system: accepted for Chaos Toolkit compatibility; the lab has no system to probe.

    Returns:
        A Chaos Toolkit discovery mapping (``extension``, ``activities``, ``system``).
    """
    from chaoslib.discovery.discover import (
        discover_actions,
        discover_probes,
        initialize_discovery_result,
    )

    discovery: dict[str, Any] = initialize_discovery_result("chaoslib-infer", __version__, "infer")
    for module in ACTION_MODULES:
        discovery["activities"].extend(discover_actions(module))
    for module in PROBE_MODULES:
        discovery["activities"].extend(discover_probes(module))
    for module, probes in MIXED_MODULES.items():
        for activity in discover_actions(module):
            if activity["name"] in probes:
                activity["type"] = "probe"
            discovery["activities"].append(activity)
    return discovery
