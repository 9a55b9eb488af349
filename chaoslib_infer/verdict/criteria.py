"""Acceptance criteria: what each drill judges, over which window, against which default.

The criteria every drill shares live here (:data:`COMMON`); each drill's own live in its room
(``chaoslib_infer/drills/<drill>/criteria.py``) and are assembled from
:data:`chaoslib_infer.drills.registry.DRILLS`. :class:`Criterion` is
:class:`chaoslib_infer.drills.criterion.Criterion` (re-exported).

Every figure that answers a drill's question has a criterion here, with a default threshold from
the acceptance table of ``docs/definitions.md`` ("Acceptance SLOs", "Drill criteria") or from the
question the drill asks. A threshold of ``None`` means "not judged": the row is shown, never PASS.

Windows (``docs/definitions.md``, "Windows"), all by the send time of each logical request's
first attempt (a request is judged in one window with all its attempts):

- ``baseline``: from the first request of the drill to the fault's injection (a request in
  flight at the injection goes by what it was doing then: :mod:`chaoslib_infer.verdict.attribution`);
- ``fault``: from injection to the return to service (the drill's own ground truth: the
  replica serving again, the freeze thawed, the spike's end...);
- ``after``: from the return to service to the end of the load;
- ``drill``: the whole drill.

Overrides, most specific last: the plan's ``criteria:`` (all drills), a drill's own
``criteria:``, ``--criterion [DRILL:]NAME=VALUE`` on the command line; inside an experiment the
configuration key ``infer_criteria`` (so ``chaos --no-version-check run --var infer_criteria=interruption_s=5``
works too). A value of ``off`` (or YAML ``null``) turns a criterion into "not judged"; an empty
value, ``none``, a negative threshold and one criterion given twice with different values are
refused (``docs/definitions.md``, "Drill criteria").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from chaoslib_infer.drills.criterion import (
    MIN_REQUESTS,
    Criterion,
    interruption,
    overrides_for,
    parse_override,
    provider_errors,
    retry_cost,
    threshold_value,
)
from chaoslib_infer.drills.registry import DRILLS

__all__ = [
    "BUDGET",
    "COMMON",
    "DRILL_CRITERIA",
    "ENGINE_FAULT",
    "EPISODES_JUDGED",
    "GATEWAY_ONLY",
    "MIN_REQUESTS",
    "RECOVERY",
    "Criterion",
    "criteria_for",
    "overrides_for",
    "parse_override",
]


_SLO = [
    Criterion("availability", "availability (whole drill)", ">=", 0.999, "ratio", "drill"),
    # named for what it counts, "requests lost to the fault: N" (verdict/budget.py); judged under
    # the strict policy only (verdict/policy.py ZERO_LOSS, like the whole-drill rates)
    Criterion("availability_fault", "requests lost to the fault", ">=", 0.999, "ratio", "fault"),
    Criterion("timeout_rate", "timeout rate (whole drill)", "<", 0.005, "ratio", "drill"),
    Criterion("timeout_rate_fault", "timeout rate (fault window)", "<", 0.005, "ratio", "fault"),
    Criterion("error_rate", "error rate (whole drill)", "<", 0.001, "ratio", "drill"),
    # requests due while the load's in-flight cap was full: the service held every slot (a
    # failure of the service when the client itself kept up; n/a when it did not, see ``judge``)
    Criterion(
        "not_sent", "requests not sent (the in-flight cap was full)", "<=", 0.0, "count", "drill"
    ),
    Criterion("p99_e2e_s", "P99 E2E latency (whole drill)", "<=", 10.0, "s", "drill"),
    Criterion("p99_e2e_fault_s", "P99 E2E latency (fault window)", "<=", 10.0, "s", "fault"),
]

#: The fault's error-budget cost (``measure/budget.py``, ``verdict/budget.py``): seconds of
#: full outage from the injection to the end of the load (shown), and its share of the monthly
#: budget at the plan's expected incidents per month (judged, under every policy), with the peak
#: burn rates over 5 min and 1 h and the fast-burn page beside it (shown). Default: 2 %,
#: the SRE workbook's fast-burn page ("Alerting on SLOs": 2 % of the 30-day budget spent within
#: an hour pages someone): a fault that costs a page's worth at its expected frequency is an
#: incident the service did not absorb.
BUDGET: list[Criterion] = [
    Criterion(
        "budget_cost_s",
        "error-budget cost of the fault (seconds of full outage)",
        "<=",
        None,
        "s",
        "fault",
    ),
    Criterion(
        "budget_share",
        "share of the monthly error budget the fault burns",
        "<=",
        0.02,
        "ratio",
        "fault",
    ),
    # shown beside the share (measure/budget.py burn_rates): failed fraction / (1 - SLO)
    Criterion("burn_rate_5m", "peak burn rate over 5 minutes", "<=", None, "x", "fault"),
    Criterion("burn_rate_1h", "peak burn rate over 1 hour", "<=", None, "x", "fault"),
    Criterion(
        "fast_burn_page",
        "the SRE workbook's fast-burn page (14.4x over 1 h and 5 min) would have fired",
        "<=",
        None,
        "count",
        "fault",
    ),
]

#: Recovers fast (``docs/definitions.md``, "Recovery"; :mod:`chaoslib_infer.verdict.mitigation`):
#: mitigated while the fault was on (the burn rate from the drill's mitigation time to the
#: fault's end, 1x: the SLO itself), back within the SLO after the fault (the after window's
#: SLO tests) and the recovery time. Its default, 120 s, is the acceptance table's "recovery
#: time: minutes at most" read at its shortest plural: a service not back inside its baseline
#: bands two minutes after the injection has not recovered "fast"; traffic-spike keeps its own
#: 60 s from the spike's end.
RECOVERY: list[Criterion] = [
    Criterion(
        "burn_rate_mitigated",
        "burn rate while the fault was on, from the mitigation time to the fault's end",
        "<=",
        1.0,
        "x",
        "fault",
    ),
    Criterion(
        "slo_after", "within the SLOs after the fault (after window)", ">=", 0.999, "ratio",
        "after",
    ),
    Criterion(
        "recovery_s",
        "recovery (injection until back inside the baseline bands, sustained)",
        "<=",
        120.0,
        "s",
        "after",
    ),
]  # fmt: skip

#: The criteria of an engine fault (``experiments/tools/engine-fault.yaml``, any drill name whose
#: ground truth is the engine's, :func:`chaoslib_infer.verdict.mitigation.is_engine_fault`): its
#: own question is whether the service mitigates a replica that hangs, crash-loops or answers
#: wrong (garbled, empty, truncated, in-stream error, 400, reset): the mitigation row is its key,
#: the failure classes named in its reason.
ENGINE_FAULT: list[Criterion] = [
    Criterion(
        "burn_rate_mitigated",
        "engine fault mitigated: burn rate from the mitigation time to the clear",
        "<=",
        1.0,
        "x",
        "fault",
        key=True,
        fix="eject a replica whose answers fail (passive health checks on the data path, e.g. "
        "HAProxy observe layer7, or an outlier detector), not only on its health endpoint",
    ),
]

#: Every drill: the acceptance SLOs over the fault window and the whole drill, the state after
#: the drill against the baseline, the client's own schedule (a client that fell behind
#: makes the drill inconclusive, see ``judge``) and what retries cost.
COMMON: list[Criterion] = [
    *_SLO,
    *BUDGET,
    *RECOVERY,
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
    # what retries cost (network-jitter's budgets), n/a in a drill where nobody retried
    *retry_cost(),
    # how provider error answers were treated, n/a in a drill where the engine answered none
    *provider_errors(),
]

#: Criteria judged only on a lab whose gateway is not HAProxy (the figures of
#: :mod:`chaoslib_infer.lab.gateways.figures`; a HAProxy lab's rows stay as they were).
GATEWAY_ONLY = frozenset(
    {
        "stream_buffering_s",
        "streams_cut_200",
        "gateway_timeout_s",
        "routed_to_down",
        "routed_to_down_late",
    }
)

#: Each drill's own criteria, from its room (``chaoslib_infer/drills/<drill>/criteria.py``, through
#: :data:`chaoslib_infer.drills.registry.DRILLS`; ``docs/definitions.md``, "Drill criteria").
DRILL_CRITERIA: dict[str, list[Criterion]] = {name: list(d.criteria) for name, d in DRILLS.items()}


#: Drills without interruption criteria of their own that judge every episode out of SLO like
#: the drills that kill replicas (``interruption_s``: the time out of SLO from the injection to
#: the end of the load, <= 10 s; ``interruption_sustained``): a jitter that turns into a
#: collapse is an outage, not a matter of its error-budget cost alone (issue 29 item 3).
EPISODES_JUDGED = frozenset({"network-jitter"})


def _common_for(drill: str) -> list[Criterion]:
    """The common criteria ``drill`` judges (its room's ``DROPPED_COMMON`` left out; the
    interruption criteria added for :data:`EPISODES_JUDGED`)."""
    row = DRILLS.get(drill)
    dropped = row.dropped_common if row is not None else frozenset()
    extra = interruption() if drill in EPISODES_JUDGED else []
    return [c for c in [*COMMON, *extra] if c.name not in dropped]


def criteria_for(
    drill: str, overrides: Mapping[str, Any] | None = None, engine_fault: bool = False
) -> list[Criterion]:
    """The criteria of ``drill`` (its own first, then the common ones) with ``overrides``.

    Args:
        drill: drill name (``node-loss`` ...); an unknown drill gets the common criteria.
        overrides: ``{name: threshold | None | "off"}``.
        engine_fault: the drill runs an engine fault: :data:`ENGINE_FAULT` come first.

    Returns:
        Criteria with their thresholds.

    Raises:
        ValueError: an override names no criterion of this drill, or its value is not a number.
    """
    own = [*(ENGINE_FAULT if engine_fault else []), *DRILL_CRITERIA.get(drill, [])]
    crits = [*own, *[c for c in _common_for(drill) if c.name not in {o.name for o in own}]]
    by_name = {c.name: c for c in crits}
    for name, value in (overrides or {}).items():
        if name not in by_name:
            known = ", ".join(sorted(by_name))
            raise ValueError(f"{drill}: unknown criterion {name!r}; known: {known}")
        by_name[name] = replace(by_name[name], threshold=threshold_value(name, value))
    return [by_name[c.name] for c in crits]
