"""Probes of the node-loss drill, from the lab's own ground truth (supervisord, HAProxy, the
engine ledger and HAProxy's request log), never from the client's records."""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.errors import ServiceFinding
from chaoslib_infer.lab import netns
from chaoslib_infer.lab.activity import attach_lab, last_fault

__all__ = ["replicas_in_service", "wait_for_replacements_serving"]


def replicas_in_service(configuration: dict[str, Any] | None = None) -> dict[str, Any]:
    """Capacity check: is every replica of the lab running and UP in the load balancer?

    A replica is in service when supervisord runs it (``RUNNING``) and HAProxy's health checks
    have it ``UP``. After a node loss this holds again only once the lost replicas run elsewhere.

    Args:
        configuration: Chaos Toolkit configuration (``infer_lab_dir``).

    Returns:
        ``{"metric": "replicas_in_service", "value" (count in service), "expected" (replicas),
        "passed", "missing" ([names]), "placement" ({replica: node} with nodes, else {})}``; use the
        tolerance ``{"type": "jsonpath", "path": "$.passed", "expect": true}``.

    Raises:
        ActivityFailed: no lab.
    """
    lab = attach_lab(configuration)
    status = lab.status()
    reps = [r for r in status.get("replicas", []) if not r.get("standby")]
    missing = [
        r["name"]
        for r in reps
        if r.get("state") != "RUNNING" or not str(r.get("haproxy_status") or "").startswith("UP")
    ]
    placement = {
        name: entry.get("node") for name, entry in netns.read_placement(lab.state_dir).items()
    }
    return {
        "metric": "replicas_in_service",
        "value": len(reps) - len(missing),
        "expected": len(reps),
        "passed": bool(reps) and not missing,
        "missing": missing,
        "placement": placement,
    }


def wait_for_replacements_serving(
    timeout_s: float = 30.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Wait until every replica lost with the last node loss serves a request again (ground truth).

    "Serves" is the lab's record of the first request that replica served after the loss (engine
    ledger / HAProxy request log, ``Lab.served``): normally on the spare node it was rescheduled
    onto; on its own node if that came back first.

    Args:
        timeout_s: seconds to wait before failing.
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"node" (lost), "fault_at", "replicas": {name: {"serving_at" (unix s), "node", "moved"}},
        "replacement_serving_s" (seconds from the loss until the last one served)}``.

    Raises:
        ActivityFailed: no node-loss fault in this run (a tool error).
        ServiceFinding: a lost replica did not serve within ``timeout_s`` (the drill fails; the
            message says where it is placed and whether rescheduling was blocked, e.g. no spare
            node).
    """
    lab = attach_lab(configuration)
    fault = last_fault(configuration, "node-loss")
    if fault is None:
        raise ActivityFailed("no node-loss fault recorded in this run; nothing to wait for")
    since = float(fault["fault_at"])
    lost = [str(r) for r in fault.get("replicas") or []]
    deadline = time.monotonic() + float(timeout_s)
    served: dict[str, float] = {}
    while True:
        for name in lost:
            if name not in served:
                t = lab.served(name, after=since)
                if t is not None:
                    served[name] = t
        if len(served) == len(lost):
            break
        if time.monotonic() > deadline:
            placement = netns.read_placement(lab.state_dir)
            blocked = [
                e
                for e in lab.events()
                if e.get("event") == "reschedule_blocked" and e.get("fault_id") == fault["fault_id"]
            ]
            where = ", ".join(
                f"{n} on {(placement.get(n) or {}).get('node')}" for n in lost if n not in served
            )
            why = f"; rescheduling blocked: {blocked[-1]['reason']}" if blocked else ""
            raise ServiceFinding(
                f"lost replicas not serving within {float(timeout_s):g} s of losing node "
                f"{fault['node']} ({where}; reschedule_after_s={fault.get('reschedule_after_s')}){why}"
            )
        time.sleep(0.1)
    placement = netns.read_placement(lab.state_dir)
    out = {
        name: {
            "serving_at": t,
            "node": (placement.get(name) or {}).get("node"),
            "moved": (placement.get(name) or {}).get("node") != fault["node"],
        }
        for name, t in served.items()
    }
    return {
        "node": fault["node"],
        "fault_at": since,
        "replicas": out,
        "replacement_serving_s": max(served.values()) - since if served else 0.0,
    }
