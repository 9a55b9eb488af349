"""Judge a Chaos Toolkit journal: never trust ``chaos run``'s exit code.

``chaos run`` exits 0 when the steady-state hypothesis fails *before* the method (the method is
skipped) and when an action raises. The verdict of a drill is read from the journal instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "JOURNAL_FILE",
    "drill_status",
    "hypothesis_results",
    "failed_activities",
    "method_findings",
    "read_journal",
]

#: A drill's Chaos Toolkit journal in its folder (saved as the run goes, then whole at its end).
JOURNAL_FILE = "journal.json"

# how a ServiceFinding reads in the journal: Chaos Toolkit wraps it as
# "chaoslib.exceptions.ActivityFailed: chaoslib_infer.errors.ServiceFinding: <message>"
_FINDING = "chaoslib_infer.errors.ServiceFinding: "


def read_journal(drill_dir: Path) -> dict[str, Any] | None:
    """The drill's journal (``drill_dir/journal.json``), or None when there is none, it cannot
    be read or it is not a JSON object."""
    try:
        data = json.loads((drill_dir / JOURNAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def hypothesis_results(journal: dict[str, Any]) -> dict[str, bool | None]:
    """Return ``{"before": bool|None, "after": bool|None}``: whether each hypothesis held.

    ``None`` means that hypothesis did not run (e.g. the run was interrupted before it).
    """
    states = journal.get("steady_states") or {}
    out: dict[str, bool | None] = {}
    for phase in ("before", "after"):
        entry = states.get(phase)
        out[phase] = None if not entry else bool(entry.get("steady_state_met"))
    return out


def failed_activities(journal: dict[str, Any]) -> list[dict[str, Any]]:
    """Return ``[{"name", "status", "exception"}]`` for method and rollback activities that did not
    succeed (failed, or cut off by a signal: such entries have no ``status``)."""
    out = []
    for section in ("run", "rollbacks"):
        for run in journal.get(section) or []:
            status = run.get("status")
            if status != "succeeded":
                activity = run.get("activity") or {}
                exc = run.get("exception")
                if isinstance(exc, list):
                    exc = "".join(exc).strip().splitlines()[-1] if exc else None
                out.append(
                    {
                        "section": section,
                        "name": activity.get("name"),
                        "status": status or "cut-off",
                        "exception": exc,
                    }
                )
    return out


def method_findings(journal: dict[str, Any]) -> list[str]:
    """Return ``["<activity name>: <message>"]`` for each method activity that raised
    :class:`chaoslib_infer.errors.ServiceFinding`: the drill measured the weakness it looks for
    (a recovery that missed its deadline), which fails the drill rather than erroring it.
    """
    return [
        f"{a['name']}: {str(a['exception']).partition(_FINDING)[2].strip()}"
        for a in failed_activities(journal)
        if _is_finding(a)
    ]


def _is_finding(activity: dict[str, Any]) -> bool:
    return activity["section"] == "run" and _FINDING in str(activity["exception"] or "")


def _crashed(run: dict[str, Any]) -> bool:
    """Whether a method run entry is an action that raised something other than ``ActivityFailed``.

    Chaos Toolkit wraps whatever a Python activity raised: the journal's last exception line reads
    ``chaoslib.exceptions.ActivityFailed: <what the activity raised>: <message>``.
    """
    if (
        run.get("status") in (None, "succeeded")
        or (run.get("activity") or {}).get("type") != "action"
    ):
        return False
    exc = run.get("exception")
    text = "".join(exc) if isinstance(exc, list) else str(exc or "")
    lines = text.strip().splitlines()
    if not lines:
        return False
    raised = lines[-1].partition(": ")[2]
    return bool(raised) and not raised.startswith(
        ("chaoslib.exceptions.ActivityFailed", "ActivityFailed")
    )


def drill_status(journal: dict[str, Any]) -> str:
    """Return the drill verdict: ``passed``, ``deviated``, ``aborted`` or ``error``.

    - ``aborted``: the run was interrupted (Ctrl-C, SIGTERM, a control such as the load warm-up).
    - ``deviated``: a steady-state hypothesis (before or after) did not hold.
    - ``deviated`` too: a method probe raised a ``ServiceFinding`` (:func:`method_findings`).
    - ``error``: an action or probe of the method failed (the drill could not do what it planned).
      A method action that *crashed* (raised anything but ``ActivityFailed``: a bug, not one of
      its documented failures) wins over a failed after-hypothesis, which then measured a drill
      that stopped half-way (e.g. right after killing replicas, before holding the fault).
    - ``passed``: both hypotheses held and every method activity succeeded.
    """
    status = journal.get("status")
    if status in ("interrupted", "aborted"):
        return "aborted"
    hyp = hypothesis_results(journal)
    if hyp["before"] is False:
        return "deviated"
    if any(_crashed(run) for run in journal.get("run") or []):
        return "error"
    if hyp["after"] is False or journal.get("deviated"):
        return "deviated"
    failed = [a for a in failed_activities(journal) if a["section"] == "run"]
    if any(not _is_finding(a) for a in failed):
        return "error"
    if failed:
        return "deviated"
    if hyp["before"] is None or hyp["after"] is None:
        return "error"
    return "passed"
