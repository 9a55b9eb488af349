"""GPU state through NVML (``pynvml``, from the ``nvidia-ml-py`` distribution).

:func:`gpu_snapshot` reads, per device: memory used / total (bytes), the memory used ratio, and the
utilisation rates NVML samples over its last period (GPU busy share and memory-controller busy
share, as ratios 0..1). On a machine without NVML (no driver, no GPU, no ``pynvml``) it returns
``{"available": False, "reason": "..."}`` instead of raising: a drill on a CPU-only box still runs,
and its evidence says why there is no GPU figure.

Thresholds (``docs/definitions.md``, "Alert table"): GPU memory > 92% for 5 min, GPU
utilisation > 95% for 10 min. Cluster-side, the same figures come from the DCGM exporter through
Prometheus (``DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)`` and
``DCGM_FI_DEV_GPU_UTIL / 100``; see :mod:`chaoslib_infer.prometheus`).
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

__all__ = [
    "MEMORY_ALERT_RATIO",
    "UTILISATION_ALERT_RATIO",
    "gpu_snapshot",
    "unavailable",
]

#: The GPU memory alert threshold (share of memory used).
MEMORY_ALERT_RATIO = 0.92
#: The GPU utilisation watch threshold (share of time busy).
UTILISATION_ALERT_RATIO = 0.95

_LOCK = threading.Lock()


def unavailable(reason: str) -> dict[str, Any]:
    """The "no GPU figures here" result: ``{"available": False, "reason": reason, "devices": []}``."""
    return {"available": False, "reason": reason, "devices": []}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _load_nvml() -> ModuleType:
    return importlib.import_module("pynvml")


def _device(nvml: ModuleType, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    total = int(mem.total)
    used = int(mem.used)
    out: dict[str, Any] = {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "memory_used_bytes": used,
        "memory_total_bytes": total,
        "memory_used_ratio": (used / total) if total > 0 else None,
    }
    try:
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        out["utilization_gpu_ratio"] = float(util.gpu) / 100.0
        out["utilization_memory_ratio"] = float(util.memory) / 100.0
    except nvml.NVMLError as exc:  # e.g. NOT_SUPPORTED on some MIG slices
        out["utilization_gpu_ratio"] = None
        out["utilization_memory_ratio"] = None
        out["utilization_error"] = _text(exc)
    out["memory_alert"] = (
        out["memory_used_ratio"] is not None and out["memory_used_ratio"] > MEMORY_ALERT_RATIO
    )
    out["utilization_alert"] = (
        out["utilization_gpu_ratio"] is not None
        and out["utilization_gpu_ratio"] > UTILISATION_ALERT_RATIO
    )
    return out


def gpu_snapshot(device: int | None = None) -> dict[str, Any]:
    """Read every GPU's memory and utilisation through NVML, or say why it cannot.

    Args:
        device: only this device index (``None``: all devices).

    Returns:
        ``{"available": True, "driver_version": str, "device_count": int, "devices": [{"index",
        "name", "uuid", "memory_used_bytes", "memory_total_bytes", "memory_used_ratio",
        "utilization_gpu_ratio", "utilization_memory_ratio", "memory_alert",
        "utilization_alert"}]}``; ratios are 0..1 (NVML reports utilisation in percent over its
        sample period, 1/6 s to 1 s depending on the product). Without NVML, or for a device
        index that does not exist: ``{"available": False, "reason": "...", "devices": []}``.
        Never raises for a missing library, driver or device.
    """
    try:
        nvml = _load_nvml()
    except ImportError as exc:
        return unavailable(f"pynvml not importable ({exc}); install nvidia-ml-py")
    nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    with _LOCK:  # nvmlInit/nvmlShutdown are reference counted; keep pairs together
        try:
            nvml.nvmlInit()
        except nvml_error as exc:
            return unavailable(f"NVML not available: {type(exc).__name__}: {_text(exc)}")
        except OSError as exc:
            return unavailable(f"NVML not available: {exc}")
        try:
            count = int(nvml.nvmlDeviceGetCount())
            indices = list(range(count)) if device is None else [int(device)]
            if device is not None and not 0 <= int(device) < count:
                return unavailable(f"no GPU device {device} (this machine has {count})")
            if count == 0:
                return unavailable("NVML found no GPU device")
            return {
                "available": True,
                "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
                "device_count": count,
                "devices": [_device(nvml, i) for i in indices],
            }
        except nvml_error as exc:
            return unavailable(f"NVML query failed: {type(exc).__name__}: {_text(exc)}")
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml_error:
                pass
