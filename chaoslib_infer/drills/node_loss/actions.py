"""Node loss (drill 1 of the list: "a compute node drops; do instances move to spare nodes, and how
long is the interruption?").

The lab must run with nodes (``Lab.up(..., nodes=N)``, ``chaos-infer lab up --nodes N``, or
``nodes: 3`` in the plan's ``lab:`` section): each node is a network namespace holding some
replicas, plus an empty spare node. :func:`lose_node` cuts one node's network and kills its
replicas; the lab's node controller reschedules them onto the spare node after the eviction grace
period and brings the node back after ``down_s`` (see :mod:`chaoslib_infer.lab.nodes`). The fault
is recorded with ``lab.add_fault`` before injection; the ``clear-lab-faults`` rollback undoes it
(node back, every replica running and in HAProxy). The probes are in
:mod:`chaoslib_infer.activities.node_loss_probes`.
"""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab.activity import attach_lab, log_fault
from chaoslib_infer.lab.fleet import LabError

__all__ = ["lose_node"]


def lose_node(
    node: str = "auto",
    down_s: float = 60.0,
    reschedule_after_s: float = 3.0,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lose one lab node: cut its network and SIGKILL its replicas, as when a compute node drops.

    Its replicas die without answering (in-flight streams stall until the client gives up); HAProxy
    ejects them when its health checks fail. After ``reschedule_after_s`` (the orchestrator's
    eviction grace period) the lab starts the lost replicas on a spare node and points HAProxy at
    their new address; after ``down_s`` the node comes back by itself (dead-man timer), empty.

    Args:
        node: node name (``n0``...) or ``"auto"``: the first up node holding a replica.
        down_s: seconds the node stays down unless the rollback brings it back first.
        reschedule_after_s: seconds from the loss until the lost replicas are started elsewhere.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"fault_id", "node", "ns", "fault_at" (unix s, network cut), "killed_at", "replicas" (lost),
        "killed_pids", "down_s", "reschedule_after_s", "controller_pid", "spare" (free spare node
        at injection, or None), "state_dir"}``; also appended to the drill's fault log as kind
        ``node-loss``.

    Raises:
        ActivityFailed: no lab, a lab without nodes, unknown or empty node, bad durations, or the
            injection failed (what was done is undone).
    """
    lab = attach_lab(configuration)
    try:
        down = float(down_s)
        grace = float(reschedule_after_s)
    except (TypeError, ValueError):
        raise ActivityFailed(
            f"down_s and reschedule_after_s must be numbers, got {down_s!r}, {reschedule_after_s!r}"
        ) from None
    try:
        result = lab.lose_node(str(node or "auto"), down_s=down, reschedule_after_s=grace)
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    log_fault(configuration, {"kind": "node-loss", **result})
    return result
