"""One drill run in-process (:func:`chaoslib_infer.gameday.run_drill`) leaves the process as it
found it: the ``chaostoolkit`` logger (level, propagation, handlers), the SIGTERM handler, the two
chaoslib attributes the run replaces (:mod:`chaoslib_infer.chaoslib_hooks`) and ``os.environ``.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import chaoslib.activity
import chaoslib.run
import yaml

from chaoslib_infer.gameday import run_drill
from chaoslib_infer.plan import DrillSpec


def noop() -> str:
    """A Python action that does nothing."""
    return "done"


def test_a_drill_run_restores_the_global_state_it_changed(tmp_path: Path) -> None:
    experiment = {
        "title": "no-op",
        "description": "one action that does nothing",
        "method": [
            {
                "type": "action",
                "name": "noop",
                "provider": {"type": "python", "module": __name__, "func": "noop"},
            }
        ],
    }
    path = tmp_path / "noop.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    ctk = logging.getLogger("chaostoolkit")
    before = (ctk.level, ctk.propagate, list(ctk.handlers))
    term = signal.getsignal(signal.SIGTERM)
    exit_signals = chaoslib.run.exit_signals
    env = dict(os.environ)
    lines: list[str] = []
    entry = run_drill(
        DrillSpec("noop", path),
        tmp_path / "noop",
        None,
        "http://127.0.0.1:9",
        {"kind": "url", "url": "http://127.0.0.1:9", "engine": "unknown", "replicas": 0},
        {},
        lines.append,
    )
    assert entry["name"] == "noop" and (tmp_path / "noop" / "journal.json").is_file()
    assert "noop" in (tmp_path / "noop" / "chaostoolkit.log").read_text(encoding="utf-8")
    assert (ctk.level, ctk.propagate, list(ctk.handlers)) == before
    assert signal.getsignal(signal.SIGTERM) is term
    assert chaoslib.run.exit_signals is exit_signals
    assert chaoslib.activity.time is time
    assert dict(os.environ) == env
