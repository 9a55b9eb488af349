"""The simultaneous-restarts drill's question and criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import ROUTED_TO_DOWN, Criterion, interruption

QUESTION = (
    "When several replicas restart at once, does the gateway pour all traffic onto the "
    "survivors, and can they carry it until every restarted replica serves again?"
)

CRITERIA: list[Criterion] = [
    Criterion(
        "all_serving_s",
        "every restarted replica serving again",
        "<=",
        60.0,
        "s",
        "fault",
        key=True,
    ),
    Criterion(
        "max_survivor_share", "largest share one survivor carried", "<=", 0.75, "ratio", "fault"
    ),
    ROUTED_TO_DOWN,
    *interruption(),
]

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
