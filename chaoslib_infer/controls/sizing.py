"""How many requests a steady-state baseline needs, and what ``warmup_s: auto`` covers.

``warmup_s: auto`` (:func:`chaoslib_infer.controls.load.warmup_seconds`) warms the load up for
the requests a powered baseline needs (:func:`baseline_need`): the fewest from which the
failure-rate SLOs (:data:`AUTO_SIZED`: availability, error rate) catch the plan's defect with
the plan's power at its false-alarm bound (:func:`chaoslib_infer.measure.binomial.required_requests`).
The timeout rate and the P99 are judged on the same baseline at the power its size gives them,
stated figure by figure (:func:`auto_coverage`; ``docs/definitions.md``, "Sizing the
baseline").
"""

from __future__ import annotations

import math
from typing import Any

from chaoslib_infer import settings
from chaoslib_infer.measure.binomial import (
    MAX_REQUESTS,
    defect_rate,
    plan_settings,
    power_at,
    required_requests,
)
from chaoslib_infer.measure.slo import Thresholds, allowance

__all__ = ["AUTO_SIZED", "auto_coverage", "baseline_need"]


def _judged_allowances(configuration: dict[str, Any] | None) -> dict[str, float]:
    """``{figure: allowance}`` of the SLOs a baseline judges (availability, error rate, timeout
    rate, P99), from the thresholds in force (``slo_<metric>``; the acceptance defaults).

    Raises:
        ValueError: a threshold out of range (one line).
    """
    defaults = Thresholds()
    given = settings.slo_overrides(configuration)
    out: dict[str, float] = {}
    for figure in ("availability", "error_rate", "timeout_rate", "p99_e2e_s"):
        value = given.get(figure, getattr(defaults, figure))
        if value is None:
            continue
        if figure != "p99_e2e_s" and not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"slo_{figure}={value}: a fraction must be between 0 and 1")
        out[figure] = allowance(figure, float(value))
    return out


#: The figures ``warmup_s: auto`` sizes the baseline for: the failure-rate SLOs (a 2 % defect
#: of failed requests). The timeout rate and the P99 are judged on the same baseline at the
#: power its size gives them (:func:`auto_coverage`): powering them too would take 66 s and
#: 169 s of warm-up at 8 req/s per drill, the default game day past 10 minutes.
AUTO_SIZED = ("availability", "error_rate")


def baseline_need(configuration: dict[str, Any] | None = None) -> int:
    """The requests a powered baseline needs: the fewest from which every failure-rate SLO in
    force (:data:`AUTO_SIZED`: availability, error rate) catches the plan's defect with the
    plan's power at the plan's false-alarm bound
    (:func:`chaoslib_infer.measure.binomial.required_requests`; 194 at 99.9 % and the
    defaults). ``warmup_s: auto`` lasts that long at the load's rate and then waits, within
    the warm-up's patience, until that many requests have succeeded: Poisson arrivals and a
    slow start would otherwise leave the baseline a few short. What that size gives the other
    judged figures: :func:`auto_coverage`.

    Raises:
        ValueError: a ``window_*`` or ``slo_*`` setting out of range, or no window size
            reaching the power target (one line).
    """
    s = plan_settings(configuration)
    need = 0
    for figure, a in _judged_allowances(configuration).items():
        if figure not in AUTO_SIZED:
            continue
        n = required_requests(a, s["false_alarm"], s["power"], s["defect"])
        if n is None:
            raise ValueError(
                f"no baseline of up to {MAX_REQUESTS} requests catches a {s['defect']:g} defect "
                f"{s['power']:.0%} of the time at {figure} {a:g} allowed: lower window_power "
                "or raise window_defect"
            )
        need = max(need, n)
    return need


def auto_coverage(
    rate_rps: float, configuration: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """What a ``warmup_s: auto`` baseline covers, figure by figure: for each judged SLO in force
    (availability, error rate, timeout rate, P99), its power against the plan's defect at the
    size :func:`baseline_need` gives, the requests that figure would need for the plan's power
    and the warm-up that takes at ``rate_rps``. At 99.9 % / 0.5 % / P99 10 s, 8 req/s and the
    defaults: 194 requests; availability 90 %, timeout rate 54 % (525 needed: 66 s), P99 35 %
    (1349 needed: 169 s; the P99's ``n`` is the successful requests, about as many).

    Returns:
        ``[{"figure", "allowance", "defect", "n", "power", "sized_for" (bool), "needed"
        (requests, None past the search), "needed_s" (seconds at ``rate_rps``, or None)}]``.

    Raises:
        ValueError: ``rate_rps <= 0``, a ``window_*`` or ``slo_*`` setting out of range.
    """
    if not rate_rps > 0:
        raise ValueError(f"warmup_s=auto needs a rate above 0 req/s (got {rate_rps})")
    s = plan_settings(configuration)
    n = baseline_need(configuration)
    out = []
    for figure, a in _judged_allowances(configuration).items():
        need = required_requests(a, s["false_alarm"], s["power"], s["defect"])
        out.append({
            "figure": figure, "allowance": a, "defect": defect_rate(a, s["defect"]), "n": n,
            "power": power_at(n, a, s["false_alarm"], s["defect"]),
            "sized_for": figure in AUTO_SIZED, "needed": need,
            "needed_s": None if need is None else float(math.ceil(need / rate_rps)),
        })  # fmt: skip
    return out
