"""The shape of one acceptance criterion, and the pieces several drills' criteria share.

Dependency-free on purpose: every room's ``criteria.py`` imports it, and
:mod:`chaoslib_infer.verdict.criteria` (the common criteria, overrides, ``criteria_for``)
assembles the drills' lists from :mod:`chaoslib_infer.drills.registry`. Thresholds come from the
acceptance table of ``docs/definitions.md`` ("Acceptance SLOs", "Drill criteria").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIN_REQUESTS", "ROUTED_TO_DOWN", "Criterion", "interruption"]

#: Minimum requests of a judged window (``docs/definitions.md``, "Windows"): the baseline must
#: show a defect of a few percent (50 requests: 2 failures are 4 %), the fault window must hold
#: enough requests to say anything. Here, in the dependency-free module, so the load control can
#: size its warm-up without importing the verdict.
MIN_REQUESTS = {"baseline": 50, "fault": 10}


@dataclass(frozen=True)
class Criterion:
    """One judged figure.

    Attributes:
        name: unique key (the override name, the ``crit_<name>`` configuration key).
        label: what a person reads in a reason or a table row.
        op: ``<=``, ``<``, ``>=`` or ``>``: value ``op`` threshold passes.
        threshold: default threshold (None: not judged).
        unit: ``s``, ``ratio`` (0..1), ``x`` (a factor), ``count``.
        window: ``baseline``, ``fault``, ``after`` or ``drill``.
        key: the drill's question cannot be answered without it: unmeasured makes the drill
            ``inconclusive``.
    """

    name: str
    label: str
    op: str
    threshold: float | None
    unit: str
    window: str
    key: bool = False


#: Shown (never judged by default) by the drills that take replicas away: node-loss,
#: simultaneous-restarts (a gateway figure, :data:`chaoslib_infer.verdict.criteria.GATEWAY_ONLY`).
ROUTED_TO_DOWN = Criterion(
    "routed_to_down", "requests the gateway routed to a replica that was down", "<=", None,
    "count", "fault",
)  # fmt: skip


def interruption(key: bool = False) -> list[Criterion]:
    """The interruption criteria a drill that kills or drops replicas shares.

    Args:
        key: the interruption answers the drill's question (unmeasured: inconclusive).

    Returns:
        ``interruption_s`` (<= 10 s, fault window) and ``interruption_sustained`` (>= 1).
    """
    return [
        Criterion("interruption_s", "interruption", "<=", 10.0, "s", "fault", key=key),
        Criterion(
            "interruption_sustained",
            "service sustained after the interruption",
            ">=",
            1.0,
            "count",
            "fault",
        ),
    ]
