"""The statistics of the run comparison: Student's t distribution and Holm's correction.

Small and exact enough for the comparison's needs (a p-value to three significant figures); no
SciPy dependency. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["holm", "prediction_p", "t_cdf"]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    ln += b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """P(T <= t) for Student's t distribution with ``dof`` degrees of freedom (``dof`` > 0).

    Raises:
        ValueError: ``dof`` is not positive.
    """
    if dof <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {dof}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _betai(dof / 2.0, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t > 0 else tail


def prediction_p(value: float, history: Sequence[float], min_sd: float = 0.0) -> float:
    """Two-sided p-value of ``value`` as one more draw of the population ``history`` came from.

    The Student-t prediction test: ``t = (value - mean) / (sd * sqrt(1 + 1/n))`` with ``n - 1``
    degrees of freedom, exact when the runs are independent draws of one normal distribution
    (the comparison hands it log values: log-normal figures). ``sd`` is at least ``min_sd``, which
    only makes the test more conservative (a history of identical values is not infinitely sure).

    Args:
        value: the new run's value.
        history: the earlier runs' values (at least 2).
        min_sd: floor of the standard deviation, same unit as the values.

    Returns:
        The p-value in [0, 1].

    Raises:
        ValueError: fewer than 2 history values.
    """
    n = len(history)
    if n < 2:
        raise ValueError(f"a prediction test needs 2 or more earlier values, got {n}")
    mean = sum(history) / n
    sd = math.sqrt(sum((h - mean) ** 2 for h in history) / (n - 1))
    sd = max(sd, min_sd)
    if sd == 0.0:
        return 1.0 if value == mean else 0.0
    t = (value - mean) / (sd * math.sqrt(1.0 + 1.0 / n))
    return min(1.0, 2.0 * t_cdf(-abs(t), n - 1))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down correction: which of ``p_values`` are significant with the family-wise
    error rate held at ``alpha`` (the chance that any true null is rejected).

    Returns:
        One bool per p-value, in the order given.
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        out[i] = True
    return out
