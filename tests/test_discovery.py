"""Chaos Toolkit discovery (``chaos discover chaoslib-infer``) lists every public activity once,
with the right type, so experiments can be written from its output."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import chaoslib_infer
import chaoslib_infer.activities
import chaoslib_infer.drills


def _activity_modules() -> list[str]:
    """Every module of ``chaoslib_infer.activities`` and every room's ``actions`` / ``probes`` /
    ``k8s`` module."""
    names = [
        f"chaoslib_infer.activities.{info.name}"
        for info in pkgutil.iter_modules(chaoslib_infer.activities.__path__)
    ]
    for room in pkgutil.iter_modules(chaoslib_infer.drills.__path__):
        if not room.ispkg:
            continue
        for part in ("actions", "probes", "k8s"):
            name = f"chaoslib_infer.drills.{room.name}.{part}"
            if importlib.util.find_spec(name) is not None:
                names.append(name)
    return names


def test_discovery_lists_every_public_activity_of_every_activities_module() -> None:
    discovered = chaoslib_infer.discover()["activities"]
    seen = {(a["mod"], a["name"]) for a in discovered}
    assert len(seen) == len(discovered), "an activity is listed twice"
    expected = set()
    skipped = set(chaoslib_infer.SUPPORT_MODULES)
    for name in _activity_modules():
        if name in skipped:
            continue
        module = importlib.import_module(name)
        # each activity under the module that defines it: a compatibility alias adds none
        expected |= {
            (name, fn)
            for fn in getattr(module, "__all__", [])
            if getattr(module, fn).__module__ == name
        }
    assert seen == expected
    # the rooms' activities are listed under their rooms: 7 actions, 6 k8s, 3 probes modules
    rooms = {m for m, _ in seen if m.startswith("chaoslib_infer.drills.")}
    assert len(rooms) == 16, sorted(rooms)


def test_compatibility_aliases_reexport_the_rooms_activities() -> None:
    """Every old module still offers what it offered (experiments name it by string)."""
    for name in chaoslib_infer.COMPAT_MODULES:
        module = importlib.import_module(name)
        assert module.__all__, name
        for fn in module.__all__:
            assert callable(getattr(module, fn)), (name, fn)
            assert getattr(module, fn).__module__.startswith("chaoslib_infer.drills."), (name, fn)


def test_mixed_module_types_follow_the_probe_list() -> None:
    types = {a["name"]: a["type"] for a in chaoslib_infer.discover()["activities"]}
    assert types["k8s_start_observation"] == "action"
    assert types["k8s_stop_observation"] == "action"
    assert types["k8s_ready_endpoints"] == "probe"
    assert types["k8s_wait_scale_out"] == "probe"
    assert types["k8s_oom_kill"] == "action"
