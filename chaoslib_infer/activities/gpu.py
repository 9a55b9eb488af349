"""GPU probes: memory used share and utilisation, per device.

Node-side through NVML (:func:`chaoslib_infer.gpu.gpu_snapshot`): on a machine without NVML the
probes return ``{"available": False, "reason": ...}`` instead of failing the experiment, so a
tolerance can decide whether a missing GPU matters. Cluster-side through the DCGM exporter's metrics
in Prometheus (``DCGM_FI_DEV_FB_USED``/``DCGM_FI_DEV_FB_FREE``, ``DCGM_FI_DEV_GPU_UTIL``), with the
queries of the alert rules (:mod:`chaoslib_infer.prometheus`).

Thresholds from ``docs/definitions.md``: memory > 92%, utilisation > 95%.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import prometheus as pq
from chaoslib_infer.activities.prometheus import DEFAULT_TIMEOUT_S, prometheus_query
from chaoslib_infer.gpu import MEMORY_ALERT_RATIO, UTILISATION_ALERT_RATIO, gpu_snapshot

__all__ = [
    "dcgm_gpu_memory_used_ratio",
    "dcgm_gpu_utilization",
    "gpu_memory_used_ratio",
    "gpu_utilization",
]


def _per_device(device: int | None, key: str, threshold: float) -> dict[str, Any]:
    snap = gpu_snapshot(device)
    if not snap.get("available"):
        return {"available": False, "reason": snap.get("reason"), "devices": [], "value": None}
    rows = [{"index": d["index"], "uuid": d["uuid"], "value": d.get(key)} for d in snap["devices"]]
    values = [r["value"] for r in rows if r["value"] is not None]
    top = max(values) if values else None
    return {
        "available": True,
        "driver_version": snap.get("driver_version"),
        "devices": rows,
        "value": top,
        "threshold": threshold,
        "passed": None if top is None else top <= threshold,
    }


def gpu_memory_used_ratio(
    device: int | None = None, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """GPU memory used / total per device through NVML (ratios 0..1).

    Args:
        device: one device index, or ``None`` for all.
        configuration: Chaos Toolkit configuration (unused).

    Returns:
        ``{"available": True, "devices": [{"index", "uuid", "value"}], "value": the highest ratio,
        "threshold": 0.92, "passed": value <= 0.92}``, or ``{"available": False, "reason": ...,
        "value": None}`` without NVML. Never raises.
    """
    return _per_device(device, "memory_used_ratio", MEMORY_ALERT_RATIO)


def gpu_utilization(
    device: int | None = None, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """GPU utilisation (share of NVML's last sample period with a kernel running, 0..1) per device.

    Returns:
        Like :func:`gpu_memory_used_ratio`, with ``"threshold": 0.95``. Never raises.
    """
    return _per_device(device, "utilization_gpu_ratio", UTILISATION_ALERT_RATIO)


def dcgm_gpu_memory_used_ratio(
    url: str = "",
    selector: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """GPU memory used share per GPU from the DCGM exporter through Prometheus.

    Query: :func:`chaoslib_infer.prometheus.gpu_memory_ratio_query`.

    Returns:
        :func:`chaoslib_infer.activities.prometheus.prometheus_query`'s mapping (``value``: the
        fullest GPU) plus ``threshold`` 0.92 and ``passed``.

    Raises:
        ActivityFailed: Prometheus unreachable or the query failed.
    """
    return _ratio_check(
        pq.gpu_memory_ratio_query, MEMORY_ALERT_RATIO, url, selector, timeout_s, configuration
    )


def dcgm_gpu_utilization(
    url: str = "",
    selector: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """GPU utilisation share per GPU (``DCGM_FI_DEV_GPU_UTIL / 100``) through Prometheus.

    Returns:
        Like :func:`dcgm_gpu_memory_used_ratio`, with ``threshold`` 0.95.

    Raises:
        ActivityFailed: Prometheus unreachable or the query failed.
    """
    return _ratio_check(
        pq.gpu_utilisation_query, UTILISATION_ALERT_RATIO, url, selector, timeout_s, configuration
    )


def _ratio_check(
    build_query: Callable[[str], str],
    threshold: float,
    url: str,
    selector: str,
    timeout_s: float,
    configuration: dict[str, Any] | None,
) -> dict[str, Any]:
    """The probe both DCGM ratios are: ``build_query(selector)`` through Prometheus, ``passed``
    while the fullest GPU is at or under ``threshold`` (None: no value)."""
    try:
        query = build_query(selector)
    except ValueError as exc:
        raise ActivityFailed(f"prometheus: {exc}") from None
    out = prometheus_query(url, query, timeout_s, configuration)
    out["threshold"] = threshold
    out["passed"] = None if out["value"] is None else out["value"] <= threshold
    return out
