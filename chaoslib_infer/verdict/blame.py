"""Who caused a failed row: the service, the fault, the gateway or our own client
(``docs/definitions.md``, "Blame").

The project's rule: blame each failure on whoever caused it, never on the wrong one. A failed
row's reason ends with ``"; BLAME: WHO (why)"`` (:data:`BLAME`, :func:`chaoslib_infer.verdict.
state.reason`) where someone other than the service caused it:

* ``client``: our own load's retry policy or timeouts made it (a duplicate generation of a
  request still generating: it gave up too early; the failures a health row counts that are
  its own attempt timeouts on a replica the fault only slowed; its own lag);
* ``gateway``: the gateway between client and replicas (its retries re-sent a request still
  generating, it cut a stream after its 200, it kept sending to a held replica, its health
  checks kept a failing replica UP);
* ``fault``: the fault itself, acting as it should (it cut streams in flight on the replica it
  took: lost unless retried, a re-run when retried, ``rerun_generations``);
* the service (the replicas, their restarts, their capacity) held, slowed or failed the
  request: every other failed row. A drill judges the service, so its reasons carry no
  suffix then (:func:`blame_of` returns None): a reason without ``BLAME`` is the service's.
  The client's own lag (``send_lag_p99_s``, ``client_lag_p99_s``) makes the drill
  inconclusive with a reason that already names the client (``state.client_reason``).

A row of what did not happen reads ``n/a``, never pass (rows of :mod:`.applicable`); its blame is
never shown (only failed rows give reasons).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.metrics import logical_outcomes

from .facts import DrillFacts, num

__all__ = ["BLAME", "SLOWING", "add_blame", "blame_of", "strip_blame"]

#: How a reason line names who caused it.
BLAME = "; BLAME: "

#: The retry-cost criteria (``drills/criterion.py`` ``retry_cost``): a second generation the
#: client or gateway caused (the fault's re-runs are counted apart, ``measure/rerun.py``).
RETRY_COST = frozenset({"duplicate_generations", "extra_generations", "wasted_tokens"})
#: Rows whose failure is the gateway's.
GATEWAY = frozenset(
    {"streams_cut_200", "gateway_timeout_s", "routed_to_down", "stream_buffering_s"}
)
#: Rows of requests lost: the fault's when it cut streams in flight, else the service's.
LOSS = frozenset({"availability", "availability_fault", "error_rate"})
#: Drills whose fault slows a replica without holding its requests: a request there that timed
#: out would have been answered, so its timeout is the client's own (shorter than the slowed
#: answer), not a failure of the replica.
SLOWING = frozenset({"network-jitter"})


def _pos(figures: Mapping[str, Any], key: str) -> bool:
    v = num(figures.get(key))
    return v is not None and v > 0


def _health_blame(failed: Mapping[str, int]) -> str:
    """Who made the completions fail that ``health_disagreement_s`` counts (``failed``: the
    failed attempts by error class): the gateway, whose health checks kept the replica UP. In a
    drill that only slows the replica (:data:`SLOWING`) the client's own attempt timeouts are
    not counted (:func:`chaoslib_infer.verdict.judge`): they are no failure of the replica."""
    total = sum(failed.values())
    classes = ", ".join(f"{n} {c}" for c, n in sorted(failed.items()))
    return (
        f"gateway (its health checks kept the replica UP while {total} of its completions "
        f"failed: {classes})"
    )


def blame_of(
    criterion: str,
    drill: str,
    figures: Mapping[str, Any],
    lost: int | None = None,
    failed: Mapping[str, int] | None = None,
) -> str | None:
    """Who caused a failure of ``criterion`` in ``drill`` (figures: the drill's; ``lost``: the
    drill's failed logical requests, when known; ``failed``: the failed attempts the row
    counts, by error class, when it counts some), as ``"WHO (why)"``; None when it is the
    service's (the default: no suffix)."""
    if criterion == "health_disagreement_s" and failed:
        return _health_blame(failed)
    if criterion in RETRY_COST:
        client, gateway = _pos(figures, "retries"), _pos(figures, "gateway_retries")
        if client and gateway:
            return "client and gateway (both re-sent requests the engine was still generating)"
        if gateway:
            return "gateway (its retries re-sent requests the engine was still generating)"
        if drill == "upstream-timeout":
            return (
                "client (its timeout gave up on the frozen replica, which went on generating "
                "once thawed: frozen_completed; the price of ending the hang by a retry, the "
                "gateway's first-byte timeout pays it too: only a server that deduplicates "
                "request ids avoids it)"
            )
        return (
            "client (it gave up on and re-sent requests the engine was still generating: an "
            "attempt timeout above the slowest generation, or idempotency keys)"
        )
    if criterion == "retry_amplification":
        return "gateway (it re-sent an attempt that was already generating)"
    if criterion in GATEWAY:
        return "gateway"
    if criterion in ("hung_requests", "max_wait_s") and drill == "upstream-timeout":
        return "gateway (it kept sending to the frozen replica: no first-byte timeout)"
    if criterion in LOSS and _pos(figures, "fault_cut_lost"):
        cut = int(num(figures.get("fault_cut_lost")) or 0)
        what = f"{cut} requests lost were streams in flight on the replica it took"
        if lost is not None and lost > cut:
            return f"fault and service ({what}; {lost - cut} others were the service's)"
        return f"fault ({what}: a client or gateway retry of a cut stream recovers them)"
    return None


def strip_blame(reason: str) -> str:
    """``reason`` without its ``"; BLAME: ..."`` suffix (:data:`BLAME`): the figure, its value,
    its threshold and its criterion."""
    return reason.split(BLAME, 1)[0]


def add_blame(
    rows: Sequence[dict[str, Any]],
    facts: DrillFacts,
    failed: Mapping[str, Mapping[str, int]] | None = None,
) -> list[dict[str, Any]]:
    """``rows`` with ``blame`` (:func:`blame_of`) on each failed row; ``failed``:
    ``{criterion: {error class: failed attempts}}`` of the rows that count failures."""
    lost = sum(
        1 for r in logical_outcomes(list(facts.records)) if not r.get("ok") and not r.get("cut_off")
    )
    out = []
    for r in rows:
        row = dict(r)
        if row.get("result") == "fail":
            name = str(row["criterion"])
            who = blame_of(name, facts.drill, facts.figures, lost, (failed or {}).get(name))
            if who:
                row["blame"] = who
        out.append(row)
    return out
