"""Probes of the oom-kill drill, from the lab's own ground truth (what the lab itself recorded),
never from the client's records."""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.errors import ServiceFinding
from chaoslib_infer.lab.activity import attach_lab, last_fault, pick_replica

__all__ = ["wait_for_replica_serving"]


def wait_for_replica_serving(
    replica: str = "auto",
    timeout_s: float = 60.0,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Wait until the replica hit by the last OOM kill serves a request again (lab ground truth).

    Args:
        replica: replica name, or ``"auto"`` for the replica of the last ``oom-kill`` fault.
        timeout_s: seconds to wait before failing.
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"replica", "fault_at", "serving_again_at" (unix s), "restart_s" (seconds from the fault
        to the first request served again)}``.

    Raises:
        ActivityFailed: no fault recorded (a tool error).
        ServiceFinding: the replica did not serve within ``timeout_s`` (the drill fails).
    """
    lab = attach_lab(configuration)
    fault = last_fault(configuration, "oom-kill")
    if fault is None:
        raise ActivityFailed("no oom-kill fault recorded in this run; nothing to wait for")
    name = fault["replica"] if replica in ("auto", "", None) else pick_replica(lab, replica)
    since = float(fault["fault_at"])
    deadline = time.monotonic() + float(timeout_s)
    while time.monotonic() < deadline:
        served = lab.served(name, after=since)
        if served is not None:
            return {
                "replica": name,
                "fault_at": since,
                "serving_again_at": served,
                "restart_s": served - since,
            }
        time.sleep(0.1)
    raise ServiceFinding(
        f"replica {name} did not serve a request within {timeout_s:.0f} s of the fault"
    )
