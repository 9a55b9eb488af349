"""The network-jitter drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import Criterion

QUESTION = (
    "When the link to one replica gets slow and irregular, do the client's and the gateway's "
    "retries cause duplicate (twice-paid) generations?"
)

CRITERIA: list[Criterion] = [
    Criterion(
        "duplicate_generations", "duplicate generations", "<=", 0.0, "count", "drill", key=True
    ),
    Criterion("extra_generations", "generations paid twice (extra)", "<=", 0.0, "count", "drill"),
    Criterion(
        "wasted_tokens",
        "tokens of generations paid twice (prompt + completion)",
        "<=",
        0.0,
        "tokens",
        "drill",
    ),
    Criterion("retries", "client retries", "<=", None, "count", "drill"),
    Criterion(
        "retry_amplification",
        "upstream generations per client attempt (gateway retries)",
        "<=",
        1.0,
        "x",
        "drill",
    ),
]

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
