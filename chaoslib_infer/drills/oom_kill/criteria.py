"""The oom-kill drill's question and acceptance criteria (see ``drills/criterion.py``)."""

from __future__ import annotations

from chaoslib_infer.drills.criterion import Criterion, interruption

QUESTION = (
    "When the kernel OOM-kills one model server, is it restarted and routed around meanwhile, "
    "and how slow is its first request after the restart?"
)

#: What fixes a slow first request after the restart (README.md, "what would fix it").
WARMUP_FIX = (
    "warm the engine before its /health says ready (in the lab: engine_args: {warmup_requests: 0})"
)

CRITERIA: list[Criterion] = [
    Criterion("oom_kills", "kernel OOM kills (ground truth)", ">=", 1.0, "count", "fault"),
    Criterion(
        "restart_s",
        "restart (death to first request served)",
        "<=",
        30.0,
        "s",
        "fault",
        key=True,
    ),
    Criterion(
        "warmup_ratio",
        "first-request TTFT / steady-state TTFT",
        "<=",
        10.0,
        "x",
        "fault",
        fix=WARMUP_FIX,
    ),
    *interruption(),
]

#: Common criteria this drill does not judge (none).
DROPPED_COMMON: frozenset[str] = frozenset()
