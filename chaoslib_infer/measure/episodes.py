"""Episodes out of SLO: every stretch of failures from a fault's injection to the end of the load
(``docs/definitions.md``, "Drill figures", interruption time).

An episode opens at a user-visible failure (its ``end_at``: when the client got the error) and
closes at the first failure F of it followed by sustained service: the settling window
``(F, F + settle_s]`` holds at least one success and no failed attempt was in flight in it (none
with ``end_at > F`` and ``sent_at <= F + settle_s``). So a failure still pending (a request hung
on a frozen replica, visible only when the client gives up) keeps its episode open, and silence
is never mistaken for health. The next failure after a closed episode opens the next one: a
second collapse after a brief return counts like the first. When the data end before the last
episode was seen to close, it ends at its last failure and is not ``sustained``.

The time out of SLO is the sum of the episodes' lengths (first to last failure of each); one
failure alone is an episode of 0 s (a stream cut at the injection).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SETTLE_S", "Episode", "Episodes", "episodes"]

#: Seconds of service without a failure after which an episode is over (its settling window).
SETTLE_S = 5.0


@dataclass(frozen=True)
class Episode:
    """One episode out of SLO.

    Attributes:
        start: its first user-visible failure (unix s).
        end: its last failure (unix s).
        failed: failed attempts visible in ``[start, end]``.
        sustained: service was seen sustained after it (False: the data ended first).
    """

    start: float
    end: float
    failed: int
    sustained: bool

    @property
    def length_s(self) -> float:
        """Seconds from its first to its last failure."""
        return self.end - self.start


@dataclass(frozen=True)
class Episodes:
    """Every episode of one fault, in order (empty: no failure after the injection)."""

    items: tuple[Episode, ...]

    @property
    def total_s(self) -> float:
        """Time out of SLO: the sum of the episodes' lengths (s)."""
        return sum(e.length_s for e in self.items)

    @property
    def longest(self) -> Episode | None:
        """The longest episode (the first of equals), None without one."""
        return max(self.items, key=lambda e: e.length_s, default=None)

    @property
    def sustained(self) -> bool:
        """Service was seen sustained after the last episode (True without one)."""
        return self.items[-1].sustained if self.items else True

    def spans(self, since: float) -> list[list[float]]:
        """``[[start, end], ...]`` of every episode in seconds after ``since`` (the injection)."""
        return [[e.start - since, e.end - since] for e in self.items]


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def episodes(
    records: Iterable[Mapping[str, Any]], fault_at: float, settle_s: float = SETTLE_S
) -> Episodes:
    """Every episode out of SLO from ``fault_at`` to the end of the data (module docstring).

    Args:
        records: attempt records (unix-second ``sent_at`` / ``end_at``, ``ok``); cut-off ones
            (the load stopped) and those visible before ``fault_at`` are ignored.
        fault_at: fault injection time (unix s).
        settle_s: settling window (s).

    Returns:
        The :class:`Episodes`.
    """
    recs = [
        r
        for r in records
        if _num(r.get("end_at")) and r["end_at"] >= fault_at and not r.get("cut_off")
    ]
    fails = sorted(
        (float(r["end_at"]), float(r["sent_at"]) if _num(r.get("sent_at")) else float(r["end_at"]))
        for r in recs
        if not r.get("ok")
    )
    succ = sorted(float(r["end_at"]) for r in recs if r.get("ok"))
    observed_until = max((float(r["end_at"]) for r in recs), default=fault_at)
    out: list[Episode] = []
    i = 0
    while i < len(fails):
        start, close, sustained = fails[i][0], len(fails) - 1, False
        for j in range(i, len(fails)):
            f = fails[j][0]
            horizon = f + settle_s
            if any(end > f and sent <= horizon for end, sent in fails[j + 1 :]):
                continue  # a failure visible in the window, or one in flight in it
            if any(f < t <= horizon for t in succ) and (
                j + 1 < len(fails) or observed_until >= horizon
            ):
                close, sustained = j, True
                break
        last = fails[close][0]
        out.append(Episode(start, last, close - i + 1, sustained))
        i = close + 1
    return Episodes(tuple(out))
