"""The node-loss drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import ROUTED_TO_DOWN, Criterion, interruption

QUESTION = (
    "When a compute node drops with every replica on it, do the gateway and the orchestrator "
    "move the work to spare capacity, and how long are users interrupted?"
)

CRITERIA: list[Criterion] = [
    *interruption(key=True),
    Criterion(
        "replacement_serving_s",
        "moved replicas serving again",
        "<=",
        60.0,
        "s",
        "fault",
        key=True,
    ),
    ROUTED_TO_DOWN,
]

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
