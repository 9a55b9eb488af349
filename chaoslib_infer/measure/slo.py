"""Acceptance thresholds and their evaluation against ``metrics.window_stats`` output.

Defaults are the acceptance references of ``docs/definitions.md`` ("Acceptance SLOs"):
P50 latency within 2 s (chat); P95 under 3x P50; P99 over 10 s fails; timeout rate below 0.5%;
error rate below 0.1%; availability at least 99.9% ("three nines is the floor").

A steady-state window (the baseline before the fault, the window after it) judges the rate SLOs
and the P50/P99 latency SLOs by the exact binomial test of :mod:`chaoslib_infer.measure.binomial`
on its count of bad requests (:func:`window_test`), not by the point estimate: one failure in 200
requests is *not shown to break* 99.9 % (a service exactly at 99.9 % shows one or more 18 % of
the time, so the window passes; that is no proof it meets the SLO: after 1 in 200 the failure
rate may be as high as 2.35 %, the one-sided 95 % upper bound), two or more are.
``docs/definitions.md``, "Windows with stated error rates".
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .binomial import WindowTest, judge_window

__all__ = ["BINOMIAL", "Thresholds", "allowance", "bad_word", "evaluate", "window_test"]

#: The SLO metrics a steady-state window judges by the binomial test. The P95 check (a factor of
#: the measured P50, not a fixed threshold) stays a point estimate.
BINOMIAL = ("availability", "error_rate", "timeout_rate", "p50_e2e_s", "p99_e2e_s")
#: The fraction of the (successful) requests a latency SLO allows over its threshold.
_LATENCY_ALLOWANCE = {"p50_e2e_s": 0.5, "p99_e2e_s": 0.01}

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Thresholds:
    """Acceptance thresholds; set a field to None to skip that check.

    Attributes:
        p50_e2e_s: P50 end-to-end latency must be <= this (seconds).
        p95_over_p50: P95 must be <= this factor times the measured P50.
        p99_e2e_s: P99 end-to-end latency must be <= this (seconds).
        timeout_rate: timeout rate must be < this (fraction of attempted).
        error_rate: error rate must be < this (fraction of attempted).
        availability: availability must be >= this (fraction of attempted).
    """

    p50_e2e_s: float | None = 2.0
    p95_over_p50: float | None = 3.0
    p99_e2e_s: float | None = 10.0
    timeout_rate: float | None = 0.005
    error_rate: float | None = 0.001
    availability: float | None = 0.999


def _row(metric: str, value: Any, op: str, threshold: float | None) -> dict[str, Any]:
    ok = (
        isinstance(value, int | float)
        and threshold is not None
        and _OPS[op](float(value), float(threshold))
    )
    return {"metric": metric, "value": value, "op": op, "threshold": threshold, "passed": bool(ok)}


def evaluate(
    stats: Mapping[str, Any], thresholds: Thresholds | None = None
) -> list[dict[str, Any]]:
    """Check window statistics against the thresholds.

    Args:
        stats: a ``metrics.window_stats`` result (keys ``p50_e2e_s``, ``p95_e2e_s``,
            ``p99_e2e_s``, ``timeout_rate``, ``error_rate``, ``availability``).
        thresholds: default ``Thresholds()``.

    Returns:
        One row per enabled check, in the order of ``docs/definitions.md``:
        ``{"metric", "value", "op", "threshold", "passed"}``. A metric without data (value None)
        fails. For ``p95_e2e_s`` the threshold is ``p95_over_p50 * p50`` (None, failing, when P50
        is unknown).
    """
    t = thresholds or Thresholds()
    rows = []
    if t.p50_e2e_s is not None:
        rows.append(_row("p50_e2e_s", stats.get("p50_e2e_s"), "<=", t.p50_e2e_s))
    if t.p95_over_p50 is not None:
        p50 = stats.get("p50_e2e_s")
        thr = t.p95_over_p50 * p50 if isinstance(p50, int | float) else None
        rows.append(_row("p95_e2e_s", stats.get("p95_e2e_s"), "<=", thr))
    if t.p99_e2e_s is not None:
        rows.append(_row("p99_e2e_s", stats.get("p99_e2e_s"), "<=", t.p99_e2e_s))
    if t.timeout_rate is not None:
        rows.append(_row("timeout_rate", stats.get("timeout_rate"), "<", t.timeout_rate))
    if t.error_rate is not None:
        rows.append(_row("error_rate", stats.get("error_rate"), "<", t.error_rate))
    if t.availability is not None:
        rows.append(_row("availability", stats.get("availability"), ">=", t.availability))
    return rows


def allowance(metric: str, threshold: float) -> float:
    """The bad fraction the SLO ``metric`` at ``threshold`` allows: 1 - availability, the error
    or timeout rate itself, 0.5 over the P50 threshold, 0.01 over the P99 threshold.

    Raises:
        KeyError: a metric outside :data:`BINOMIAL`.
    """
    if metric == "availability":
        return max(0.0, 1.0 - float(threshold))
    if metric in ("error_rate", "timeout_rate"):
        return float(threshold)
    return _LATENCY_ALLOWANCE[metric]


def bad_word(metric: str, threshold: float) -> str:
    """What a bad request of ``metric`` is, in words: ``"failed"``, ``"timed out"``, ``"over
    10 s"``."""
    if metric in ("availability", "error_rate"):
        return "failed"
    if metric == "timeout_rate":
        return "timed out"
    return f"over {float(threshold):g} s"


def window_test(
    metric: str,
    stats: Mapping[str, Any],
    e2e_ok_s: Sequence[float],
    threshold: float,
    settings: Mapping[str, float] | None = None,
) -> WindowTest | None:
    """Judge one steady-state window against the SLO ``metric`` by the binomial test.

    Args:
        metric: one of :data:`BINOMIAL` (else None is returned).
        stats: the window's ``metrics.window_stats`` (``requests``, ``ok``, ``failed``,
            ``timeouts``): availability and error rate count ``failed`` of ``requests``, the
            timeout rate ``timeouts`` of ``requests``.
        e2e_ok_s: E2E (s) of the window's successful requests (``metrics.e2e_ok_s``): a latency
            SLO counts those over ``threshold`` of them (failed requests are judged by
            availability, as percentiles are over successful requests).
        threshold: the SLO's threshold.
        settings: ``{"false_alarm", "power", "defect"}``
            (:func:`chaoslib_infer.measure.binomial.plan_settings`; defaults 0.05, 0.9, 0.02).

    Returns:
        The :class:`~chaoslib_infer.measure.binomial.WindowTest`, or None for another metric.
    """
    if metric not in BINOMIAL:
        return None
    if metric in _LATENCY_ALLOWANCE:
        n, bad = len(e2e_ok_s), sum(1 for v in e2e_ok_s if v > float(threshold))
    else:
        n = int(stats.get("requests") or 0)
        key = "timeouts" if metric == "timeout_rate" else "failed"
        bad = min(n, int(stats.get(key) or 0))
    s = dict(settings or {})
    kwargs = {k: float(s[k]) for k in ("false_alarm", "power", "defect") if k in s}
    return judge_window(n, bad, allowance(metric, threshold), **kwargs)
