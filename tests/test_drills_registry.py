"""The drills' registry: each drill's room holds its question, criteria, actions and figures, and
the registry's files exist (``chaoslib_infer/drills/registry.py``)."""

from __future__ import annotations

import importlib
from pathlib import Path

from labutil import SEVEN_DRILLS as SEVEN

import chaoslib_infer
from chaoslib_infer.activities import k8s as k8s_facade
from chaoslib_infer.drills.registry import DRILLS, drill_names
from chaoslib_infer.evidence.figures import kind_module
from chaoslib_infer.verdict import DRILL_CRITERIA, criteria_for

ROOT = Path(__file__).resolve().parent.parent


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


def test_the_cli_and_the_runbooks_find_a_drills_files_through_the_registry(
    tmp_path: Path, monkeypatch
) -> None:
    """A drill's experiment and runbook are its registry row's, under a stand-in folder
    ($CHAOS_INFER_EXPERIMENTS, a runbooks folder); an operator's own experiment still lists."""
    from dataclasses import replace
    from pathlib import PurePosixPath
    from types import MappingProxyType

    from click.testing import CliRunner

    from chaoslib_infer.cli.drill import drill
    from chaoslib_infer.drills import registry
    from chaoslib_infer.evidence.runbooks import runbook_path

    oom = DRILLS["oom-kill"]
    assert oom.path_in(tmp_path, "k8s_experiment") == tmp_path / "k8s" / "oom-kill.yaml"
    assert runbook_path(tmp_path, "oom-kill") == tmp_path / "oom-kill.md"
    assert runbook_path(tmp_path, "my-own") == tmp_path / "my-own.md"
    moved = replace(
        oom,
        lab_experiment=PurePosixPath("experiments/rooms/oom.yaml"),
        runbook=PurePosixPath("runbooks/rooms/oom.md"),
    )
    monkeypatch.setattr(registry, "DRILLS", MappingProxyType({**DRILLS, "oom-kill": moved}))
    assert runbook_path(tmp_path, "oom-kill") == tmp_path / "rooms" / "oom.md"
    (tmp_path / "rooms").mkdir()
    (tmp_path / "rooms" / "oom.yaml").write_text("title: moved oom\n")
    (tmp_path / "my-own.yaml").write_text("title: mine\n")
    monkeypatch.setenv("CHAOS_INFER_EXPERIMENTS", str(tmp_path))
    out = CliRunner().invoke(drill, ["list"]).output.splitlines()
    assert [line.split()[0] for line in out] == ["my-own", "oom-kill"]
    assert out[1].endswith("moved oom")
    res = CliRunner().invoke(drill, ["run", "nope"])
    assert "unknown drill 'nope'; known: my-own, oom-kill" in res.output
