"""Mitigation while the fault is on: the burn rate of a window and what its failures were.

A drill ends its fault after seconds; a real fault lasts until someone fixes it. So the
service must *mitigate* it: from a stated mitigation time after the injection until the fault
is over, its failure rate must be back within the SLO with the fault still present
(``docs/definitions.md``, "Recovery"). This module holds the pure arithmetic of that window:

- the **burn rate**: the window's failed fraction of logical requests over the SLO's allowed
  fraction, ``failed / requests / (1 - SLO)`` (the SRE workbook's definition, "Alerting on
  SLOs": 1x spends exactly the budget over the SLO's period);
- the time the month's budget lasts at that rate, ``30 days / burn rate``;
- the failure classes of the window, in words a person acts on (``garbled``, ``empty``,
  ``truncated``, ``in-stream error``, ``400``, ``hang``, ``reset``...).

Which window, which mitigation time and how it is judged (the exact binomial test of
:func:`chaoslib_infer.measure.slo.window_test`): :mod:`chaoslib_infer.verdict.mitigation`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .metrics import TIMEOUT_CLASSES, logical_outcomes, select

__all__ = [
    "CLASS_WORDS",
    "MONTH_S",
    "budget_gone_in_s",
    "burn_rate",
    "duration_words",
    "failure_classes",
]

#: The SLO period the burn rate spends (s): 30 days, as the monthly budget
#: (:data:`chaoslib_infer.measure.budget.DAYS_PER_MONTH`).
MONTH_S = 30 * 86400.0

#: A failed request's class (``load/attempts.py`` ``ERROR_CLASSES``) in the words of a reason:
#: the engine fault's failure classes as a person names them. A timeout of any kind is a hang
#: (the service held the request until the client gave up).
CLASS_WORDS: dict[str, str] = {
    "garbled": "garbled",
    "empty": "empty",
    "truncated": "truncated",
    "stream_error": "in-stream error",
    "http_4xx": "400",
    "http_5xx": "5xx",
    "http_429": "429",
    "reset": "reset",
    "connect": "connection refused",
    "not_sent": "not sent (in-flight cap full)",
    **{c: "hang" for c in TIMEOUT_CLASSES},
}


def burn_rate(failed: int, requests: int, slo_availability: float) -> float | None:
    """The error-budget burn rate of a window: ``failed / requests / (1 - slo_availability)``.

    Args:
        failed: failed logical requests of the window.
        requests: logical requests of the window (0: None, nothing measured).
        slo_availability: the availability SLO, in (0, 1).

    Returns:
        The burn rate (1.0: spends the budget exactly over the SLO's period; 0.0: no failure),
        or None without a request.

    Raises:
        ValueError: an SLO outside (0, 1) or a negative count.
    """
    if not 0.0 < slo_availability < 1.0:
        raise ValueError(f"slo_availability must be in (0, 1), got {slo_availability!r}")
    if failed < 0 or requests < 0:
        raise ValueError(f"counts must be >= 0, got failed={failed}, requests={requests}")
    if requests == 0:
        return None
    return min(failed, requests) / requests / (1.0 - slo_availability)


def budget_gone_in_s(burn: float | None, period_s: float = MONTH_S) -> float | None:
    """How long the period's whole error budget lasts at ``burn`` (s): ``period_s / burn``;
    None when nothing burns (``burn`` 0 or None: the budget is never spent at this rate)."""
    if burn is None or burn <= 0:
        return None
    return period_s / burn


def duration_words(seconds: float) -> str:
    """A duration as a person reads it: ``"45 s"``, ``"12 min"``, ``"3.5 h"``, ``"2.1 days"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def failure_classes(records: Iterable[Mapping[str, Any]], crash_exits: int = 0) -> dict[str, int]:
    """The failed logical requests of ``records`` by class, in :data:`CLASS_WORDS`' words.

    Args:
        records: the window's attempt records (each logical request by its final attempt; a
            request cut off when the load stopped is left out, as in the rates).
        crash_exits: exits of the faulted replica in the window (engine ledger / lab events):
            two or more name the resets and 5xx they caused ``crash loop (N exits)``.

    Returns:
        ``{word: failed requests}``, most frequent first (an unknown class keeps its own name).
    """
    counts: dict[str, int] = {}
    for r in select(logical_outcomes(list(records)), None, None):
        if r.get("ok") or r.get("error_class") == "cut_off" or r.get("cut_off"):
            continue
        cls = str(r.get("error_class") or "unknown")
        word = CLASS_WORDS.get(cls, cls)
        if crash_exits >= 2 and cls in ("reset", "http_5xx", "connect"):
            word = f"crash loop ({crash_exits} exits)"
        counts[word] = counts.get(word, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
