"""The error-budget cost of a fault (``docs/definitions.md``, "Drill figures": error-budget cost).

Stability means "recovers fast", not "never fails": a fault is worth what it burns of the
service's error budget. The Google SRE workbook ("Implementing SLOs", "Alerting on SLOs") states
the budget of an availability SLO as the failures it allows over its period: at 99.9 % over
30 days, 0.1 % of the month, 2,592 s (43.2 minutes) of full outage; a request-based SLI spends it
request by request. Both views meet in the figure here:

- **budget cost** (``budget_cost_s``): the failed fraction of logical requests integrated over
  time, in seconds of full outage. The time from the fault's first request to the end of the
  load is cut into buckets of :data:`BUCKET_S` of *intended* send time (the open-loop schedule's
  due time, so a client that fell behind does not move requests between buckets), aligned on
  the injection; each bucket adds ``failed / requests x BUCKET_S``. A bucket before the
  injection holds the requests the fault took across it (a stream it cut) beside the others
  sent then, which count in its denominator. With a steady rate it equals the failed requests
  over the rate (the request-based view); under a changing rate (a spike) each second weighs
  the same, as a user's minute does.
- **budget share** (``budget_share``): that cost times the expected incidents per month of this
  fault, over the monthly budget ``(1 - SLO) x 30 days``.

The cost is *gross*: the baseline's own failure rate is not subtracted. A baseline that fails
is judged by the baseline window (and fails the drill "before the fault"); subtracting a rate
estimated from a few dozen requests would add noise as large as the cost of a short fault; and
the workbook counts every bad event against the budget. Failures of the requests sent before
the injection that the verdict leaves to the baseline (overdue at it) are not counted here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUCKET_S",
    "DAYS_PER_MONTH",
    "BudgetCost",
    "budget_cost",
    "budget_share",
    "monthly_budget_s",
]

#: Width of a budget bucket (s of intended send time): the figure's resolution.
BUCKET_S = 1.0
#: The SLO period the monthly budget is counted over (days), as in the SRE workbook.
DAYS_PER_MONTH = 30


@dataclass(frozen=True)
class BudgetCost:
    """One fault's error-budget cost.

    Attributes:
        cost_s: seconds of full outage (None: too few requests, "unmeasured").
        requests: logical requests of the fault (first sent from the injection on, or taken by
            the fault across it) to the end of the load.
        failed: those that failed.
        span_s: seconds from the first bucket to the end of the last one.
    """

    cost_s: float | None
    requests: int
    failed: int
    span_s: float


def monthly_budget_s(slo_availability: float, days: int = DAYS_PER_MONTH) -> float:
    """The error budget of an availability SLO over ``days``, in seconds of full outage.

    Args:
        slo_availability: the SLO (0..1), e.g. 0.999.
        days: the SLO period (default 30).

    Returns:
        ``(1 - slo) x days x 86,400`` s: 2,592 s at 0.999 over 30 days.

    Raises:
        ValueError: ``slo_availability`` not in (0, 1) (a 100 % SLO has no budget to spend).
    """
    if not 0.0 < slo_availability < 1.0:
        raise ValueError(f"slo_availability {slo_availability!r}: expected a number in (0, 1)")
    return (1.0 - slo_availability) * days * 86_400.0


def budget_share(
    cost_s: float | None, incidents_per_month: float, slo_availability: float
) -> float | None:
    """The share of the monthly error budget a fault burns at its expected frequency.

    Args:
        cost_s: the fault's cost (s of full outage; None: unmeasured).
        incidents_per_month: how often the plan expects this fault (0 or more).
        slo_availability: the availability SLO whose budget it spends (:func:`monthly_budget_s`).

    Returns:
        ``cost_s x incidents_per_month / monthly_budget_s(slo)`` (0.01: 1 %), None when
        ``cost_s`` is None.

    Raises:
        ValueError: a negative ``incidents_per_month`` or an SLO outside (0, 1).
    """
    if incidents_per_month < 0 or not math.isfinite(incidents_per_month):
        raise ValueError(f"incidents_per_month {incidents_per_month!r}: expected 0 or more")
    budget = monthly_budget_s(slo_availability)
    return None if cost_s is None else cost_s * incidents_per_month / budget


def _due(r: Mapping[str, Any]) -> float | None:
    """When a logical request was due: its ``intended_at`` when no later than ``sent_at``, else
    ``sent_at`` (the same rule as the window statistics)."""
    s, i = r.get("sent_at"), r.get("intended_at")
    if not isinstance(s, int | float):
        return None
    return float(i) if isinstance(i, int | float) and i <= s else float(s)


def budget_cost(
    logical: Iterable[Mapping[str, Any]],
    fault_at: float,
    taken_ids: frozenset[str] | set[str] = frozenset(),
    min_requests: int = 10,
    bucket_s: float = BUCKET_S,
) -> BudgetCost:
    """The error-budget cost of the fault injected at ``fault_at`` (module docstring).

    Args:
        logical: one record per logical request (``measure.metrics.logical_outcomes``: ``ok``,
            ``sent_at``, ``intended_at`` of the first attempt, ``request_id``); requests cut off
            when the load stopped (``cut_off``: outcome unknown) are left out.
        fault_at: the injection (unix s).
        taken_ids: request ids first sent before the injection that the fault took across it
            (the verdict's crossing rule: a stream it cut, a request it caught waiting); every
            other request sent before the injection is the baseline's and counts only in the
            denominator of its bucket.
        min_requests: fewer of the fault's requests than this: the cost is unmeasured (None).
        bucket_s: bucket width (s).

    Returns:
        The :class:`BudgetCost`.
    """
    rows: list[tuple[int, bool, bool]] = []  # (bucket, the fault's, failed)
    for r in logical:
        t = _due(r)
        if t is None or r.get("cut_off"):
            continue
        rid = r.get("request_id")
        mine = t >= fault_at or (rid is not None and str(rid) in taken_ids)
        rows.append((math.floor((t - fault_at) / bucket_s), mine, not r.get("ok")))
    ours = [row for row in rows if row[1]]
    failed = sum(1 for _, _, bad in ours if bad)
    if not ours:
        return BudgetCost(None, 0, 0, 0.0)
    first, last = min(b for b, _, _ in ours), max(b for b, _, _ in rows)
    span = (last - first + 1) * bucket_s
    if len(ours) < min_requests:
        return BudgetCost(None, len(ours), failed, span)
    totals: dict[int, int] = {}
    bad: dict[int, int] = {}
    for b, mine, is_bad in rows:
        if b < first:
            continue
        totals[b] = totals.get(b, 0) + 1
        if mine and is_bad:
            bad[b] = bad.get(b, 0) + 1
    cost = sum(bad.get(b, 0) / n * bucket_s for b, n in totals.items())
    return BudgetCost(cost, len(ours), failed, span)
