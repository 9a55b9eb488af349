"""The nodes the target's pods run on: readiness and cordon state, one GET per node."""

from __future__ import annotations

from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call
from chaoslib_infer.platforms.kubernetes.observe.common import (
    SAMPLE_TIMEOUT_S,
)


def node_state(core: Any, name: str) -> dict[str, Any]:
    """``{"ready": "True" | "False" | "Unknown" | "absent", "unschedulable": bool}`` of a node.

    Raises:
        K8sError: the GET failed with anything but 404 (absent).
    """
    try:
        doc = call(f"get node {name}", core.read_node, name, _request_timeout=SAMPLE_TIMEOUT_S)
    except K8sError as exc:
        if exc.status == 404:
            return {"ready": "absent", "unschedulable": False}
        raise
    ready = next(
        (
            str(c.get("status"))
            for c in (doc.get("status") or {}).get("conditions") or []
            if c.get("type") == "Ready"
        ),
        "Unknown",
    )
    return {"ready": ready, "unschedulable": bool((doc.get("spec") or {}).get("unschedulable"))}
