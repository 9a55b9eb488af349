"""Rows about what did and did not happen in a drill (``docs/definitions.md``, "Verdicts": no row
for what did not happen).

A criterion about an event that did not occur reads ``n/a`` with a note saying why, never
``pass``: a node loss whose replicas had nowhere to go (none was rescheduled) has no "moved
replicas serving again" time, and its service back to size after the rollback restored the node
says nothing about the orchestrator. quota-cut's key row is judged on what held: the replicas that
actually answered successfully within the SLO during the cut against the quota, not the plan's
own numbers nor the requests the gateway forwarded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .confirm import serving_counts
from .criteria import COMMON
from .facts import DrillFacts, num

__all__ = ["SLO_E2E_S", "instances_held", "no_replica_moved", "not_happened"]

Row = tuple[float | None, str | None]

#: The latency within which an answer counts as served within the SLO (s): the acceptance
#: table's P99 bound, the ``p99_e2e_s`` criterion's default ("over 10 s fails").
SLO_E2E_S: float = next(c.threshold or 10.0 for c in COMMON if c.name == "p99_e2e_s")


def no_replica_moved(figures: Mapping[str, Any], ground: Mapping[str, Any]) -> str | None:
    """The ``n/a`` note of a node loss that moved no replica, or None when one moved (or the
    figures do not say: a cluster, whose actions report the pods' own recovery).

    Args:
        figures: the node-loss figures (``lost_replicas``, ``moved_replicas``: counts).
        ground: its ground truth (``node``, ``node_up_by``, ``replica_serving_again_at``).

    Returns:
        ``"no replica moved: the N lost replica(s) were not rescheduled onto another node; they
        served again on node X once it came back (BY)"`` (or ``"...; they did not serve again
        in the data"``), or None.
    """
    lost, moved = num(figures.get("lost_replicas")), num(figures.get("moved_replicas"))
    if not lost or moved is None or moved > 0:
        return None
    node = ground.get("node") or "?"
    if ground.get("replica_serving_again_at") is not None:
        by = ground.get("node_up_by")
        where = f"they served again on node {node} once it came back" + (f" ({by})" if by else "")
    else:
        where = "they did not serve again in the data"
    return (
        f"no replica moved: the {lost:.0f} lost replica(s) were not rescheduled onto another "
        f"node; {where}"
    )


def not_happened(facts: DrillFacts) -> dict[str, Row]:
    """``{criterion: (None, note)}`` for the rows of ``facts`` whose event did not occur (their
    ``n/a``; :func:`chaoslib_infer.verdict.state.judged_row`); empty when all apply.

    node-loss without a moved replica (:func:`no_replica_moved`): ``replacement_serving_s`` and
    ``serving_after_vs_baseline``; the latter stays judged when the service ended smaller than
    it began (a defect whatever moved).
    """
    if facts.drill != "node-loss":
        return {}
    why = no_replica_moved(facts.figures, facts.ground)
    if why is None:
        return {}
    out: dict[str, Row] = {"replacement_serving_s": (None, why)}
    before, after = facts.serving
    if not (before and after is not None and after < before):
        out["serving_after_vs_baseline"] = (None, why)
    return out


def _served_within_slo(r: Mapping[str, Any], bound_s: float) -> bool:
    """A successful answer within the SLO's latency bound (end minus send, s)."""
    sent, end = num(r.get("sent_at")), num(r.get("end_at"))
    return bool(r.get("ok")) and sent is not None and end is not None and end - sent <= bound_s


def instances_held(
    facts: DrillFacts, fault_records: Sequence[Mapping[str, Any]], since: float | None = None
) -> Row:
    """quota-cut's key figure: the replicas that answered successfully within the SLO during the
    cut over the quota, with the load each carried (issue 21 items 3 and 4, issue 29 item 5).

    Served: the distinct engines of the cut's attempts answered successfully within
    :data:`SLO_E2E_S` (``replica``: the response's ``X-Replica-Id``, else the lab's
    ``facts.replica_of`` for the request id; on a cluster, the pods that answered), no more than
    the lab's ground truth says were sent requests (``instances_serving_during_cut``: the
    servers HAProxy's request log shows forwarded requests while the cap held). A replica that
    was forwarded requests and failed them did not serve: with attempts in the cut and none
    answered within the SLO, none served. Without a record naming its replica, the HAProxy
    log's count; on a cluster whose records name no pod the fewest ready endpoints seen during
    the cut (``k8s_ready_endpoints_min``). The quota: the ``instances_held`` figure (Q, as the
    fault recorded it), else ground ``quota``, else the replicas the cluster's cut allows
    (``k8s_quota_replicas_after``).

    Args:
        facts: the drill's facts.
        fault_records: the fault window's attempts.
        since: the cut's time (unix s): attempts sent before it, in flight across it, were
            sent to a replica before the cut and are not counted (None: all counted).

    Returns:
        ``(served / quota, "S of the quota's Q replicas served within the SLO during the cut
        (SOURCE; plan: P); load carried: r0 41, r1 39")``; ``(None, None)`` (unmeasured)
        without a quota or without any source of what served.
    """
    fig, ground = facts.figures, facts.ground
    quota = num(fig.get("instances_held"))
    if quota is None:
        quota = num(ground.get("quota"))
    if quota is None:
        quota = num(fig.get("k8s_quota_replicas_after"))
    start = since if since is not None else float("-inf")
    cut = [r for r in fault_records if (num(r.get("sent_at")) or float("-inf")) >= start]
    good = [r for r in cut if _served_within_slo(r, SLO_E2E_S)]
    counts = serving_counts(good, start, float("inf"), facts.replica_of)
    logged = num(ground.get("instances_serving_during_cut"))
    served: float | None = None
    source = ""
    if cut and not good:
        failed = sum(1 for r in cut if not r.get("ok"))
        served, source = (
            0.0,
            (
                f"no request answered successfully within {SLO_E2E_S:g} s during the cut: "
                f"{failed} of {len(cut)} attempts failed"
            ),
        )
    elif counts and logged is not None:
        served = min(float(len(counts)), logged)
        source = "records, HAProxy request log"
    elif counts:
        served, source = float(len(counts)), "records"
    elif logged is not None:
        served, source = logged, "HAProxy request log: no successful record names its replica"
    elif num(fig.get("k8s_ready_endpoints_min")) is not None:
        served = num(fig.get("k8s_ready_endpoints_min"))
        source = "fewest ready endpoints: no record names its pod"
    if not quota or served is None:
        return None, None
    planned = num(fig.get("planned_instances"))
    plan = f"; plan: {planned:.0f}" if planned is not None else ""
    load = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    carried = f"; load carried: {load}" if load else ""
    return served / quota, (
        f"{served:.0f} of the quota's {quota:.0f} replicas served within the SLO during the "
        f"cut ({source}{plan}){carried}"
    )
