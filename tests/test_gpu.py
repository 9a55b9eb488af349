"""GPU probes through NVML: real NVML where present, a clear "not available" where not.

The real-library test runs on every machine: without a GPU (this project's CI) it checks the
"not available" result from the real ``pynvml``; on a GPU machine it checks the real figures. A
fake NVML module checks the per-device arithmetic exactly.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from chaoslib_infer import gpu
from chaoslib_infer.activities import gpu as gpu_probes


def test_real_nvml_or_clear_not_available() -> None:
    snap = gpu.gpu_snapshot()
    if not snap["available"]:
        assert snap["devices"] == []
        assert "NVML" in snap["reason"] or "pynvml" in snap["reason"]
        probe = gpu_probes.gpu_memory_used_ratio()
        assert probe == {
            "available": False,
            "reason": snap["reason"],
            "devices": [],
            "value": None,
        }
        assert gpu_probes.gpu_utilization()["available"] is False
        return
    assert snap["device_count"] >= 1
    for dev in snap["devices"]:
        assert 0 < dev["memory_total_bytes"]
        assert 0 <= dev["memory_used_bytes"] <= dev["memory_total_bytes"]
        assert dev["memory_used_ratio"] == pytest.approx(
            dev["memory_used_bytes"] / dev["memory_total_bytes"]
        )
        if dev["utilization_gpu_ratio"] is not None:
            assert 0.0 <= dev["utilization_gpu_ratio"] <= 1.0
    probe = gpu_probes.gpu_memory_used_ratio(device=0)
    assert probe["available"] is True
    assert [d["index"] for d in probe["devices"]] == [0]
    assert probe["value"] == pytest.approx(snap["devices"][0]["memory_used_ratio"])


class _NVMLError(Exception):
    pass


def _fake_nvml(
    devices: list[dict[str, Any]], init_error: Exception | None = None
) -> types.SimpleNamespace:
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise init_error

    def util(handle: int) -> Any:
        d = devices[handle]
        if d.get("util") is None:
            raise _NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=d["util"], memory=d["mem_util"])

    return types.SimpleNamespace(
        NVMLError=_NVMLError,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: devices[h]["name"],
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            total=devices[h]["total"], used=devices[h]["used"], free=0
        ),
        nvmlDeviceGetUtilizationRates=util,
    )


def test_fake_nvml_per_device_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 2**30
    fake = _fake_nvml(
        [
            {
                "name": b"NVIDIA H200",
                "total": 140 * gib,
                "used": 35 * gib,
                "util": 40,
                "mem_util": 10,
            },
            {"name": "NVIDIA H200", "total": 100 * gib, "used": 93 * gib, "util": None},
        ]
    )
    monkeypatch.setattr(gpu, "_load_nvml", lambda: fake)
    snap = gpu.gpu_snapshot()
    assert snap["available"] is True and snap["driver_version"] == "550.54.15"
    d0, d1 = snap["devices"]
    assert d0["name"] == "NVIDIA H200"
    assert d0["memory_used_ratio"] == 0.25
    assert d0["utilization_gpu_ratio"] == 0.40 and d0["utilization_memory_ratio"] == 0.10
    assert d0["memory_alert"] is False
    assert d1["memory_used_ratio"] == 0.93 and d1["memory_alert"] is True  # > 92%
    assert d1["utilization_gpu_ratio"] is None and "Not Supported" in d1["utilization_error"]
    assert fake.calls == ["init", "shutdown"]
    mem = gpu_probes.gpu_memory_used_ratio()
    assert mem["value"] == 0.93 and mem["passed"] is False and mem["threshold"] == 0.92
    one = gpu_probes.gpu_memory_used_ratio(device=0)
    assert one["value"] == 0.25 and one["passed"] is True
    util = gpu_probes.gpu_utilization()
    assert util["value"] == 0.40 and util["passed"] is True
    missing = gpu.gpu_snapshot(device=2)
    assert (
        missing["available"] is False
        and "no GPU device 2 (this machine has 2)" in missing["reason"]
    )
    assert fake.calls.count("init") == fake.calls.count("shutdown")


def test_no_library_no_driver_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_module() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu, "_load_nvml", no_module)
    snap = gpu.gpu_snapshot()
    assert snap == {
        "available": False,
        "reason": "pynvml not importable (No module named 'pynvml'); install nvidia-ml-py",
        "devices": [],
    }
    fake = _fake_nvml([], init_error=_NVMLError("Driver Not Loaded"))
    monkeypatch.setattr(gpu, "_load_nvml", lambda: fake)
    assert gpu.gpu_snapshot()["reason"] == "NVML not available: _NVMLError: Driver Not Loaded"
    empty = _fake_nvml([])
    monkeypatch.setattr(gpu, "_load_nvml", lambda: empty)
    assert gpu.gpu_snapshot()["reason"] == "NVML found no GPU device"
    assert empty.calls == ["init", "shutdown"]
