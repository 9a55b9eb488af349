"""The traffic-spike drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import Criterion

QUESTION = (
    "When traffic jumps to twice the peak, how fast does the service scale out, does it shed "
    "early with 429/503 rather than let requests time out, and is it back in its bands after?"
)

CRITERIA: list[Criterion] = [
    Criterion(
        "timeouts_fault",
        "timeouts during the spike (shed must be 429/503)",
        "<=",
        0.0,
        "count",
        "fault",
    ),
    Criterion(
        "non_shed_failures_fault",
        "failures during the spike not shed as 429/503 (resets, other 5xx, timeouts)",
        "<=",
        0.0,
        "count",
        "fault",
    ),
    Criterion("shed_p99_s", "P99 time to a shed answer (429/503)", "<=", 1.0, "s", "fault"),
    Criterion("scale_out_s", "scale-out (trigger to serving)", "<=", 30.0, "s", "fault"),
    Criterion(
        "recovery_s",
        "back inside the baseline bands after the spike",
        "<=",
        60.0,
        "s",
        "after",
        key=True,
    ),
]

#: Shedding overload is the sane answer to a spike: judged by how (429/503, fast), not as lost
#: availability; timeouts still count, and every other failure of the spike (a reset, a 500, a
#: 502, a timeout) fails ``non_shed_failures_fault``. These common criteria are not judged for
#: this drill.
DROPPED_COMMON: frozenset[str] = frozenset({"availability", "availability_fault", "error_rate"})
