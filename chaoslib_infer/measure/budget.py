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
  the injection; each bucket adds ``failed / requests x BUCKET_S``. The span starts at the
  injection (the seconds before the fault's first request lie between the service as it was and
  that request). A bucket before the injection holds the requests the fault took across it (a stream it cut) beside the others
  sent then, which count in its denominator. A bucket that holds no request is not a second of
  service: it takes the failed fraction of its nearer neighbouring buckets that hold requests
  (the mean of the two at equal distance), so a full outage costs its length at any request
  rate. With a steady rate it equals the failed requests over the rate (the request-based
  view); under a changing rate (a spike) each second weighs the same, as a user's minute does.
- **its bound**: an empty bucket between neighbours that disagree could have been as good as
  the better or as bad as the worse; the cost lies between ``cost_low_s`` and
  ``cost_high_s``. When that bound is wider than ``2 x`` :data:`COST_TOLERANCE_S` the request
  rate was too low to measure the cost: it is unmeasured (None), the bound stated, never read
  as cheap.
- **burn rate**: the failed fraction over a window divided by the fraction the SLO allows
  (``1 - SLO``), as in the SRE workbook ("Alerting on SLOs"): 1x spends the budget in exactly
  its 30 days, 14.4x spends 2 % of it in an hour. :func:`burn_rates` gives the peak over
  5-minute and 1-hour windows of the fault's buckets, the service taken to burn nothing outside
  them (the fault's own burn), and whether the workbook's fast-burn page (burn rate above
  14.4x over both the last hour and the last 5 minutes) would have fired.
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUCKET_S",
    "COST_TOLERANCE_S",
    "DAYS_PER_MONTH",
    "FAST_BURN",
    "FAST_BURN_LONG_S",
    "FAST_BURN_SHORT_S",
    "BudgetCost",
    "BurnRates",
    "budget_cost",
    "budget_share",
    "burn_rates",
    "monthly_budget_s",
]

#: Width of a budget bucket (s of intended send time): the figure's resolution.
BUCKET_S = 1.0
#: The SLO period the monthly budget is counted over (days), as in the SRE workbook.
DAYS_PER_MONTH = 30
#: Half-width of the widest bound the cost is stated with (s of full outage): a cost known only
#: to within more than +/- 5 s (0.2 % of the 2,592 s monthly budget of 99.9 %, a tenth of the
#: default 2 % threshold) is unmeasured. At 0.2 requests/s evenly spaced a full outage's two
#: edges leave 8 s unknown; at 0.1 requests/s 18 s: unmeasured.
COST_TOLERANCE_S = 5.0
#: The SRE workbook's fast-burn page ("Alerting on SLOs", table 5-8): a burn rate above 14.4x
#: over both the last hour and the last 5 minutes (2 % of a 30-day budget in an hour).
FAST_BURN = 14.4
FAST_BURN_LONG_S = 3600.0
FAST_BURN_SHORT_S = 300.0


@dataclass(frozen=True)
class BudgetCost:
    """One fault's error-budget cost.

    Attributes:
        cost_s: seconds of full outage (None: unmeasured, too few requests or a bound wider
            than ``2 x COST_TOLERANCE_S``).
        requests: logical requests of the fault (first sent from the injection on, or taken by
            the fault across it) to the end of the load.
        failed: those that failed.
        span_s: seconds from the first bucket to the end of the last one.
        estimate_s: the cost as filled in from the neighbours, also when unmeasured (None: too
            few requests).
        cost_low_s / cost_high_s: the bound on the cost (s; None: too few requests).
        empty_s: seconds of the span with no request in them.
        series: the failed fraction of each bucket of the span (0..1), the empty ones filled in.
    """

    cost_s: float | None
    requests: int
    failed: int
    span_s: float
    estimate_s: float | None = None
    cost_low_s: float | None = None
    cost_high_s: float | None = None
    empty_s: float = 0.0
    series: tuple[float, ...] = ()


