"""The drills' registry: each drill's room holds its question, criteria, actions and figures, and
the registry's files exist (``chaoslib_infer/drills/registry.py``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import chaoslib_infer
from chaoslib_infer.activities import k8s as k8s_facade
from chaoslib_infer.drills.registry import DRILLS, drill_names
from chaoslib_infer.evidence.figures import kind_module
from chaoslib_infer.verdict import DRILL_CRITERIA, criteria_for

ROOT = Path(__file__).resolve().parent.parent
SEVEN = [
    "node-loss",
    "oom-kill",
    "network-jitter",
    "traffic-spike",
    "upstream-timeout",
    "simultaneous-restarts",
    "quota-cut",
]


def test_the_registry_lists_the_seven_drills_with_their_files() -> None:
    assert drill_names() == SEVEN
    for name, drill in DRILLS.items():
        room = drill.room.__name__
        assert room == f"chaoslib_infer.drills.{name.replace('-', '_')}"
        assert drill.question.endswith("?") and len(drill.question) > 40, name
        assert drill.question in (drill.room.__doc__ or "").replace("\n", " "), name
        for what in ("lab_experiment", "k8s_experiment", "runbook"):
            assert drill.path(ROOT, what).is_file(), (name, what)
        assert drill.figures.__name__ == f"{room}.figures"
        assert callable(drill.figures.compute)
        assert kind_module(name) is drill.figures


def test_each_drills_criteria_come_from_its_room() -> None:
    assert list(DRILL_CRITERIA) == SEVEN
    for name, drill in DRILLS.items():
        own = importlib.import_module(f"{drill.room.__name__}.criteria")
        assert DRILL_CRITERIA[name] == list(own.CRITERIA)
        assert any(c.key for c in own.CRITERIA), f"{name}: no key criterion"
        judged = {c.name for c in criteria_for(name)}
        assert {c.name for c in own.CRITERIA} <= judged
        assert not (drill.dropped_common & judged), name


def test_each_room_offers_its_actions_and_the_kubernetes_facade_reexports_them() -> None:
    for name, drill in DRILLS.items():
        room = drill.room.__name__
        actions = importlib.import_module(f"{room}.actions")
        assert actions.__all__, name
        assert f"{room}.actions" in chaoslib_infer.ACTION_MODULES
        if name == "traffic-spike":  # the spike is the load profile: no Kubernetes fault
            continue
        k8s = importlib.import_module(f"{room}.k8s")
        assert k8s.__all__, name
        for fn in k8s.__all__:
            assert getattr(k8s_facade, fn) is getattr(k8s, fn), (name, fn)
            assert fn in k8s_facade.__all__
