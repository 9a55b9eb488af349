"""Would anyone have been paged? The detection criteria of a drill (``docs/definitions.md``,
"Detection").

Judged by default (each can be turned off: plan ``detection: {silent_page: off, ...}``):

- ``silent_page``: the fault burned the error budget at or above a page condition's rate (measured
  from the load client's own counters over the page rule's windows) and no ``severity="page"``
  alert fired during the drill nor was still firing at the injection: FAILED, naming each page rule and why it stayed silent (no metric,
  no series for its selector, a ``for:`` longer than the condition held, the condition never held).
- ``false_page``: the burn stayed below every page rate, yet a page alert began and fired after the
  injection: FAILED, its own reason.
- ``baseline_alarm``: a page alert began and *fired* in the baseline, before any fault, while the
  baseline's burn stayed under every page rate: FAILED. (A page the earlier drills' burn still
  explains, in the long windows, is due; tickets and watches there are reported.)

Reported, never judged by default: alerts that only went pending, ticket and watch alerts, the
table's minutes-long ``for:`` alerts whose condition held but whose ``for:`` outlasted the drill's
seconds-long fault (when each would have fired), and in oom-kill the memory alert's condition
holding before the kill (``early_warning``: judged only when the plan turns it on, then a kill
without a memory alert's condition holding before it fails).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["DetectionCriteria", "judge_detection"]


@dataclass(frozen=True)
class DetectionCriteria:
    """Which detection criteria are judged (see the module docstring)."""

    silent_page: bool = True
    false_page: bool = True
    baseline_alarm: bool = True
    early_warning: bool = False

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> DetectionCriteria:
        """From a plan's ``detection:`` mapping (``{name: on|off|true|false}``).

        Raises:
            ValueError: an unknown name or a value that is not on/off (one line).
        """
        names = {f.name for f in fields(cls)}
        kwargs: dict[str, bool] = {}
        for key, value in (data or {}).items():
            if key not in names:
                raise ValueError(
                    f"detection: unknown criterion {key!r} (known: {', '.join(sorted(names))})"
                )
            if isinstance(value, bool):
                kwargs[key] = value
            elif str(value).lower() in ("on", "off", "true", "false", "yes", "no"):
                kwargs[key] = str(value).lower() in ("on", "true", "yes")
            else:
                raise ValueError(f"detection: {key}: expected on or off, got {value!r}")
        return cls(**kwargs)


def judge_detection(
    det: Mapping[str, Any],
    burn_peak: float | None,
    page_reached: bool,
    page_rate: float,
    criteria: DetectionCriteria | None = None,
    oom_kill_at_s: float | None = None,
    *,
    marginal: bool = False,
    judged: set[str] | None = None,
    baseline_burn: float | None = None,
    baseline_reached: bool = False,
    own_alerts: frozenset[str] = frozenset(),
) -> tuple[list[dict[str, Any]], list[str]]:
    """Judge a drill's detection figures (:func:`chaoslib_infer.measure.detection.
    detection_figures`).

    Args:
        det: the detection figures.
        burn_peak: the peak burn rate the page conditions saw (None: unmeasured).
        page_reached: whether a page condition's burn rate was reached.
        page_rate: the lowest page factor (the workbook's 6x... 14.4x; shown in reasons).
        criteria: which criteria are judged.
        oom_kill_at_s: the OOM kill, seconds from injection (oom-kill drills), for
            ``early_warning``.
        marginal: the burn came within 10 % of a page rate (either way): neither a silent nor
            a false page is judged (one evaluation's timing would decide).
        judged: the alerts whose pages count (the team's rules under ``--rules``); None: all.
        baseline_burn, baseline_reached: the page conditions' peak burn in the baseline and
            whether it reached a page rate (then a page there is due, not a false alarm).
        own_alerts: the lab's own burn-rate page alerts, over the client's counters, the
            counters the burn is read from: a page of theirs the burn does not explain is a
            disagreement between two readings of one counter (scrape and evaluation timing), the
            tool's, not the service's: reported as ``not judged``, never a reason against the
            service (a team's rule beside them stays judged).

    Returns:
        ``(rows, reasons)``: one row per criterion (``criterion``, ``value``, ``result``:
        ``passed`` | ``failed`` | ``not judged``, ``note``) and the failure reasons.
    """
    c = criteria or DetectionCriteria()
    rows: list[dict[str, Any]] = []
    reasons: list[str] = []
    pages = [
        a
        for a in det.get("alerts") or []
        if a.get("severity") == "page"
        and (judged is None or a.get("alert") in judged)
        and a.get("phase") in ("fault", "after")
        and a.get("firing_s") is not None
    ]
    # a page still firing at the injection (an earlier episode) has the fault covered
    already = [a for a in det.get("already_paging") or [] if judged is None or a in judged]
    burn_txt = "unmeasured" if burn_peak is None else f"{burn_peak:.1f}x"
    # silent page
    margin = "the burn came within 10 % of the page rate: one evaluation's timing decides"
    if burn_peak is None or not c.silent_page or (marginal and not pages):
        why = "burn rate unmeasured" if burn_peak is None else "turned off"
        why = margin if burn_peak is not None and c.silent_page else why
        rows.append(_row("silent_page", det.get("time_to_page_s"), "not judged", why))
    elif page_reached and not pages and not already:
        silent = [
            r
            for r in det.get("rules") or []
            if r.get("severity") == "page" and (judged is None or r.get("alert") in judged)
        ]
        named = "; ".join(f"{r['alert']}: {r.get('why_silent', 'did not fire')}" for r in silent)
        reason = (
            f"detection: silent page: the fault burned the error budget at {burn_txt} "
            f"(page rate {page_rate:g}x) and no page fired"
            + (f" ({named})" if named else " (no page-severity rule is loaded)")
        )
        reasons.append(reason)
        rows.append(_row("silent_page", None, "failed", reason))
    else:
        if pages:
            note = f"paged by {det.get('paged_by')} at {det.get('time_to_page_s'):+.1f} s"
        elif already:
            note = f"already paging at the injection: {', '.join(already)}"
        else:
            note = f"burn peaked at {burn_txt}, below the page rate: no page expected"
        rows.append(_row("silent_page", det.get("time_to_page_s"), "passed", note))
    # false page
    if burn_peak is None or not c.false_page or (marginal and pages and not page_reached):
        why = "burn rate unmeasured" if burn_peak is None else "turned off"
        why = margin if burn_peak is not None and c.false_page else why
        rows.append(_row("false_page", len(pages), "not judged", why))
    elif pages and not page_reached and all(a.get("alert") in own_alerts for a in pages):
        first = min(pages, key=lambda a: a["firing_s"])
        note = (
            f"{first['alert']} fired at {first['firing_s']:+.1f} s while the client's counters "
            f"read a burn of at most {burn_txt} (below {page_rate:g}x): the lab's own rule reads "
            "the same counters, so this is the tool's disagreement (scrape and evaluation "
            "timing), not the service's; a team's rules (--rules, --prometheus) are judged"
        )
        rows.append(_row("false_page", len(pages), "not judged", note))
    elif pages and not page_reached:
        first = min(pages, key=lambda a: a["firing_s"])
        reason = (
            f"detection: false page: {first['alert']} fired at {first['firing_s']:+.1f} s "
            f"while the error budget burned at most {burn_txt} (below the {page_rate:g}x "
            "page rate): the service mitigated, the page would wake someone for nothing"
        )
        reasons.append(reason)
        rows.append(_row("false_page", len(pages), "failed", reason))
    else:
        rows.append(_row("false_page", len(pages), "passed", ""))
    # baseline alarms: pages that began and fired before the fault, while the budget burned
    # below every page rate (a page the earlier drills' burn explains is no false alarm)
    fired = [
        a
        for a in det.get("baseline_alarms") or []
        if a.get("firing_s") is not None
        and a.get("severity") == "page"
        and (judged is None or a.get("alert") in judged)
    ]
    base_txt = "unmeasured" if baseline_burn is None else f"{baseline_burn:.1f}x"
    if not c.baseline_alarm:
        rows.append(_row("baseline_alarm", len(fired), "not judged", "turned off"))
    elif fired and baseline_reached:
        note = f"the baseline burned at {base_txt}, at a page rate: the page is due"
        rows.append(_row("baseline_alarm", len(fired), "passed", note))
    elif fired:
        named = ", ".join(f"{a['alert']} at {a['firing_s']:+.1f} s" for a in fired)
        reason = (
            f"detection: false alarm in the baseline, before any fault: {named} paged while "
            f"the budget burned at {base_txt}, under the page rate"
        )
        reasons.append(reason)
        rows.append(_row("baseline_alarm", len(fired), "failed", reason))
    else:
        rows.append(_row("baseline_alarm", 0, "passed", ""))
    # early warning (oom-kill): the memory alert's condition before the kill
    if oom_kill_at_s is not None:
        mem = [
            r
            for r in det.get("rules") or []
            if "Memory" in str(r.get("alert")) and r.get("condition_held_s") is not None
        ]
        lead = max((oom_kill_at_s - r["condition_held_s"] for r in mem), default=None)
        note = (
            f"memory alert's condition held {lead:.1f} s before the kill"
            if lead is not None and lead > 0
            else "no memory alert's condition held before the kill"
        )
        if c.early_warning and (lead is None or lead <= 0):
            reasons.append(f"detection: no early warning: {note}")
            rows.append(_row("early_warning", lead, "failed", note))
        else:
            result = "passed" if c.early_warning else "not judged"
            rows.append(_row("early_warning", lead, result, note))
    return rows, reasons


def _row(name: str, value: Any, result: str, note: str) -> dict[str, Any]:
    return {"criterion": name, "value": value, "result": result, "note": note}
