"""The drill's own criteria as a Chaos Toolkit probe, so ``chaos run`` deviates on them too.

Put it in an experiment's steady-state hypothesis with the tolerance
``{"type": "jsonpath", "path": "$.passed", "expect": true}``::

    - type: probe
      name: drill-criteria-hold
      tolerance: {type: jsonpath, path: "$.passed", expect: true}
      provider:
        type: python
        module: chaoslib_infer.activities.criteria
        func: drill_criteria
        arguments: {drill: oom-kill}

Before the fault (no fault logged yet) it has nothing of the drill's own to judge and passes (the
SLO probes judge the steady state). After the method it judges the criteria of the fault window
(:mod:`chaoslib_infer.verdict`) over what the run has recorded so far: the records (attempts still
in flight past the judging deadline count as timeouts), the fault log and the lab's ground truth.
The whole-drill and after-the-drill criteria and the residue check need the end of the run: the
game day's verdict judges them. The client's own lag (``send_lag_p99_s``, ``client_lag_p99_s``)
stays judged, so the probe leaves out what a client that fell behind did itself (its not-sent
requests, its timeouts when its lag is large), as the verdict does. Whether service was sustained
after the last failure is judged once the records reach past the drill's own settling window
(:func:`settle_s`), the one its figures use; before that the verdict judges it. The probe saw the
run only up to its own time: where it and the verdict differ, the verdict is final and the
evidence says so (:func:`chaoslib_infer.evidence.verdicts.probe_differences`). Thresholds: the ``infer_criteria`` configuration key
(``chaos --no-version-check run --var infer_criteria=restart_s=20,warmup_ratio=off``; the game day sets it from the
plan and ``--criterion``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from chaoslib_infer import settings
from chaoslib_infer.drills.criterion import configured_overrides
from chaoslib_infer.drills.registry import DRILLS
from chaoslib_infer.evidence.figures import drill_figures, read_jsonl
from chaoslib_infer.lab.fleet import LEDGER_FILE, Lab, LabError
from chaoslib_infer.load.client import INFLIGHT_FILE
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.binomial import plan_settings
from chaoslib_infer.measure.figures import SETTLE_S
from chaoslib_infer.measure.inflight import DEFAULT_DEADLINE_S, judged_records, read_inflight
from chaoslib_infer.verdict import DrillFacts, criteria_for, judge_drill
from chaoslib_infer.verdict.policy import configured_policy
from chaoslib_infer.verdict.state import CLIENT_LAG

__all__ = ["drill_criteria", "settle_s"]


def _fault_criterion(drill: str, criterion: str, overrides: dict[str, Any]) -> None:
    """Check that ``criterion`` is one of ``drill``'s fault-window criteria.

    Raises:
        ValueError: it names no criterion of ``drill``, or one judged over another window.
    """
    crits = {c.name: c for c in criteria_for(drill, overrides)}
    c = crits.get(criterion)
    if c is None:
        known = ", ".join(sorted(n for n, x in crits.items() if x.window == "fault"))
        raise ValueError(f"{drill}: unknown criterion {criterion!r}; fault-window ones: {known}")
    if c.window != "fault":
        raise ValueError(
            f"{drill}: criterion {criterion!r} is judged over the {c.window} window, which is "
            "complete only at the end of the run: the game day's verdict judges it"
        )


def settle_s(drill: str) -> float:
    """The settling window (s) ``drill``'s figures time sustained service with: its room's
    ``figures.SETTLE_S`` (node-loss: 10 s), else the shared
    :data:`chaoslib_infer.measure.figures.SETTLE_S` (5 s)."""
    value = getattr(DRILLS[drill].figures, "SETTLE_S", SETTLE_S)
    return float(value) if isinstance(value, int | float) else SETTLE_S


def _settled(drill: str, figures: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the figures' ``interruption_sustained`` is as the verdict will read it: True
    (sustained), or False once the records the figures were computed from (those ended, not
    cut off) reach past the drill's own settling window (:func:`settle_s`) after the last
    failure. Before that the run goes on and whether service is sustained is not known yet: the
    game day's verdict, over every record, judges it."""
    last = figures.get("last_failure_at")
    if figures.get("interruption_sustained") or not isinstance(last, int | float):
        return True
    seen_until = max(
        (
            float(r["end_at"])
            for r in records
            if isinstance(r.get("end_at"), int | float) and not r.get("cut_off")
        ),
        default=None,
    )
    return seen_until is not None and seen_until >= float(last) + settle_s(drill)


