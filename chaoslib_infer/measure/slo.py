"""Acceptance thresholds and their evaluation against ``metrics.window_stats`` output.

Defaults are the acceptance references of ``docs/definitions.md`` ("Acceptance SLOs"):
P50 latency within 2 s (chat); P95 under 3x P50; P99 over 10 s fails; timeout rate below 0.5%;
error rate below 0.1%; availability at least 99.9% ("three nines is the floor").
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Thresholds", "evaluate"]

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
