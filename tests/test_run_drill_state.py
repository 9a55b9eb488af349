"""One drill run in-process (:func:`chaoslib_infer.gameday.run_drill`) leaves the process as it
found it: the ``chaostoolkit`` logger (level, propagation, handlers), the SIGTERM handler, the two
chaoslib attributes the run replaces (:mod:`chaoslib_infer.chaoslib_hooks`) and ``os.environ``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import chaoslib.activity
import chaoslib.run
import yaml

from chaoslib_infer.gameday import run_drill
from chaoslib_infer.plan import DrillSpec


def noop() -> str:
    """A Python action that does nothing."""
    return "done"


def _noop_action(name: str) -> dict[str, object]:
    """An action called ``name`` that runs :func:`noop`."""
    return {
        "type": "action",
        "name": name,
        "provider": {"type": "python", "module": __name__, "func": "noop"},
    }


def _run(experiment: Path, drill_dir: Path, lines: list[str]) -> dict[str, Any]:
    """Run the experiment as drill ``drill_dir.name`` against an unused loopback URL."""
    url = "http://127.0.0.1:9"
    target = {"kind": "url", "url": url, "engine": "unknown", "replicas": 0}
    return run_drill(
        DrillSpec(drill_dir.name, experiment), drill_dir, None, url, target, {}, lines.append
    )


def test_a_drill_run_restores_the_global_state_it_changed(tmp_path: Path) -> None:
    experiment = {
        "title": "no-op",
        "description": "one action that does nothing",
        "method": [_noop_action("noop")],
    }
    path = tmp_path / "noop.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    ctk = logging.getLogger("chaostoolkit")
    before = (ctk.level, ctk.propagate, list(ctk.handlers))
    term = signal.getsignal(signal.SIGTERM)
    exit_signals = chaoslib.run.exit_signals
    env = dict(os.environ)
    lines: list[str] = []
    entry = _run(path, tmp_path / "noop", lines)
    assert entry["name"] == "noop" and (tmp_path / "noop" / "journal.json").is_file()
    assert "noop" in (tmp_path / "noop" / "chaostoolkit.log").read_text(encoding="utf-8")
    assert (ctk.level, ctk.propagate, list(ctk.handlers)) == before
    assert signal.getsignal(signal.SIGTERM) is term
    assert chaoslib.run.exit_signals is exit_signals
    assert chaoslib.activity.time is time
    assert dict(os.environ) == env


def after_experiment_control(**kwargs: object) -> None:
    """A control's after-hook interrupted (Ctrl-C in the load's after window, past the
    rollbacks): chaoslib does not catch it."""
    raise KeyboardInterrupt


def test_an_interrupt_past_the_rollbacks_keeps_the_drill_judged_as_aborted(tmp_path: Path) -> None:
    """Found by a new-user trial: SIGINT in the after window left ``summary.json`` with no drill
    entry (what the drill had measured was lost). The drill is judged from the journal saved so
    far, rollbacks included, as aborted."""
    experiment = {
        "title": "interrupted after its rollbacks",
        "description": "one action, one rollback, a control interrupted after the experiment",
        "controls": [{"name": "interrupts", "provider": {"type": "python", "module": __name__}}],
        "method": [_noop_action("noop")],
        "rollbacks": [_noop_action("undo")],
    }
    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    lines: list[str] = []
    entry = _run(path, tmp_path / "late", lines)
    assert entry["status"] == "aborted", entry.get("reasons")
    assert entry["reasons"][0] == "stopped: the run was interrupted"
    assert "drill late: interrupted; judging what was recorded" in lines
    assert "drill late: residue check: no fault left" in lines  # said on the console too
    journal = json.loads((tmp_path / "late" / "journal.json").read_text(encoding="utf-8"))
    assert journal["status"] == "interrupted"
    assert [r["activity"]["name"] for r in journal["rollbacks"]] == ["undo"]
