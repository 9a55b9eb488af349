"""The quota-cut drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import Criterion

QUESTION = (
    "When the instances allowed drop to the capacity plan's minimum, does that count still "
    "carry the online load within the SLOs?"
)

CRITERIA: list[Criterion] = [
    Criterion(
        "instances_held",
        "replicas serving during the cut / quota",
        ">=",
        1.0,
        "x",
        "fault",
        key=True,
    ),
]

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
