"""Acceptance criteria: what each drill judges, over which window, against which default.

Every figure that answers a drill's question has a criterion here, with a default threshold from
the acceptance table of ``docs/definitions.md`` ("Acceptance SLOs", "Drill criteria") or from the
question the drill asks. A threshold of ``None`` means "not judged": the row is shown, never PASS.

Windows (``docs/definitions.md``, "Windows"), all by send time:

- ``baseline``: from the first request of the drill to the fault's injection;
- ``fault``: from injection to the return to service (the drill's own ground truth: the
  replica serving again, the freeze thawed, the spike's end...);
- ``after``: from the return to service to the end of the load;
- ``drill``: the whole drill.

Overrides, most specific last: the plan's ``criteria:`` (all drills), a drill's own
``criteria:``, ``--criterion [DRILL:]NAME=VALUE`` on the command line; inside an experiment the
configuration key ``infer_criteria`` (so ``chaos --no-version-check run --var infer_criteria=interruption_s=5``
works too). A value of ``off`` (or YAML ``null``) turns a criterion into "not judged".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "COMMON",
    "DRILL_CRITERIA",
    "GATEWAY_ONLY",
    "MIN_REQUESTS",
    "Criterion",
    "criteria_for",
    "parse_override",
]


@dataclass(frozen=True)
class Criterion:
    """One judged figure.

    Attributes:
        name: unique key (the override name, the ``crit_<name>`` configuration key).
        label: what a person reads in a reason or a table row.
        op: ``<=``, ``<``, ``>=`` or ``>``: value ``op`` threshold passes.
        threshold: default threshold (None: not judged).
        unit: ``s``, ``ratio`` (0..1), ``x`` (a factor), ``count``.
        window: ``baseline``, ``fault``, ``after`` or ``drill``.
        key: the drill's question cannot be answered without it: unmeasured makes the drill
            ``inconclusive``.
    """

    name: str
    label: str
    op: str
    threshold: float | None
    unit: str
    window: str
    key: bool = False


#: Minimum requests of a judged window (``docs/definitions.md``, "Windows"): the baseline must
#: show a defect of a few percent (50 requests: 2 failures are 4 %), the fault window must hold
#: enough requests to say anything.
MIN_REQUESTS = {"baseline": 50, "fault": 10}

_SLO = [
    Criterion("availability", "availability (whole drill)", ">=", 0.999, "ratio", "drill"),
    Criterion("availability_fault", "availability (fault window)", ">=", 0.999, "ratio", "fault"),
    Criterion("timeout_rate", "timeout rate (whole drill)", "<", 0.005, "ratio", "drill"),
    Criterion("timeout_rate_fault", "timeout rate (fault window)", "<", 0.005, "ratio", "fault"),
    Criterion("error_rate", "error rate (whole drill)", "<", 0.001, "ratio", "drill"),
    Criterion("p99_e2e_s", "P99 E2E latency (whole drill)", "<=", 10.0, "s", "drill"),
    Criterion("p99_e2e_fault_s", "P99 E2E latency (fault window)", "<=", 10.0, "s", "fault"),
]

#: Every drill: the acceptance SLOs over the fault window and the whole drill, the state after
#: the drill against the baseline, and the client's own schedule (a client that fell behind
#: makes the drill inconclusive, see ``judge``).
COMMON: list[Criterion] = [
    *_SLO,
    Criterion(
        "serving_after_vs_baseline",
        "serving replicas after the drill / before it",
        ">=",
        1.0,
        "x",
        "after",
    ),
    Criterion(
        "p99_after_vs_baseline",
        "P99 E2E after the drill / baseline P99",
        "<=",
        2.0,
        "x",
        "after",
    ),
    Criterion("send_lag_p99_s", "client schedule lag P99", "<=", 1.0, "s", "drill"),
    # the client's own lag (kernel receive stamp to handling): above it, its chunk times and
    # open-loop schedule are suspect (inconclusive, like the schedule lag)
    Criterion(
        "client_lag_p99_s", "client lag P99 (kernel receive to handling)", "<=", 0.1, "s", "drill"
    ),
    Criterion(
        "health_disagreement_s",
        "gateway health UP while the faulted replica's completions fail",
        "<=",
        3.0,
        "s",
        "fault",
    ),
    # figures of a gateway other than HAProxy (docs/gateways.md, "Figures"): GATEWAY_ONLY
    Criterion(
        "stream_buffering_s",
        "first token held by the gateway (vs straight to a replica)",
        "<=",
        0.25,
        "s",
        "drill",
    ),
    Criterion("streams_cut_200", "streams answered 200, then cut", "<=", 0.0, "count", "drill"),
]

#: Criteria judged only on a lab whose gateway is not HAProxy (the figures of
#: :mod:`chaoslib_infer.lab.gateways.figures`; a HAProxy lab's rows stay as they were).
GATEWAY_ONLY = frozenset(
    {
        "stream_buffering_s",
        "streams_cut_200",
        "retry_amplification",
        "gateway_timeout_s",
        "routed_to_down",
    }
)

_ROUTED_TO_DOWN = Criterion(
    "routed_to_down", "requests the gateway routed to a replica that was down", "<=", None,
    "count", "fault",
)  # fmt: skip


def _interruption(key: bool = False) -> list[Criterion]:
    """The interruption criteria a drill that kills or drops replicas shares."""
    return [
        Criterion("interruption_s", "interruption", "<=", 10.0, "s", "fault", key=key),
        Criterion(
            "interruption_sustained",
            "service sustained after the interruption",
            ">=",
            1.0,
            "count",
            "fault",
        ),
    ]


_NO_AVAIL = {"availability", "availability_fault", "error_rate"}

#: Each drill's own question (``docs/definitions.md``, "Drill criteria").
DRILL_CRITERIA: dict[str, list[Criterion]] = {
    "node-loss": [
        *_interruption(key=True),
        Criterion(
            "replacement_serving_s",
            "moved replicas serving again",
            "<=",
            60.0,
            "s",
            "fault",
            key=True,
        ),
        _ROUTED_TO_DOWN,
    ],
    "oom-kill": [
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
            "warmup_ratio", "first-request TTFT / steady-state TTFT", "<=", 10.0, "x", "fault"
        ),
        *_interruption(),
    ],
    "network-jitter": [
        Criterion(
            "duplicate_generations", "duplicate generations", "<=", 0.0, "count", "drill", key=True
        ),
        Criterion(
            "extra_generations", "generations paid twice (extra)", "<=", 0.0, "count", "drill"
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
    ],
    "traffic-spike": [
        Criterion(
            "timeouts_fault",
            "timeouts during the spike (shed must be 429/503)",
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
    ],
    "upstream-timeout": [
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
    ],
    "simultaneous-restarts": [
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
        _ROUTED_TO_DOWN,
        *_interruption(),
    ],
    "quota-cut": [
        Criterion(
            "instances_held",
            "instances held at the quota / planned",
            ">=",
            1.0,
            "x",
            "fault",
            key=True,
        ),
    ],
}


def _common_for(drill: str) -> list[Criterion]:
    if drill == "traffic-spike":
        # shedding overload is the sane answer to a spike: judged by how (429/503, fast), not as
        # lost availability; timeouts still count
        return [c for c in COMMON if c.name not in _NO_AVAIL]
    return list(COMMON)


def parse_override(text: str) -> tuple[str | None, str, float | None]:
    """Parse ``[DRILL:]NAME=VALUE`` (``VALUE`` a number or ``off``).

    Returns:
        ``(drill or None, name, threshold or None)``.

    Raises:
        ValueError: no ``=``, an empty name, or a value that is neither a finite number nor
            ``off``.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"criterion {text!r}: expected [DRILL:]NAME=VALUE")
    drill, _, name = key.strip().rpartition(":")
    return (drill or None, name, _threshold(name, value))


def _threshold(name: str, value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "none", "")):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"criterion {name}={value!r}: not a number (or 'off')") from None
    if not math.isfinite(v):
        raise ValueError(f"criterion {name}={value!r}: not a finite number")
    return v


def criteria_for(drill: str, overrides: Mapping[str, Any] | None = None) -> list[Criterion]:
    """The criteria of ``drill`` (its own first, then the common ones) with ``overrides``.

    Args:
        drill: drill name (``node-loss`` ...); an unknown drill gets the common criteria.
        overrides: ``{name: threshold | None | "off"}``.

    Returns:
        Criteria with their thresholds.

    Raises:
        ValueError: an override names no criterion of this drill, or its value is not a number.
    """
    own = DRILL_CRITERIA.get(drill, [])
    crits = [*own, *[c for c in _common_for(drill) if c.name not in {o.name for o in own}]]
    by_name = {c.name: c for c in crits}
    for name, value in (overrides or {}).items():
        if name not in by_name:
            known = ", ".join(sorted(by_name))
            raise ValueError(f"{drill}: unknown criterion {name!r}; known: {known}")
        by_name[name] = replace(by_name[name], threshold=_threshold(name, value))
    return [by_name[c.name] for c in crits]
