"""The interruption figures every drill that kills or drops replicas reports (node-loss, oom-kill,
simultaneous-restarts) and network-jitter (over its users' final outcomes): the time out of SLO
over every episode from the injection on (``measure/episodes.py``); their criteria:
:func:`chaoslib_infer.drills.criterion.interruption` (network-jitter's through
:data:`chaoslib_infer.verdict.criteria.EPISODES_JUDGED`).

Dependency-free: a room's ``figures.py`` hands it what
:func:`chaoslib_infer.measure.figures.interruption` returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["interruption_figures"]


def interruption_figures(intr: Mapping[str, Any]) -> dict[str, Any]:
    """The drill figures of one interruption measurement.

    Args:
        intr: :func:`chaoslib_infer.measure.figures.interruption`'s result.

    Returns:
        ``{"interruption_s": seconds out of SLO over every episode (0.0 when none),
        "failed_requests": count, "interruption_sustained": bool, "first_failure_at",
        "last_failure_at": unix s or None, "episodes": count, "longest_episode_s": seconds,
        "episode_spans": [[start, end], ...] s after the injection}``, in that order.
    """
    return {
        "interruption_s": float(intr.get("interruption_s") or 0.0),
        "failed_requests": int(intr.get("failed_requests") or 0),
        "interruption_sustained": bool(intr.get("sustained")),
        "first_failure_at": intr.get("first_failure_at"),
        "last_failure_at": intr.get("last_failure_at"),
        "episodes": int(intr.get("episodes") or 0),
        "longest_episode_s": float(intr.get("longest_episode_s") or 0.0),
        "episode_spans": list(intr.get("episode_spans") or []),
    }
