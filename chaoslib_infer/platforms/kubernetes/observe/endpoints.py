"""Ready and not-ready endpoints of the target's Service (EndpointSlices)."""

from __future__ import annotations

from typing import Any

from chaoslib_infer.platforms.kubernetes import call
from chaoslib_infer.platforms.kubernetes.observe.common import (
    SAMPLE_TIMEOUT_S,
)


def _endpoint_key(ep: dict[str, Any]) -> str:
    ref = ep.get("targetRef") or {}
    if ref.get("name"):
        return f"{ref.get('kind', 'Pod')}/{ref['name']}"
    return ",".join(ep.get("addresses") or []) or "?"


def list_endpoints(discovery: Any, namespace: str, service: str) -> dict[str, list[dict[str, Any]]]:
    """Ready and not-ready endpoints of ``service`` from its EndpointSlices.

    Args:
        discovery: ``kubernetes.client.DiscoveryV1Api``.
        namespace: the Service's namespace. service: its name.

    Returns:
        ``{"ready": [{"pod", "ip", "node"}], "not_ready": [...]}``, each sorted, one entry per pod
        (``pod`` None for an endpoint without a Pod ``targetRef``). Ready: ``conditions.ready``
        true or absent, and not ``terminating``. A pod listed ready in one slice and not ready in
        another (a slice not yet updated) counts as ready.

    Raises:
        K8sError: the LIST failed (403: RBAC ``endpointslices`` list missing).
    """
    doc = call(
        f"list endpointslices of service {namespace}/{service}",
        discovery.list_namespaced_endpoint_slice,
        namespace,
        label_selector=f"kubernetes.io/service-name={service}",
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    ready: dict[str, dict[str, Any]] = {}
    not_ready: dict[str, dict[str, Any]] = {}
    for sl in (doc or {}).get("items") or []:
        for ep in sl.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            ok = cond.get("ready") is not False and not cond.get("terminating")
            ref = ep.get("targetRef") or {}
            entry = {
                "pod": ref.get("name") if ref.get("kind", "Pod") == "Pod" else None,
                "ip": (ep.get("addresses") or [None])[0],
                "node": ep.get("nodeName"),
            }
            key = _endpoint_key(ep)
            if ok:
                ready[key] = entry
                not_ready.pop(key, None)
            elif key not in ready:
                not_ready[key] = entry
    return {
        "ready": [ready[k] for k in sorted(ready)],
        "not_ready": [not_ready[k] for k in sorted(not_ready)],
    }
