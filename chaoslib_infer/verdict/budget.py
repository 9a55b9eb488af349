"""The verdict's error-budget rows and the fault-window loss row (``docs/definitions.md``,
"Drill criteria": ``budget_cost_s``, ``budget_share``, ``burn_rate_5m``, ``burn_rate_1h``,
``fast_burn_page``; "Verdict policy").

The cost is :func:`chaoslib_infer.measure.budget.budget_cost` over the drill's logical requests,
with the requests the crossing rule gives to the baseline (:mod:`.attribution`) left to it; the
share is that cost at the plan's expected incidents per month over the monthly budget of its
availability SLO (:class:`~chaoslib_infer.verdict.policy.VerdictPolicy`); beside them the peak
burn rates over 5 minutes and an hour and whether the SRE workbook's fast-burn page would have
fired (:func:`chaoslib_infer.measure.budget.burn_rates`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.budget import (
    COST_TOLERANCE_S,
    FAST_BURN,
    budget_cost,
    budget_share,
    burn_rates,
    monthly_budget_s,
)
from chaoslib_infer.measure.metrics import logical_outcomes, select

from .criteria import MIN_REQUESTS
from .facts import DrillFacts
from .timeline import Timeline

__all__ = ["BUDGET_ROWS", "LOST_LABEL", "budget_values", "name_lost_row"]

#: The fault-window availability row's label: what it counts.
LOST_LABEL = "requests lost to the fault"

Row = tuple[float | None, str | None]


#: The rows :func:`budget_values` fills.
BUDGET_ROWS = ("budget_cost_s", "budget_share", "burn_rate_5m", "burn_rate_1h", "fast_burn_page")


def budget_values(
    facts: DrillFacts,
    tl: Timeline,
    w: Mapping[str, tuple[float, float]],
    sel: Callable[[str], list[dict[str, Any]]],
) -> dict[str, Row]:
    """``{"budget_cost_s": (s, note), "budget_share": (share, note), "burn_rate_5m": (x, note),
    "burn_rate_1h": (x, note), "fast_burn_page": (1 or 0, note)}`` of one drill.

    Unmeasured (value None, the note saying why, read ``unmeasured``) when the fault was never
    injected, fewer than ``MIN_REQUESTS["fault"]`` logical requests are the fault's, or the
    requests were too sparse to bound the cost within ``COST_TOLERANCE_S`` (the note states the
    bound): a figure nobody measured is never 0, and a rate too low to see an outage never
    makes it cheap.
    """
    pol = facts.policy
    if tl.fault_at is None or "drill" not in w:
        return _unmeasured("unmeasured: no fault was injected")
    # the requests the crossing rule gave to the fault (:mod:`.attribution`): a stream it cut
    taken = {str(r["request_id"]) for r in sel("fault") if r.get("request_id") is not None}
    cost = budget_cost(
        select(logical_outcomes(sel("drill")), None, None),
        tl.fault_at,
        frozenset(taken) if "fault" in w else frozenset(),
        MIN_REQUESTS["fault"],
    )
    if cost.estimate_s is None:
        return _unmeasured(
            f"unmeasured: {cost.requests} requests from the injection to the end of the load "
            f"(< {MIN_REQUESTS['fault']})"
        )
    if cost.cost_s is None:
        return _unmeasured(
            f"unmeasured: the requests were too sparse to measure the cost: between "
            f"{cost.cost_low_s:.3g} and {cost.cost_high_s:.3g} s of full outage "
            f"({cost.empty_s:.0f} of the {cost.span_s:.0f} s from the injection to the end of "
            f"the load held no request; measured within +/- {COST_TOLERANCE_S:g} s only)"
        )
    share = budget_share(cost.cost_s, pol.incidents_per_month, pol.slo_availability)
    month = monthly_budget_s(pol.slo_availability)
    sparse = (
        f"; {cost.empty_s:.0f} s without a request filled in from their neighbours (bound "
        f"{cost.cost_low_s:.3g} to {cost.cost_high_s:.3g} s)"
        if cost.empty_s
        else ""
    )
    cost_note = (
        f"{cost.failed} of {cost.requests} requests failed over {cost.span_s:.0f} s from the "
        "injection to the end of the load (failed fraction per 1 s of intended send time"
        f"{sparse})"
    )
    share_note = (
        f"{cost.cost_s:.3g} s x {pol.incidents_per_month:g} incident(s)/month over "
        f"{month:,.0f} s (the {pol.slo_availability:.4g} SLO's budget over 30 days)"
    )
    burn = burn_rates(cost.series, pol.slo_availability)
    allowed = 1.0 - pol.slo_availability
    burn_note = (
        f"failed fraction over the window / {allowed:.4g} (1 - the {pol.slo_availability:.4g} "
        "SLO); no failure counted outside the drill"
    )
    page_note = (
        f"the SRE workbook's fast-burn page: burn rate above {FAST_BURN:g}x over both the last "
        f"hour ({burn.peak_1h:.3g}x at its peak) and the last 5 minutes "
        f"({burn.peak_5m:.3g}x at its peak)"
    )
    return {
        "budget_cost_s": (cost.cost_s, cost_note),
        "budget_share": (share, share_note),
        "burn_rate_5m": (burn.peak_5m, burn_note),
        "burn_rate_1h": (burn.peak_1h, burn_note),
        "fast_burn_page": (1.0 if burn.fast_burn_page else 0.0, page_note),
    }


def _unmeasured(why: str) -> dict[str, Row]:
    """Every budget row unmeasured with ``why``."""
    return {name: (None, why) for name in BUDGET_ROWS}


def name_lost_row(
    rows: Sequence[dict[str, Any]], fault: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """``rows`` with the fault-window availability row (``availability_fault``) named for what
    it counts: ``"requests lost to the fault: N (fault-window availability)"``, ``N`` the
    logical requests of the fault window (``fault``, its attempts) that failed; the label
    without ``N`` when there is no fault window."""
    lost = None
    if fault is not None:
        lost = sum(1 for r in select(logical_outcomes(list(fault)), None, None) if not r.get("ok"))
    out = []
    for r in rows:
        row = dict(r)
        if row.get("criterion") == "availability_fault":
            head = f"{LOST_LABEL}: {lost}" if lost is not None else LOST_LABEL
            row["label"] = f"{head} (fault-window availability)"
        out.append(row)
    return out
