"""A drill's steady-state hypothesis as readable text (``junit.xml``), never a Python dict repr.

:func:`steady_state_outline` takes the hypothesis's title and its probes (name, tolerance) from
the Chaos Toolkit journal (``journal["experiment"]["steady-state-hypothesis"]``) into the
drill's ``summary.json`` entry (``steady_state``); :func:`hypothesis_lines` writes it with
whether it held before and after the fault.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["held_text", "hypothesis_lines", "steady_state_outline", "tolerance_text"]


def steady_state_outline(journal: dict[str, Any]) -> dict[str, Any] | None:
    """``{"title": ..., "probes": [{"name": ..., "tolerance": text}]}`` of the journal's
    experiment's steady-state hypothesis, or None when the journal holds none."""
    experiment = journal.get("experiment")
    ssh = experiment.get("steady-state-hypothesis") if isinstance(experiment, dict) else None
    if not isinstance(ssh, dict):
        return None
    probes = []
    for probe in ssh.get("probes") or []:
        if isinstance(probe, dict):
            probes.append(
                {
                    "name": str(probe.get("name", "")),
                    "tolerance": tolerance_text(probe.get("tolerance")),
                }
            )
        else:  # a reference to an activity declared elsewhere in the experiment
            probes.append({"name": str(probe), "tolerance": "as declared"})
    return {"title": str(ssh.get("title", "")), "probes": probes}


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def tolerance_text(tolerance: Any) -> str:
    """A Chaos Toolkit tolerance in words: ``== true``, ``one of [200, 201]``,
    ``$.passed == true`` (jsonpath), ``in [0, 1]`` (range), ``matches ^ok`` (regex),
    ``probe NAME`` (a probe as tolerance)."""
    if tolerance is None:
        return "none"
    if isinstance(tolerance, list):
        return f"one of {_value(tolerance)}"
    if not isinstance(tolerance, dict):
        return f"== {_value(tolerance)}"
    kind = tolerance.get("type")
    target = f"{tolerance['target']} " if tolerance.get("target") else ""
    if kind == "jsonpath":
        expect = f" == {_value(tolerance['expect'])}" if "expect" in tolerance else " matches"
        return f"{tolerance.get('path', '')}{expect}"
    if kind == "range":
        return f"{target}in {_value(tolerance.get('range'))}"
    if kind == "regex":
        return f"{target}matches {tolerance.get('pattern', '')}"
    if kind == "probe":
        return f"probe {tolerance.get('name', '')}"
    return json.dumps(tolerance, default=str, sort_keys=True)


def held_text(value: Any) -> str:
    """Whether one hypothesis check held: ``held``, ``did not hold`` or ``not evaluated``."""
    return "not evaluated" if value is None else ("held" if value else "did not hold")


def hypothesis_lines(entry: dict[str, Any]) -> list[str]:
    """A drill entry's hypothesis in two lines: its title and whether it held before and
    after the fault; its probes with their tolerances (the second line only when the entry
    carries the outline: entries written before it had only before/after)."""
    found, shape = entry.get("hypothesis"), entry.get("steady_state")
    hyp: dict[str, Any] = found if isinstance(found, dict) else {}
    outline: dict[str, Any] | None = shape if isinstance(shape, dict) else None
    title = f' "{outline["title"]}"' if outline and outline.get("title") else ""
    lines = [
        f"steady-state hypothesis{title}: before the fault {held_text(hyp.get('before'))}, "
        f"after it {held_text(hyp.get('after'))}"
    ]
    if outline and outline.get("probes"):
        lines.append(
            "probes: "
            + ", ".join(f"{p.get('name')} ({p.get('tolerance')})" for p in outline["probes"])
        )
    return lines
