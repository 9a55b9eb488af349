"""The jitter shim's per-chunk delay (:class:`DelaySampler`: seeded ``normal`` or ``uniform``
delay, chunk loss) and the running statistics of the delays it applied (:class:`RunningStats`).

Split out of :mod:`chaoslib_infer.lab.shim` (used there and by the managed endpoint's client-side
jitter, :mod:`chaoslib_infer.platforms.endpoint`), which re-exports these names.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["DISTRIBUTIONS", "DelaySampler", "RunningStats"]

DISTRIBUTIONS = ("normal", "uniform")


# --------------------------------------------------------------------------------------------
# Delay distribution and stats
# --------------------------------------------------------------------------------------------
class DelaySampler:
    """Seeded per-chunk delay: ``normal`` N(delay, jitter) or ``uniform`` delay +- jitter, >= 0."""

    def __init__(
        self,
        delay_s: float,
        jitter_s: float,
        distribution: str = "normal",
        seed: int | None = None,
        loss: float = 0.0,
    ) -> None:
        """Args:
            delay_s: mean delay per chunk, seconds (>= 0).
            jitter_s: normal: standard deviation; uniform: half-width, seconds (>= 0).
            distribution: one of :data:`DISTRIBUTIONS`.
            seed: RNG seed (None: random).
            loss: probability (0..1) that a chunk is lost (the connection is reset).

        Raises:
            ValueError: a negative delay or jitter, loss outside 0..1, unknown distribution.
        """
        if not (delay_s >= 0 and jitter_s >= 0):
            raise ValueError(f"delay and jitter must be >= 0, got {delay_s!r}, {jitter_s!r}")
        if not 0.0 <= loss <= 1.0:
            raise ValueError(f"loss must be a probability in [0, 1], got {loss!r}")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"unknown distribution {distribution!r}; the shim supports {', '.join(DISTRIBUTIONS)}"
            )
        self.delay_s = float(delay_s)
        self.jitter_s = float(jitter_s)
        self.distribution = distribution
        self.loss = float(loss)
        self._rng = random.Random(seed)

    def sample(self) -> float:
        """One delay in seconds (>= 0)."""
        if self.jitter_s == 0:
            return self.delay_s
        if self.distribution == "normal":
            d = self._rng.gauss(self.delay_s, self.jitter_s)
        else:
            d = self._rng.uniform(self.delay_s - self.jitter_s, self.delay_s + self.jitter_s)
        return d if d > 0 else 0.0

    def lost(self) -> bool:
        """True with probability ``loss`` (a lost chunk: reset the connection)."""
        return self.loss > 0 and self._rng.random() < self.loss


@dataclass
class RunningStats:
    """Welford accumulator: count, mean, stdev (sample), min, max."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf

    def add(self, x: float) -> None:
        """Add one observation."""
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)
        self.lo = min(self.lo, x)
        self.hi = max(self.hi, x)

    def as_dict(self) -> dict[str, float | int | None]:
        """``{"n", "mean_s", "stdev_s", "min_s", "max_s"}`` (None without data)."""
        if self.n == 0:
            return {"n": 0, "mean_s": None, "stdev_s": None, "min_s": None, "max_s": None}
        sd = math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0
        return {"n": self.n, "mean_s": self.mean, "stdev_s": sd, "min_s": self.lo, "max_s": self.hi}
