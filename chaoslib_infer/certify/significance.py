"""Confidence intervals of the compared figures, and when two targets are told apart.

Two targets are ranked on a figure only when its confidence intervals do not overlap; where they
overlap the figure cannot tell the targets apart ("tie" on it) and the next figure of the ranking
order decides (``docs/certification.md``, "Scorecard and ranking").

Intervals (:func:`interval`): a **percentile circular block bootstrap over the records in send
order** (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13, for the
percentile interval; Politis & Romano, 1992, for the circular blocks): :data:`RESAMPLES`
resamples, each ``ceil(n / b)`` blocks of ``b`` consecutive records (wrapping at the end, so every
record is equally likely) drawn with replacement and cut to ``n``, seeded (:data:`SEED`, so a
report is reproducible), the statistic recomputed on each, the interval the
``(1 - CONFIDENCE) / 2`` and ``(1 + CONFIDENCE) / 2`` quantiles of those values.

Why blocks: failures and slow requests come in bursts (a replica down for 2 s fails every
request it holds), and records resampled one by one forget it: a burst of 10 failures and 10
spread over the run gave the same interval. Blocks keep a burst whole, so a burst's interval is
wider (the run saw fewer independent events than records). The **block length** ``b``
(:func:`block_length`) is chosen from the figure's own series by the automatic rule of Politis &
White (2004) with the correction of Patton, Politis & White (2009) for the circular block
bootstrap: the lag ``m`` after which ``K = max(5, sqrt(log10 n))`` consecutive
autocorrelations are insignificant (``|rho| < 2 sqrt(log10(n) / n)``), the flat-top lag window
over ``M = min(2 m, sqrt(n) + K)`` lags, ``b = (2 G^2 / D)^(1/3) n^(1/3)`` with ``G =
sum lambda(k/M) |k| R(k)``, ``D = 4/3 (sum lambda(k/M) R(k))^2``, rounded up and kept within
``[1, min(3 sqrt(n), n / 3)]``: the block length that minimises the error of the bootstrap's
variance, about as long as the dependence. A series without dependence (or without variation:
no failure at all) gets ``b = 1``, the record bootstrap. Statistics:

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
    "block_length",
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
        block: the block length the bootstrap resampled (records; 1: record by record).
    """

    lo: float
    hi: float
    n: int
    stat: str
    block: int = 1

    @property
    def half_width(self) -> float:
        """Half the interval's width."""
        return (self.hi - self.lo) / 2

    def to_json(self) -> dict[str, Any]:
        """``{"lo", "hi", "n", "stat", "block", "confidence", "resamples", "method"}``."""
        return {"lo": self.lo, "hi": self.hi, "n": self.n, "stat": self.stat,
                "block": self.block, "confidence": CONFIDENCE, "resamples": RESAMPLES,
                "method": "circular block bootstrap (Politis-White block length)"}  # fmt: skip


def _flat_top(t: np.ndarray) -> np.ndarray:
    """The flat-top lag window of Politis & Romano (1995): 1 up to 1/2, then down to 0 at 1."""
    a = np.abs(t)
    return np.where(a <= 0.5, 1.0, np.where(a <= 1.0, 2.0 * (1.0 - a), 0.0))


def block_length(series: Sequence[float] | np.ndarray) -> int:
    """The circular block bootstrap's block length for ``series`` (records in send order), by
    the rule of Politis & White (2004) as corrected by Patton, Politis & White (2009) (module
    docstring).

    Returns:
        Records per block, in ``[1, max(1, ceil(min(3 sqrt(n), n / 3)))]``; 1 for fewer than 8
        values or a constant series (nothing to estimate a dependence from).
    """
    x = np.asarray(series, dtype=float)
    n = int(x.size)
    if n < 8 or float(np.ptp(x)) == 0.0:
        return 1
    k_n = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = min(n - 1, math.ceil(math.sqrt(n)) + k_n)
    b_max = max(1, math.ceil(min(3 * math.sqrt(n), n / 3)))
    xc = x - x.mean()
    acv = np.array([float(xc[: n - k] @ xc[k:]) / n for k in range(m_max + 1)])
    rho = acv[1:] / acv[0]
    insignificant = np.abs(rho) < 2.0 * math.sqrt(math.log10(n) / n)
    m_hat = None
    for m in range(0, m_max - k_n + 1):  # lags m+1 .. m+k_n all insignificant
        if insignificant[m : m + k_n].all():
            m_hat = m
            break
    if m_hat is None:  # dependence to the last lag looked at: the largest significant lag
        significant = np.nonzero(~insignificant)[0]
        m_hat = int(significant[-1]) + 1 if significant.size else 0
    big_m = min(2 * m_hat, m_max)
    if big_m == 0:
        return 1
    lags = np.arange(-big_m, big_m + 1)
    r = acv[np.abs(lags)]
    lam = _flat_top(lags / big_m)
    g = float(np.sum(lam * np.abs(lags) * r))
    d = 4.0 / 3.0 * float(np.sum(lam * r)) ** 2
    if d <= 0.0:
        return 1
    b = (2.0 * g * g / d) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return int(min(b_max, max(1, math.ceil(b))))


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
    """Block-bootstrap confidence interval of ``stat`` over ``values`` (module docstring).

    Args:
        values: per record, in send order (the blocks are runs of consecutive records): E2E
            seconds (``p50``/``p99``), 0/1 failed (``ratio``), 0/1 ok (``qps``).
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
    b = block_length(x) if stat != "qps" else max(block_length(x), block_length(dur))
    blocks = math.ceil(x.size / b)
    offsets = np.arange(b)
    rng = np.random.default_rng(SEED)
    parts: list[Any] = []
    batch = max(1, _BATCH_VALUES // (blocks * b))  # resamples per batch: memory stays bounded
    for start in range(0, RESAMPLES, batch):
        starts = rng.integers(0, x.size, size=(min(batch, RESAMPLES - start), blocks))
        idx = ((starts[:, :, None] + offsets) % x.size).reshape(starts.shape[0], -1)[:, : x.size]
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
    return Interval(float(lo), float(hi), int(x.size), stat, b)


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