@dataclass(frozen=True)
class BurnRates:
    """The peak burn rates of one fault (module docstring, "burn rate").

    Attributes:
        peak_5m / peak_1h: the highest burn rate over any 5-minute / 1-hour window (x).
        fast_burn_page: whether the workbook's fast-burn page would have fired (both windows
            above :data:`FAST_BURN` at one moment).
    """

    peak_5m: float
    peak_1h: float
    fast_burn_page: bool


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
    tolerance_s: float = COST_TOLERANCE_S,
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
        tolerance_s: the widest half-bound of a measured cost (s, :data:`COST_TOLERANCE_S`).

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
    # from the injection (or the earliest request the fault took across it) to the end
    first, last = min(0, *(b for b, _, _ in ours)), max(b for b, _, _ in rows)
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
    frac = {b: bad.get(b, 0) / n for b, n in totals.items()}
    # the seconds from the injection to the fault's first request lie between the service as it
    # was before the fault (its baseline failures are not the fault's: 0) and that request
    known = frac if first in frac else {first - 1: 0.0, **frac}
    series, low, high = _filled(known, first, last)
    estimate = sum(series) * bucket_s
    lo, hi = low * bucket_s, high * bucket_s
    empty = (last - first + 1 - len(totals)) * bucket_s
    cost = estimate if hi - lo <= 2 * tolerance_s + 1e-9 else None
    return BudgetCost(cost, len(ours), failed, span, estimate, lo, hi, empty, tuple(series))


def _filled(frac: Mapping[int, float], first: int, last: int) -> tuple[list[float], float, float]:
    """The failed fraction of every bucket from ``first`` to ``last``: those holding requests as
    measured (``frac``, which may hold one known bucket before ``first``), an empty one from its
    nearer measured neighbour (the mean at equal distance; the one neighbour at an edge). Returns ``(series, low, high)``: ``low``/``high`` the sum
    with each empty bucket at the better/worse of its two neighbours (its bound)."""
    known = sorted(frac)
    series: list[float] = []
    low = high = 0.0
    k = 0  # index in known of the first measured bucket at or after b
    for b in range(first, last + 1):
        while k < len(known) and known[k] < b:
            k += 1
        if k < len(known) and known[k] == b:
            series.append(frac[b])
            low += frac[b]
            high += frac[b]
            continue
        left = known[k - 1] if k > 0 else None
        right = known[k] if k < len(known) else None
        sides = [frac[x] for x in (left, right) if x is not None]
        if left is not None and right is not None:
            dl, dr = b - left, right - b
            value = frac[left] if dl < dr else frac[right] if dr < dl else sum(sides) / 2
        else:
            value = sides[0]
        series.append(value)
        low += min(sides)
        high += max(sides)
    return series, low, high


def burn_rates(
    series: Sequence[float], slo_availability: float, bucket_s: float = BUCKET_S
) -> BurnRates:
    """The peak burn rates of a fault's buckets (module docstring, "burn rate").

    Args:
        series: the failed fraction of each consecutive bucket (:attr:`BudgetCost.series`).
        slo_availability: the availability SLO (0..1).
        bucket_s: bucket width (s).

    Returns:
        The :class:`BurnRates`; time outside ``series`` burns nothing.

    Raises:
        ValueError: an SLO outside (0, 1).
    """
    if not 0.0 < slo_availability < 1.0:
        raise ValueError(f"slo_availability {slo_availability!r}: expected a number in (0, 1)")
    allowed = 1.0 - slo_availability
    n = len(series)
    prefix = [0.0]
    for f in series:
        prefix.append(prefix[-1] + f * bucket_s)
    short = max(1, round(FAST_BURN_SHORT_S / bucket_s))
    long = max(1, round(FAST_BURN_LONG_S / bucket_s))

    def burned(end: int, width: int) -> float:  # seconds of full outage in (end - width, end]
        return prefix[min(end, n)] - prefix[max(end - width, 0)]

    ends = range(1, n + short + 1)  # windows ending in the fault or up to 5 min after it
    peak_5m = max((burned(e, short) for e in ends), default=0.0) / FAST_BURN_SHORT_S / allowed
    peak_1h = max((burned(e, long) for e in ends), default=0.0) / FAST_BURN_LONG_S / allowed
    page = any(
        burned(e, short) / FAST_BURN_SHORT_S / allowed > FAST_BURN
        and burned(e, long) / FAST_BURN_LONG_S / allowed > FAST_BURN
        for e in ends
    )
    return BurnRates(peak_5m, peak_1h, page)
