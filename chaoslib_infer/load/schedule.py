"""Open-loop arrival schedules.

A schedule is a precomputed, sorted list of **absolute offsets in seconds** from the start of a run.
The load client sends request *i* at ``start + schedule[i]`` no matter how earlier requests fared
(open loop), so queueing inside the client shows up as ``sent_at - intended_at`` instead of being
hidden (coordinated omission, see ``shared/measurement.md``, "Send time").
"""

from __future__ import annotations

import math
import random

__all__ = ["constant_schedule", "poisson_schedule"]


def _check(rate_rps: float, duration_s: float) -> None:
    if not (isinstance(rate_rps, int | float) and math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate_rps must be a finite number > 0, got {rate_rps!r}")
    if not (isinstance(duration_s, int | float) and math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}")


def poisson_schedule(rate_rps: float, duration_s: float, seed: int | None = 0) -> list[float]:
    """Arrival offsets of a Poisson process (exponential inter-arrival gaps).

    Args:
        rate_rps: mean arrival rate in requests per second (> 0).
        duration_s: length of the schedule in seconds (>= 0); every offset is < ``duration_s``.
        seed: seed of a private ``random.Random``; the same seed gives the same schedule.

    Returns:
        Sorted offsets in seconds from the start of the run. The expected length is
        ``rate_rps * duration_s``; the first arrival is after one exponential gap, not at 0.

    Raises:
        ValueError: rate or duration not a finite positive number.
    """
    _check(rate_rps, duration_s)
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out


def constant_schedule(rate_rps: float, duration_s: float) -> list[float]:
    """Evenly spaced arrivals ``0, 1/rate, 2/rate, ...`` strictly below ``duration_s``.

    Args:
        rate_rps: arrivals per second (> 0).
        duration_s: length of the schedule in seconds (>= 0).

    Returns:
        Offsets in seconds from the start of the run (``ceil(rate_rps * duration_s)`` of them).

    Raises:
        ValueError: rate or duration not a finite positive number.
    """
    _check(rate_rps, duration_s)
    gap = 1.0 / rate_rps
    n = math.ceil(duration_s * rate_rps - 1e-9)
    return [i * gap for i in range(n) if i * gap < duration_s]
