"""The upstream-timeout drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import Criterion

QUESTION = (
    "When one model server stops answering but keeps its socket open, does the service fail "
    "fast and route around it, or wait until its clients give up?"
)

CRITERIA: list[Criterion] = [
    Criterion(
        "hung_requests",
        "requests that hung until the client gave up",
        "<=",
        0.0,
        "count",
        "fault",
        key=True,
    ),
    Criterion(
        "max_wait_s", "longest wait of a request in the fault window", "<=", 5.0, "s", "fault"
    ),
    Criterion("ejection_s", "ejection of the frozen replica", "<=", 5.0, "s", "fault"),
    Criterion(
        "gateway_timeout_s",
        "gateway's effective timeout (held before a 5xx or the client gave up)",
        "<=",
        5.0,
        "s",
        "fault",
    ),
]

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
