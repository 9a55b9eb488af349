"""The traffic-spike drill's values: the common SLOs with shedding as its own class.

Definitions (``docs/definitions.md``, "Drill criteria"; the classes: ``drills/traffic_spike/
shed.py``): a logical request whose final attempt was answered 429/503 within the
``shed_p99_s`` threshold is *shed*. Shed requests sent while the spike is on (from the fault
window's start until the after window opens: the spike and its settling) are left out of
``availability``, ``availability_fault``, ``error_rate``, ``timeout_rate`` and
``timeout_rate_fault`` and judged by ``shed_share_fault`` (shed / sent in the fault window) and
``shed_p99_s`` (P99 of the shed answers' times). Every other failure counts, in every window; a
429/503 outside the spike is a failure like any other: the baseline's (the verdict's baseline
check, :func:`chaoslib_infer.verdict.state.baseline_defects`, over the baseline's own records)
and ``availability_after``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chaoslib_infer.drills.traffic_spike.shed import (
    non_shed_failures,
    shed_answer_p99_s,
    shed_share,
    without_shed,
)

from .criteria import Criterion
from .facts import num
from .state import request_stats

__all__ = ["SHED_BOUND", "spike_values"]

#: The criterion whose threshold bounds a shed answer's time (None, ``off``: any 429/503).
SHED_BOUND = "shed_p99_s"


def spike_values(
    crits: Sequence[Criterion],
    w: dict[str, tuple[float, float]],
    sel: Callable[[str], list[dict[str, Any]]],
) -> dict[str, tuple[float | None, str | None]]:
    """The traffic-spike drill's values that shedding changes (module docstring).

    Args:
        crits: the drill's criteria, overrides applied (the shed bound is ``shed_p99_s``'s
            threshold).
        w: the judged windows, ``{name: (start, end)}`` unix seconds (``drill``, ``fault``,
            ``after``...).
        sel: each window's records (attempts).

    Returns:
        ``{criterion name: (value, note)}`` for ``availability``, ``availability_fault``,
        ``error_rate``, ``timeout_rate``, ``timeout_rate_fault``, ``non_shed_failures_fault``,
        ``shed_share_fault``, ``shed_p99_s`` and ``availability_after``; {} without a fault
        window (nothing to leave out: the common values stand).
    """
    if "fault" not in w:
        return {}
    bound = next((c.threshold for c in crits if c.name == SHED_BOUND), None)
    start = w["fault"][0]
    end = w["after"][0] if "after" in w else None  # the spike and its settling
    drill = request_stats(without_shed(sel("drill"), bound, start, end), None, None)
    fault_recs = sel("fault")
    fault = request_stats(without_shed(fault_recs, bound), None, None)
    out: dict[str, tuple[float | None, str | None]] = {
        "availability": (num(drill.get("availability")), None),
        "error_rate": (num(drill.get("error_rate")), None),
        "timeout_rate": (num(drill.get("timeout_rate")), None),
        "availability_fault": (num(fault.get("availability")), None),
        "timeout_rate_fault": (num(fault.get("timeout_rate")), None),
        "non_shed_failures_fault": (float(non_shed_failures(fault_recs, bound)), None),
        "shed_share_fault": (shed_share(fault_recs, bound), None),
    }
    if out["availability_fault"][0] is None and fault_recs:
        out["availability_fault"] = (None, "every request of the spike was shed")
    p99 = shed_answer_p99_s(fault_recs)
    out["shed_p99_s"] = (p99, None if p99 is not None else "no request was shed")
    after = request_stats(sel("after"), None, None) if "after" in w else {}
    out["availability_after"] = (num(after.get("availability")), None)
    return out
