"""chaoslib-infer: chaos and disaster-recovery drills for LLM inference services.

Chaos Toolkit extension: experiments reference each drill's actions and probes in its room
(``chaoslib_infer.drills.<drill>.actions`` / ``probes`` / ``k8s``), the shared ones in
``chaoslib_infer.activities`` and the load control in ``chaoslib_infer.controls.load``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = [
    "ACTION_MODULES",
    "COMPAT_MODULES",
    "MIXED_MODULES",
    "PROBE_MODULES",
    "ROOMS",
    "SUPPORT_MODULES",
    "__version__",
    "discover",
]

#: The drills' rooms (:mod:`chaoslib_infer.drills`), in the registry's order.
ROOMS = (
    "node_loss",
    "oom_kill",
    "network_jitter",
    "traffic_spike",
    "upstream_timeout",
    "simultaneous_restarts",
    "quota_cut",
)
#: Modules whose ``__all__`` lists Chaos Toolkit actions: each room's lab and Kubernetes actions
#: (traffic-spike has no Kubernetes module of its own), then the shared ones.
ACTION_MODULES = (
    *(f"chaoslib_infer.drills.{room}.actions" for room in ROOMS),
    *(f"chaoslib_infer.drills.{room}.k8s" for room in ROOMS if room != "traffic_spike"),
    "chaoslib_infer.activities.lab",
    "chaoslib_infer.activities.engine_faults",
)
#: Modules whose ``__all__`` lists Chaos Toolkit probes: the rooms' own, then the shared ones.
PROBE_MODULES = (
    "chaoslib_infer.drills.node_loss.probes",
    "chaoslib_infer.drills.network_jitter.probes",
    "chaoslib_infer.drills.oom_kill.probes",
    "chaoslib_infer.activities.slo",
    "chaoslib_infer.activities.criteria",
    "chaoslib_infer.activities.health",
    "chaoslib_infer.activities.prometheus",
    "chaoslib_infer.activities.gpu",
)
#: Compatibility aliases: the old modules that re-export the rooms' activities (not listed by
#: :func:`discover`, which lists each activity once, under the module that defines it).
#: ``chaoslib_infer.activities.lab`` also defines the shared rollback ``clear_lab_faults``.
COMPAT_MODULES = (
    "chaoslib_infer.activities.capacity",
    "chaoslib_infer.activities.k8s",
    "chaoslib_infer.activities.lab_probes",
    "chaoslib_infer.activities.network",
    "chaoslib_infer.activities.network_probes",
    "chaoslib_infer.activities.node_loss",
    "chaoslib_infer.activities.node_loss_probes",
    "chaoslib_infer.activities.restarts",
    "chaoslib_infer.activities.upstream",
)
#: Helper modules the rooms and the activities share (their ``__all__`` lists helpers, not
#: activities); below the drills, in the lab and the Kubernetes plumbing (issue 22).
SUPPORT_MODULES = (
    "chaoslib_infer.lab.activity",
    "chaoslib_infer.lab.gateway_sampler",
    "chaoslib_infer.platforms.kubernetes.activity",
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
        A Chaos Toolkit discovery mapping (``extension``, ``activities``, ``system``): each
        activity once, under the module that defines it (a compatibility alias's re-exports are
        left out).
    """
    from chaoslib.discovery.discover import (
        discover_actions,
        discover_probes,
        initialize_discovery_result,
    )

    discovery: dict[str, Any] = initialize_discovery_result("chaoslib-infer", __version__, "infer")
    for module in ACTION_MODULES:
        discovery["activities"].extend(_defined_here(discover_actions(module)))
    for module in PROBE_MODULES:
        discovery["activities"].extend(_defined_here(discover_probes(module)))
    for module, probes in MIXED_MODULES.items():
        for activity in _defined_here(discover_actions(module)):
            if activity["name"] in probes:
                activity["type"] = "probe"
            discovery["activities"].append(activity)
    return discovery


def _defined_here(activities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The activities whose function is defined in the module they are listed under."""
    import importlib

    return [
        a
        for a in activities
        if getattr(getattr(importlib.import_module(a["mod"]), a["name"]), "__module__", None)
        == a["mod"]
    ]
