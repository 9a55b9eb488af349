"""Kubernetes fault actions and rollbacks of every drill, under their historical module.

Compatibility alias and façade: each action lives in its drill's room
(``chaoslib_infer/drills/<drill>/k8s.py``) and is re-exported here, so experiments naming
``chaoslib_infer.activities.k8s`` keep running, and the safety checks keyed on this module
(:mod:`chaoslib_infer.k8s_preflight`, :mod:`chaoslib_infer.k8s_replay`) and
:mod:`chaoslib_infer.evidence.kinds.k8s_actions` keep finding them.
"""

from __future__ import annotations

from chaoslib_infer.drills.network_jitter.k8s import (
    k8s_network_jitter,
    k8s_remove_network_jitter,
)
from chaoslib_infer.drills.node_loss.k8s import (
    k8s_delete_model_node,
    k8s_drain_model_node,
    k8s_remove_node_taint,
    k8s_restore_node,
    k8s_taint_model_node,
    k8s_uncordon_node,
)
from chaoslib_infer.drills.oom_kill.k8s import (
    k8s_oom_kill,
    k8s_stop_memory_hog,
)
from chaoslib_infer.drills.quota_cut.k8s import (
    k8s_cut_quota,
    k8s_restore_quota,
)
from chaoslib_infer.drills.simultaneous_restarts.k8s import (
    k8s_simultaneous_restarts,
)
from chaoslib_infer.drills.upstream_timeout.k8s import (
    k8s_block_pod_ingress,
    k8s_freeze_model_server,
    k8s_restore_pod_ingress,
    k8s_thaw_model_server,
)
from chaoslib_infer.platforms.kubernetes.activity import ENV_TARGET as ENV_TARGET

__all__ = [
    "k8s_block_pod_ingress",
    "k8s_cut_quota",
    "k8s_delete_model_node",
    "k8s_drain_model_node",
    "k8s_freeze_model_server",
    "k8s_network_jitter",
    "k8s_oom_kill",
    "k8s_remove_network_jitter",
    "k8s_remove_node_taint",
    "k8s_restore_node",
    "k8s_restore_pod_ingress",
    "k8s_restore_quota",
    "k8s_simultaneous_restarts",
    "k8s_stop_memory_hog",
    "k8s_taint_model_node",
    "k8s_thaw_model_server",
    "k8s_uncordon_node",
]
