"""The target's HorizontalPodAutoscaler: which one, and its desired/current replicas."""

from __future__ import annotations

from typing import Any

from chaoslib_infer.platforms.kubernetes import call
from chaoslib_infer.platforms.kubernetes.observe.common import (
    SAMPLE_TIMEOUT_S,
)
from chaoslib_infer.platforms.kubernetes.target import K8sTarget


def find_hpa(autoscaling: Any, target: K8sTarget) -> str | None:
    """The HPA to watch: the target's ``hpa:`` (must exist), else the HPA of its Deployment.

    Args:
        autoscaling: ``kubernetes.client.AutoscalingV2Api``.
        target: the target (``hpa``, ``deployment``, ``namespace``).

    Returns:
        The HPA name, or None (no ``hpa:``, and no HPA's ``scaleTargetRef`` is the Deployment).

    Raises:
        K8sError: the named HPA is absent (404) or a call was refused (403).
    """
    ns = target.namespace
    if target.hpa:
        call(
            f"get horizontalpodautoscaler {ns}/{target.hpa}",
            autoscaling.read_namespaced_horizontal_pod_autoscaler,
            target.hpa,
            ns,
            _request_timeout=SAMPLE_TIMEOUT_S,
        )
        return target.hpa
    if not target.deployment:
        return None
    doc = call(
        f"list horizontalpodautoscalers in namespace {ns}",
        autoscaling.list_namespaced_horizontal_pod_autoscaler,
        ns,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    for hpa in sorted((doc or {}).get("items") or [], key=lambda h: h["metadata"]["name"]):
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind") == "Deployment" and ref.get("name") == target.deployment:
            return str(hpa["metadata"]["name"])
    return None


def hpa_state(autoscaling: Any, namespace: str, name: str) -> dict[str, Any]:
    """``{"name", "desired", "current", "min", "max", "last_scale_time"}`` of an HPA.

    Raises:
        K8sError: the GET failed.
    """
    doc = call(
        f"get horizontalpodautoscaler {namespace}/{name}",
        autoscaling.read_namespaced_horizontal_pod_autoscaler,
        name,
        namespace,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    status = doc.get("status") or {}
    spec = doc.get("spec") or {}
    return {
        "name": name,
        "desired": status.get("desiredReplicas"),
        "current": status.get("currentReplicas"),
        "min": spec.get("minReplicas"),
        "max": spec.get("maxReplicas"),
        "last_scale_time": status.get("lastScaleTime"),
    }
