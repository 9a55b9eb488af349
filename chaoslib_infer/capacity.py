"""Capacity planning: the instance-count formula, as one function everyone calls.

From ``docs/definitions.md`` ("Capacity planning")::

    instances = ceil(peak_QPS x expected_latency_s / max_concurrency_per_instance / redundancy_factor)

Example there: 200 QPS x 1 s / 20 / 0.7 = 14.28, so 15 instances. Keep the autoscaler's minimum at
about 60% of that (cold-start jitter) and accept the service at 1.5x the real peak.

Used by ``chaos-infer capacity`` and by the quota-cut drill (``chaoslib_infer.activities.capacity``),
which plans the instance count for the drill's own offered load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AUTOSCALER_MIN_SHARE", "ACCEPTANCE_FACTOR", "CapacityPlan", "instances", "plan"]

#: The autoscaler's minimum as a share of the planned instances (docs/definitions.md: "about 60%").
AUTOSCALER_MIN_SHARE = 0.6
#: Acceptance load as a multiple of the real peak (docs/definitions.md: "1.5x the real peak").
ACCEPTANCE_FACTOR = 1.5
#: Tolerance for float error before rounding up (200 x 1 / 20 / 0.5 must give 20, not 21).
_EPS = 1e-9


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CapacityPlan:
    """Result of :func:`plan` (inputs echoed so a report can show the arithmetic).

    Attributes:
        peak_qps: peak requests/s of the busiest 10 minutes.
        expected_latency_s: expected latency per request, seconds.
        max_concurrency_per_instance: concurrent requests one instance serves.
        redundancy_factor: target utilisation, in (0, 1].
        raw: the unrounded quotient (instances, float).
        instances: ``ceil(raw)``, at least 1.
        autoscaler_min: ``ceil(instances x 0.6)``, at least 1.
        acceptance_qps: ``peak_qps x 1.5`` (requests/s).
    """

    peak_qps: float
    expected_latency_s: float
    max_concurrency_per_instance: float
    redundancy_factor: float
    raw: float
    instances: int
    autoscaler_min: int
    acceptance_qps: float

    def describe(self) -> str:
        """One line: ``200 QPS x 1 s / 20 / 0.7 = 14.29 -> 15 instances``."""
        return (
            f"{self.peak_qps:g} QPS x {self.expected_latency_s:g} s / "
            f"{self.max_concurrency_per_instance:g} / {self.redundancy_factor:g} = {self.raw:.2f} "
            f"-> {self.instances} instances"
        )


def plan(
    peak_qps: float,
    expected_latency_s: float,
    max_concurrency_per_instance: float,
    redundancy_factor: float = 0.7,
) -> CapacityPlan:
    """Plan the instance count with the capacity formula (``docs/definitions.md``).

    Args:
        peak_qps: peak requests/s (> 0).
        expected_latency_s: expected latency per request in seconds (> 0), e.g. the steady-state
            P50 end-to-end latency.
        max_concurrency_per_instance: concurrent requests one instance serves (> 0), e.g. vLLM's
            ``max_num_seqs``.
        redundancy_factor: target utilisation in (0, 1] (0.7 = keep 30% headroom).

    Returns:
        The :class:`CapacityPlan` (instances >= 1).

    Raises:
        ValueError: a non-numeric, non-finite or non-positive input, or a redundancy factor
            above 1.
    """
    qps = _positive("peak_qps", peak_qps)
    lat = _positive("expected_latency_s", expected_latency_s)
    conc = _positive("max_concurrency_per_instance", max_concurrency_per_instance)
    red = _positive("redundancy_factor", redundancy_factor)
    if red > 1:
        raise ValueError(f"redundancy_factor must be in (0, 1], got {redundancy_factor!r}")
    raw = qps * lat / conc / red
    if not math.isfinite(raw):
        raise ValueError(f"instance count overflows: {qps:g} x {lat:g} / {conc:g} / {red:g}")
    n = max(1, math.ceil(raw - _EPS))
    return CapacityPlan(
        peak_qps=qps,
        expected_latency_s=lat,
        max_concurrency_per_instance=conc,
        redundancy_factor=red,
        raw=raw,
        instances=n,
        autoscaler_min=max(1, math.ceil(n * AUTOSCALER_MIN_SHARE - _EPS)),
        acceptance_qps=qps * ACCEPTANCE_FACTOR,
    )


def instances(
    peak_qps: float,
    expected_latency_s: float,
    max_concurrency_per_instance: float,
    redundancy_factor: float = 0.7,
) -> int:
    """``ceil(peak_QPS x expected_latency_s / max_concurrency_per_instance / redundancy_factor)``.

    Example (``docs/definitions.md``): ``instances(200, 1.0, 20, 0.7) == 15``.

    Raises:
        ValueError: see :func:`plan`.
    """
    return plan(
        peak_qps, expected_latency_s, max_concurrency_per_instance, redundancy_factor
    ).instances
