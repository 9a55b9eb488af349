"""Confidence intervals of the compared figures, and when two targets are told apart.

Two targets are ranked on a figure only when its confidence intervals do not overlap; where they
overlap the figure cannot tell the targets apart ("tie" on it) and the next figure of the ranking
order decides (``docs/certification.md``, "Scorecard and ranking").

Intervals (:func:`interval`): a **percentile bootstrap over the records** (Efron & Tibshirani,
*An Introduction to the Bootstrap*, 1993, ch. 13): :data:`RESAMPLES` resamples with
replacement of the figure's own records, seeded (:data:`SEED`, so a report is reproducible), the
statistic recomputed on each, the interval the ``(1 - CONFIDENCE) / 2`` and
``(1 + CONFIDENCE) / 2`` quantiles of those values. Statistics:

- ``p50`` / ``p99``: that quantile (``numpy`` ``method="higher"``: an observed value) of the
  successful requests' E2E latency, seconds from when the request was due (``docs/definitions.md``);
- ``ratio``: the mean of 0/1 outcomes (a failed request is 1): the error rate;
- ``qps``: a closed-loop step's successful requests per second by Little's law,
  ``concurrency x ok requests / total attempt time`` of the resample (equal to the step's
  ``ok / step seconds`` when every worker was always busy).

Requests a decision needs (:func:`requests_needed`): an interval's half-width shrinks as
``1 / sqrt(n)``; with half-widths ``w_a``, ``w_b`` observed at ``n_a``, ``n_b`` requests the two
intervals stop overlapping at ``n`` requests per target when ``(w_a sqrt(n_a) + w_b sqrt(n_b)) /
sqrt(n) < |a - b|``, so ``n = ceil(((w_a sqrt(n_a) + w_b sqrt(n_b)) / |a - b|)^2)``: an estimate
from the observed spread, that assumes the difference seen is the true one; never fewer than
``1 / (1 - q)`` requests for a quantile ``q`` (100 for a P99).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CONFIDENCE",
    "RESAMPLES",
    "SEED",
    "Interval",
    "e2e_values",
    "interval",
    "overlap",
    "requests_needed",
]

#: bootstrap resamples per interval
RESAMPLES = 2000
#: two-sided confidence of every interval
CONFIDENCE = 0.95
#: seed of the resampling (a report is reproducible from its records)
SEED = 20260421

_QUANTILE = {"p50": 0.50, "p99": 0.99}
#: values resampled per batch (8 bytes each: 16 MB), whatever the number of records
_BATCH_VALUES = 2_000_000


@dataclass(frozen=True)
class Interval:
    """A figure's bootstrap confidence interval.

    Attributes:
        lo: lower bound (the figure's unit).
        hi: upper bound.
        n: records it was computed from.
        stat: ``p50``, ``p99``, ``ratio`` or ``qps``.
    """

    lo: float
    hi: float
    n: int
    stat: str

    @property
    def half_width(self) -> float:
        """Half the interval's width."""
        return (self.hi - self.lo) / 2

    def to_json(self) -> dict[str, Any]:
        """``{"lo", "hi", "n", "stat", "confidence", "resamples"}``."""
        return {"lo": self.lo, "hi": self.hi, "n": self.n, "stat": self.stat,
                "confidence": CONFIDENCE, "resamples": RESAMPLES}  # fmt: skip


def _due(r: Mapping[str, Any]) -> float | None:
    """When ``r`` was due: ``intended_at`` when no later than ``sent_at``, else ``sent_at``
    (the rule of :mod:`chaoslib_infer.measure.metrics`)."""
    s, i = r.get("sent_at"), r.get("intended_at")
    if not isinstance(s, int | float):
        return None
    return float(i) if isinstance(i, int | float) and i <= s else float(s)


def e2e_values(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """E2E latency (seconds, end minus when due) of each successful record that has both."""
    out: list[float] = []
    for r in records:
        due, end = _due(r), r.get("end_at")
        if r.get("ok") and due is not None and isinstance(end, int | float):
            out.append(float(end) - due)
    return out


def interval(
    values: Sequence[float],
    stat: str,
    *,
    durations: Sequence[float] | None = None,
    concurrency: int = 1,
) -> Interval | None:
    """Bootstrap confidence interval of ``stat`` over ``values`` (module docstring).

    Args:
        values: per record: E2E seconds (``p50``/``p99``), 0/1 failed (``ratio``), 0/1 ok
            (``qps``).
        stat: ``p50``, ``p99``, ``ratio`` or ``qps``.
        durations: ``qps`` only: each record's attempt time in seconds, same order as ``values``.
        concurrency: ``qps`` only: the step's closed-loop workers.

    Returns:
        The interval, or None without a value (a figure nobody measured has no interval).

    Raises:
        ValueError: an unknown ``stat``, or ``qps`` without ``durations`` of ``values``' length.
    """
    if stat not in (*_QUANTILE, "ratio", "qps"):
        raise ValueError(f"unknown statistic {stat!r}")
    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size == 0:
        return None
    if stat == "qps" and (durations is None or len(durations) != x.size):
        raise ValueError("qps needs one duration per value")
    dur = np.asarray([float(v) for v in durations or ()], dtype=float)
    rng = np.random.default_rng(SEED)
    parts: list[Any] = []
    batch = max(1, _BATCH_VALUES // x.size)  # resamples per batch: memory stays bounded
    for start in range(0, RESAMPLES, batch):
        idx = rng.integers(0, x.size, size=(min(batch, RESAMPLES - start), x.size))
        sample = x[idx]
        if stat in _QUANTILE:
            parts.append(np.quantile(sample, _QUANTILE[stat], axis=1, method="higher"))
        elif stat == "ratio":
            parts.append(sample.mean(axis=1))
        else:
            d = dur[idx].sum(axis=1)
            parts.append(concurrency * sample.sum(axis=1) / np.maximum(d, 1e-9))
    stats = np.concatenate(parts)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return Interval(float(lo), float(hi), int(x.size), stat)


def overlap(a: Interval, b: Interval) -> bool:
    """True when the two intervals share a point (the figure cannot tell the targets apart)."""
    return a.lo <= b.hi and b.lo <= a.hi


def requests_needed(value_a: float, a: Interval, value_b: float, b: Interval) -> int | None:
    """Requests per target at which the two intervals would stop overlapping (module docstring).

    Args:
        value_a, value_b: the two targets' figures (same unit as the intervals).
        a, b: their intervals.

    Returns:
        The estimate, at least one more than the larger sample and, for a quantile ``q``, at
        least ``1 / (1 - q)`` requests (100 for a P99: below that the P99 is the slowest
        request seen, and its bootstrap interval says little); None when the figures are equal (no request count tells them apart)
        or both intervals have no width (nothing to estimate from).
    """
    diff = abs(value_a - value_b)
    spread = a.half_width * math.sqrt(a.n) + b.half_width * math.sqrt(b.n)
    if diff <= 0 or spread <= 0:
        return None
    floor = math.ceil(1 / (1 - _QUANTILE[a.stat])) if a.stat in _QUANTILE else 0
    return max(math.ceil((spread / diff) ** 2), max(a.n, b.n) + 1, floor)