def drill_criteria(
    drill: str, criterion: str | None = None, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Judge the fault-window criteria of ``drill`` (or only ``criterion``) on the run so far.

    One probe for all of them reports every broken criterion at once (chaoslib stops the
    hypothesis at its first failing probe); one probe per criterion
    (``arguments: {drill: upstream-timeout, criterion: hung_requests}``) names the broken one in
    the journal.

    Args:
        drill: which of the seven drills (``oom-kill`` ...): its criteria table.
        criterion: one fault-window criterion of ``drill`` to judge alone (None: all).
        configuration: Chaos Toolkit configuration (``infer_run_dir``, ``infer_lab_dir``,
            ``infer_criteria`` overrides, ``infer_judge_deadline_s``, the verdict policy
            ``infer_verdict_policy``/``infer_incidents_per_month``/``slo_availability``
            (:func:`chaoslib_infer.verdict.policy.configured_policy`); with
            ``infer_k8s_target`` the run is on a cluster and no local lab is read).

    Returns:
        ``{"passed", "state", "reasons", "judged", "failed_criteria"}``: ``passed`` is False
        only when the verdict of the fault window is ``failed``; ``judged`` is False before any
        fault was logged; ``failed_criteria`` names the rows that failed (the evidence compares
        them with the final verdict's, :func:`chaoslib_infer.evidence.verdicts.
        probe_differences`).
        With ``criterion``, also its row: ``"criterion"``, ``"value"``, ``"threshold"``,
        ``"result"`` (``pass``, ``fail``, ``unmeasured``, ``not judged``, ``n/a``; ``no fault
        yet`` with value and threshold None before the fault).

    Raises:
        ValueError: ``drill`` is not one of the seven; an ``infer_criteria`` override is
            malformed or names no criterion of ``drill``; a policy value is refused;
            ``criterion`` is not a fault-window criterion of ``drill``; a
            ``window_false_alarm``, ``window_power`` or ``window_defect`` is not strictly
            between 0 and 1.
    """
    if drill not in DRILLS:
        raise ValueError(f"unknown drill {drill!r}; known: {', '.join(sorted(DRILLS))}")
    overrides = configured_overrides(configuration, drill)
    if criterion is not None:
        _fault_criterion(drill, criterion, overrides)
    run_dir = settings.run_dir(configuration)
    faults = read_jsonl(run_dir / "faults.jsonl")
    if not faults:
        out: dict[str, Any] = {
            "passed": True,
            "state": "no fault yet",
            "reasons": [],
            "judged": False,
        }
        if criterion is not None:
            out.update(criterion=criterion, value=None, threshold=None, result="no fault yet")
        return out
    events: list[dict[str, Any]] = []
    ledger: list[dict[str, Any]] = []
    served = None
    on_cluster = bool((configuration or {}).get("infer_k8s_target"))
    try:
        if on_cluster:  # never a local lab's events: they are not this target's
            raise LabError("a cluster run")
        lab = Lab.attach(settings.lab_dir(configuration))
        events = lab.events()
        ledger = read_jsonl(lab.state_dir / LEDGER_FILE)
        served = lab.served
    except (LabError, OSError):
        pass  # not the lab: the fault actions' own figures only
    figures, ground = drill_figures(run_dir, events, ledger, served_after=served)
    path = settings.records_path(configuration)
    records = read_records(path) if path.exists() else []
    deadline = float((configuration or {}).get("infer_judge_deadline_s") or DEFAULT_DEADLINE_S)
    judged = judged_records(
        records, read_inflight(path.with_name(INFLIGHT_FILE)), time.time(), deadline
    )
    # only the fault window is complete at this point of the run; the client's own lag stays
    # judged, as in the verdict: a client that fell behind has its not-sent requests (and its
    # timeouts when its lag is large) left out, never counted against the service
    crits = criteria_for(drill, overrides)
    for c in crits:
        if c.name in CLIENT_LAG:
            continue
        if c.window != "fault" or (criterion is not None and c.name != criterion):
            overrides[c.name] = None
    # only a drill that has the criterion (an override naming another is refused: upstream-timeout's
    # probe read "unknown criterion 'interruption_sustained'" when the records stopped early)
    if any(c.name == "interruption_sustained" for c in crits) and not _settled(
        drill, figures, records
    ):
        overrides["interruption_sustained"] = None
    facts = DrillFacts(
        drill=drill,
        records=judged,
        figures=figures,
        ground=ground,
        lab_events=events,
        ledger_measured=any(e.get("event", "generation") == "generation" for e in ledger),
        deadline_s=deadline,
        window_settings=plan_settings(configuration),
        policy=configured_policy(configuration),
    )
    verdict = judge_drill(facts, overrides)
    out = {
        "passed": verdict.state != "failed",
        "state": verdict.state,
        "reasons": verdict.reasons,
        "judged": True,
        "failed_criteria": [r["criterion"] for r in verdict.rows if r["result"] == "fail"],
    }
    if criterion is not None:
        row = next((r for r in verdict.rows if r["criterion"] == criterion), {})
        out.update(
            criterion=criterion,
            value=row.get("value"),
            threshold=row.get("threshold"),
            result=row.get("result", "unmeasured"),
            passed=row.get("result") != "fail",
        )
    return out
