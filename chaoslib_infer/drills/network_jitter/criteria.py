"""The network-jitter drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import Criterion, retry_cost

QUESTION = (
    "When the link to one replica gets slow and irregular, do the client's and the gateway's "
    "retries cause duplicate (twice-paid) generations?"
)

#: What retries cost (every drill judges these when it retried: ``drills/criterion.py``
#: ``retry_cost``); here duplicate generations are the key: the drill's question.
CRITERIA: list[Criterion] = retry_cost(key=True)

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
