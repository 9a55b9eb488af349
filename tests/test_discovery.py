"""Chaos Toolkit discovery (``chaos discover chaoslib-infer``) lists every public activity once,
with the right type, so experiments can be written from its output."""

from __future__ import annotations

import importlib
import pkgutil

import chaoslib_infer
import chaoslib_infer.activities


def test_discovery_lists_every_public_activity_of_every_activities_module() -> None:
    discovered = chaoslib_infer.discover()["activities"]
    seen = {(a["mod"], a["name"]) for a in discovered}
    assert len(seen) == len(discovered), "an activity is listed twice"
    expected = set()
    for info in pkgutil.iter_modules(chaoslib_infer.activities.__path__):
        name = f"chaoslib_infer.activities.{info.name}"
        module = importlib.import_module(name)
        expected |= {(name, fn) for fn in getattr(module, "__all__", [])}
    assert seen == expected


def test_mixed_module_types_follow_the_probe_list() -> None:
    types = {a["name"]: a["type"] for a in chaoslib_infer.discover()["activities"]}
    assert types["k8s_start_observation"] == "action"
    assert types["k8s_stop_observation"] == "action"
    assert types["k8s_ready_endpoints"] == "probe"
    assert types["k8s_wait_scale_out"] == "probe"
    assert types["k8s_oom_kill"] == "action"
