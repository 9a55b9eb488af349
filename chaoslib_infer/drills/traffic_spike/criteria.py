"""The traffic-spike drill's question and acceptance criteria (see ``drills/criterion.py``).

Shedding is its own class (``shed.py``; ``docs/definitions.md``, "Drill criteria"): a 429/503
answered fast is a shed, judged by its own budget (``shed_share_fault``) and by how fast it
answered (``shed_p99_s``); while the spike is on, shed requests are left out of the common
availability, error-rate and timeout-rate criteria, which every other failure counts against, in
every window (the baseline's defects included, and ``availability_after`` after the spike).
"""

from __future__ import annotations

from chaoslib_infer.capacity import ACCEPTANCE_FACTOR
from chaoslib_infer.drills.criterion import Criterion

QUESTION = (
    "When traffic jumps to twice the peak, how fast does the service scale out, does it shed "
    "early with 429/503 rather than let requests time out, and is it back in its bands after?"
)

#: The spike's rate as a multiple of the real peak (the drill's question: "twice the peak").
SPIKE_FACTOR = 2.0
#: Default budget of the shed share during the spike: a service accepted at
#: :data:`~chaoslib_infer.capacity.ACCEPTANCE_FACTOR` (1.5) x the real peak (``docs/definitions.md``,
#: "Capacity planning": "it must stay stable there") carries 1.5 of the spike's 2 peaks and may
#: shed the rest: 1 - 1.5 / 2 = 0.25 of the spike's requests.
SHED_SHARE_DEFAULT = 1.0 - ACCEPTANCE_FACTOR / SPIKE_FACTOR
#: Default bound of a shed answer's time (s): a 429/503 slower than this is no shed, and the
#: P99 of the shed answers must stay under it (``shed_p99_s``).
SHED_P99_DEFAULT_S = 1.0

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
        "failures during the spike not shed as a fast 429/503 (resets, other 5xx, timeouts)",
        "<=",
        0.0,
        "count",
        "fault",
    ),
    Criterion(
        "shed_share_fault",
        "share of the spike's requests shed as a fast 429/503",
        "<=",
        SHED_SHARE_DEFAULT,
        "ratio",
        "fault",
    ),
    Criterion(
        "shed_p99_s",
        "P99 time to a shed answer (429/503)",
        "<=",
        SHED_P99_DEFAULT_S,
        "s",
        "fault",
    ),
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
    Criterion(
        "availability_after",
        "availability after the spike (a 429/503 counts as a failure)",
        ">=",
        0.999,
        "ratio",
        "after",
    ),
]

#: Every common criterion is judged (availability, error and timeout rates with the spike's
#: shed requests left out, ``chaoslib_infer.verdict.spike``).
DROPPED_COMMON: frozenset[str] = frozenset()
