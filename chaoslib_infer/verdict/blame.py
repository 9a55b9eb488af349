"""Who caused a failed row, from the requests' own evidence (``docs/definitions.md``, "Blame").

The project's rule: blame each failure on whoever caused it, never on the wrong one, and name
the mechanism the requests' own records, the engine's ledger and the gateway's log show (send
time against the fault, first byte come or not, who re-sent, whether the engine went on), with a
fix that applies to that mechanism. A failed row's reason ends with ``"; BLAME: WHO (why)"``
(:data:`BLAME`, :func:`chaoslib_infer.verdict.state.reason`) where someone other than the
service caused it, or where the evidence names a part of the service (``engine``):

* ``client``: our own load's retry policy or timeouts made it (it gave up on a generation the
  engine went on with, or hedged while its attempt was still open: ``duplicate_causes``);
* ``gateway``: the gateway between client and replicas (it re-sent a client attempt while the
  first generation went on, cut a stream after its 200, kept sending to a frozen or down
  replica, buffered the stream, its health checks kept a failing replica UP);
* ``fault``: the fault itself, acting as it should (it cut streams in flight on the replica it
  took or froze: lost unless retried, a re-run when retried, ``rerun_generations``; streams
  already streaming when a replica froze, which no first-byte timeout can end);
* ``engine``: the engine went on generating for a client that had left (a frozen replica after
  its thaw), the service's own waste;
* the service (the replicas, their restarts, their capacity) held, slowed or failed the
  request: every other failed row. Its reasons carry no suffix (:func:`blame_of` returns None):
  a reason without ``BLAME`` is the service's. A row whose evidence shows no mechanism (no
  ``duplicate_causes``, no hung request to classify) carries none either: no static text.

Every failed row that counts failed requests also names their failure classes
(:func:`name_failures`: empty replies, garbled, truncated, errors in the stream, 4xx answers,
timeouts...), so no failure class is counted without being named.

A row of what did not happen reads ``n/a``, never pass (rows of :mod:`.applicable`); its blame is
never shown (only failed rows give reasons).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.faultcut import THAW_GRACE_S
from chaoslib_infer.measure.health import attempt_replica, header_replicas
from chaoslib_infer.measure.metrics import TIMEOUT_CLASSES, logical_outcomes

from .facts import DrillFacts, num

__all__ = [
    "BLAME",
    "FAILURE_ROWS",
    "SLOWING",
    "add_blame",
    "blame_of",
    "hung_blame",
    "name_failures",
    "strip_blame",
]

#: How a reason line names who caused it.
BLAME = "; BLAME: "

#: The retry-cost criteria (``drills/criterion.py`` ``retry_cost``): a second generation the
#: client or gateway caused (the fault's re-runs are counted apart, ``measure/rerun.py``).
RETRY_COST = frozenset({"duplicate_generations", "extra_generations", "wasted_tokens"})
#: Rows of requests lost: the fault's when it cut streams in flight, else the service's.
LOSS = frozenset({"availability", "availability_fault", "error_rate"})
#: Rows that count failed requests, and which failures each counts (None: every class):
#: :func:`name_failures` names their classes in the reason.
FAILURE_ROWS: dict[str, frozenset[str] | None] = {
    "availability": None,
    "availability_fault": None,
    "availability_after": None,
    "error_rate": None,
    "timeout_rate": TIMEOUT_CLASSES,
    "timeout_rate_fault": TIMEOUT_CLASSES,
    "timeouts_fault": TIMEOUT_CLASSES,
    "budget_share": None,
    "budget_cost_s": None,
}
#: Rows that count failures over another span than their window: the error-budget rows count
#: every failure from the injection to the end of the load (``verdict/budget.py``).
SINCE_FAULT = "since_fault"
FAILURE_WINDOW = {"budget_share": SINCE_FAULT, "budget_cost_s": SINCE_FAULT}
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


def _duplicate_blame(figures: Mapping[str, Any]) -> str | None:
    """Who caused the duplicates, from ``duplicate_causes`` (:func:`chaoslib_infer.measure.
    rerun.duplicate_causes`: each duplicated request's mechanism in its records and the
    ledger); None when no request shows one."""
    causes = figures.get("duplicate_causes")
    if not isinstance(causes, Mapping):
        return None
    n = {k: int(v) for k, v in causes.items() if isinstance(v, int) and v > 0}
    parts: list[str] = []
    client: list[str] = []
    if "client_gave_up" in n:
        client.append(
            f"{n['client_gave_up']} requests: its attempt timeout gave up while the engine went "
            "on generating them (ledger), so it paid twice: an attempt timeout above the slowest "
            "generation, or idempotency keys the server deduplicates"
        )
    if "client_hedged" in n:
        client.append(
            f"{n['client_hedged']} requests: it sent them again while its earlier attempt was "
            "still open: hedge only before the first token, and cancel the attempt it drops"
        )
    if client:
        parts.append(f"client ({'; '.join(client)})")
    if "gateway_resent" in n:
        parts.append(
            f"gateway ({n['gateway_resent']} requests: it re-sent a client attempt while the "
            "first generation went on (more generations than the client sent): retry only "
            "before the first byte, e.g. HAProxy retry-on conn-failure, not response-timeout)"
        )
    if "stream_failed" in n:
        parts.append(
            f"gateway or network ({n['stream_failed']} requests: their stream failed at the "
            "client and it re-sent them, with no fault of the drill recorded on them (ledger): "
            "something between engine and client cut the stream, see streams_cut_200)"
        )
    if "frozen_resumed" in n:
        parts.append(
            f"engine ({n['frozen_resumed']} requests: the frozen replica went on generating "
            "them after its thaw for clients that had already re-run them elsewhere (ledger: "
            f"done, or cancelled over {THAW_GRACE_S:g} s after the thaw): an engine that aborts a "
            "request whose connection closed stops within a decode step; the retry was right)"
        )
    return " and ".join(parts) or None


def _t(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def hung_blame(
    records: Sequence[Mapping[str, Any]],
    ground: Mapping[str, Any],
    replica_of: Mapping[str, str] | None = None,
) -> str | None:
    """Who made upstream-timeout's hung requests hang, from each one's own record: its send
    time against the freeze (``ground["fault_at"]``), its first byte (come before the freeze
    or not) and its replica (``ground["replica"]``; the record's ``replica``, else
    ``replica_of``: :func:`chaoslib_infer.measure.health.attempt_replica`; unknown counts as the
    frozen one's).

    A hung request is an attempt that ended at or after the freeze in a client timeout class
    (``hung_requests``), or one still in flight when judged:

    * sent after the freeze, or waiting for its first byte at it, on the frozen replica (or on
      no identified one): the **gateway**'s (it kept sending to the frozen replica: no
      first-byte timeout, no ejection in time);
    * already streaming when the replica froze (its first byte before the freeze): the
      **fault**'s (no first-byte timeout or ejection moves a started stream; only an idle
      timeout ends it);
    * on another replica: the service's (no suffix for them).

    Returns:
        ``"gateway (...)"``, ``"fault (...)"``, both joined by ``" and "``, or None when no hung
        request is on the frozen replica or the freeze's time is unknown.
    """
    at, frozen = _t(ground.get("fault_at")), ground.get("replica")
    if at is None:
        return None
    who = replica_of or {}
    after: list[float] = []
    waiting = 0
    streaming: list[float] = []
    retried: set[str] = set()
    by_rid: dict[str, int] = {}
    named = header_replicas(records)
    for r in records:
        rid = str(r.get("request_id"))
        by_rid[rid] = max(by_rid.get(rid, 0), int(r.get("attempt") or 1))
    for r in records:
        end, sent = _t(r.get("end_at")), _t(r.get("sent_at"))
        hung = r.get("in_flight_at_judging") or (
            not r.get("ok") and r.get("error_class") in TIMEOUT_CLASSES
        )
        if not hung or sent is None or (end is not None and end < at):
            continue
        rep = attempt_replica(r, who, named)
        if rep and isinstance(frozen, str) and rep != frozen:
            continue  # hung on another replica: the service's
        if by_rid.get(str(r.get("request_id")), 0) > int(r.get("attempt") or 1):
            retried.add(str(r.get("request_id")))
        first = _t(r.get("first_byte_at"))
        first = first if first is not None else _t(r.get("first_token_at"))
        if sent >= at:
            after.append(sent - at)
        elif first is not None and first <= at:
            streaming.append((end if end is not None else at) - at)
        else:
            waiting += 1
    parts: list[str] = []
    if after or waiting:
        sent_after = (
            f"{len(after)} sent after the freeze (the last {max(after):.3g} s after it)"
            if after
            else ""
        )
        wait = f"{waiting} waiting for their first byte when it froze" if waiting else ""
        what = " and ".join(x for x in (sent_after, wait) if x)
        parts.append(
            f"gateway ({what} hung on the frozen replica until the client gave up: no "
            "first-byte timeout (HAProxy timeout server with retry-on response-timeout) and no "
            "ejection in time)"
        )
    if streaming:
        rerun = f"; {len(retried)} re-run by the client" if retried else ""
        parts.append(
            f"fault ({len(streaming)} streams were already streaming when the replica froze "
            "(first byte before the freeze): no first-byte timeout or ejection moves a started "
            f"stream; an idle timeout ended them {max(streaming):.3g} s after the freeze at "
            f"most{rerun})"
        )
    return " and ".join(parts) or None


def _gateway_blame(criterion: str, figures: Mapping[str, Any]) -> str | None:
    """The gateway rows' mechanism, from their own figure."""
    v = num(figures.get(criterion))
    if v is None:
        return None
    if criterion == "streams_cut_200":
        return (
            f"gateway (it cut {v:.0f} streams after their 200 that no fault cut: a gateway "
            "timeout shorter than the generation, or a buffer limit)"
        )
    if criterion in ("routed_to_down", "routed_to_down_late"):
        late = " over 2 s after it went down" if criterion == "routed_to_down_late" else ""
        return (
            f"gateway (it sent {v:.0f} upstream tries to a replica that was down or frozen"
            f"{late}: no working health check (active checks, or passive max_fails) to take it "
            "out of rotation)"
        )
    if criterion == "gateway_timeout_s":
        return (
            f"gateway (it held requests {v:.3g} s before a 5xx or the client gave up: its timeout)"
        )
    if criterion == "stream_buffering_s":
        return (
            f"gateway (the first token reached the client {v:.3g} s later than straight from "
            "the replica: it buffered the stream; turn response buffering off)"
        )
    if criterion == "retry_amplification":
        return (
            f"gateway (it made {v:.3g}x the generations the client sent: it re-sent attempts "
            "that were already generating)"
        )
    return None


def blame_of(
    criterion: str,
    drill: str,
    figures: Mapping[str, Any],
    lost: int | None = None,
    failed: Mapping[str, int] | None = None,
    records: Sequence[Mapping[str, Any]] = (),
    ground: Mapping[str, Any] | None = None,
    replica_of: Mapping[str, str] | None = None,
) -> str | None:
    """Who caused a failure of ``criterion`` in ``drill``, from the evidence (module docstring).

    Args:
        criterion: the failed row's criterion.
        drill: the drill's name.
        figures: the drill's figures (``duplicate_causes``, ``fault_cut_lost``, the gateway's).
        lost: the drill's failed logical requests, when known.
        failed: the failed attempts the row counts, by error class, when it counts some.
        records: the drill's attempt records (upstream-timeout's hung requests).
        ground: the drill's ground truth (the freeze's time and replica).
        replica_of: request id -> replica from the lab's logs.

    Returns:
        ``"WHO (why)"``; None when it is the service's (the default: no suffix) or when no
        request shows a mechanism.
    """
    if criterion == "health_disagreement_s" and failed:
        return _health_blame(failed)
    if criterion in RETRY_COST:
        return _duplicate_blame(figures)
    if criterion in ("hung_requests", "max_wait_s") and drill == "upstream-timeout":
        return hung_blame(records, ground or {}, replica_of)
    gateway = _gateway_blame(criterion, figures)
    if gateway is not None:
        return gateway
    if criterion in LOSS and _pos(figures, "fault_cut_lost"):
        cut = int(num(figures.get("fault_cut_lost")) or 0)
        what = f"{cut} requests lost were streams in flight on the replica it took"
        if lost is not None and lost > cut:
            return f"fault and service ({what}; {lost - cut} others were the service's)"
        return f"fault ({what}: a client or gateway retry of a cut stream recovers them)"
    return None


def name_failures(
    rows: Sequence[dict[str, Any]], windows: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """``rows`` with the failure classes each failed row of :data:`FAILURE_ROWS` counts named:
    ``failed_classes`` (``{class: failed logical requests}`` of the row's window, ``windows``:
    ``{window name: attempt records}``; an ``http_4xx`` / ``http_5xx`` class with its statuses)
    and, appended to its ``statement`` (the reason prints it), ``"failed: 3 empty, 1 http_4xx
    (400)"``. Other rows, and rows whose window is not in ``windows``, are left as they are."""
    out = []
    for r in rows:
        row = dict(r)
        name = str(row.get("criterion"))
        recs = windows.get(FAILURE_WINDOW.get(name, str(row.get("window") or "drill")))
        if row.get("result") == "fail" and name in FAILURE_ROWS and recs is not None:
            only = FAILURE_ROWS[name]
            classes: dict[str, int] = {}
            statuses: dict[str, set[int]] = {}
            for o in logical_outcomes(list(recs)):
                cls = o.get("error_class")
                if o.get("ok") or o.get("cut_off") or not cls or (only and cls not in only):
                    continue
                classes[str(cls)] = classes.get(str(cls), 0) + 1
                if isinstance(o.get("status"), int) and str(cls).startswith("http_"):
                    statuses.setdefault(str(cls), set()).add(int(o["status"]))
            if classes:
                row["failed_classes"] = dict(sorted(classes.items()))
                named = ", ".join(
                    f"{n} {c}"
                    + (f" ({', '.join(map(str, sorted(statuses[c])))})" if c in statuses else "")
                    for c, n in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))
                )
                st = row.get("statement")
                row["statement"] = f"{st}; failed: {named}" if st else f"failed: {named}"
        out.append(row)
    return out


def strip_blame(reason: str) -> str:
    """``reason`` without its ``"; BLAME: ..."`` suffix (:data:`BLAME`): the figure, its value,
    its threshold and its criterion."""
    return reason.split(BLAME, 1)[0]


def add_blame(
    rows: Sequence[dict[str, Any]],
    facts: DrillFacts,
    failed: Mapping[str, Mapping[str, int]] | None = None,
    windows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """``rows`` with ``blame`` (:func:`blame_of`) on each failed row and, given ``windows``
    (``{window name: attempt records}``), the failure classes the failed rows count
    (:func:`name_failures`; the error-budget rows over the requests sent from the injection
    on, ``ground["fault_at"]``); ``failed``: ``{criterion: {error class: failed attempts}}`` of the
    rows that count failures."""
    lost = sum(
        1 for r in logical_outcomes(list(facts.records)) if not r.get("ok") and not r.get("cut_off")
    )
    out = []
    for r in rows:
        row = dict(r)
        if row.get("result") == "fail":
            name = str(row["criterion"])
            who = blame_of(
                name,
                facts.drill,
                facts.figures,
                lost,
                (failed or {}).get(name),
                facts.records,
                facts.ground,
                facts.replica_of,
            )
            if who:
                row["blame"] = who
        out.append(row)
    if windows is None:
        return out
    at = num(facts.ground.get("fault_at"))
    if at is not None:
        since = [r for r in facts.records if (num(r.get("sent_at")) or at) >= at]
        windows = {**windows, SINCE_FAULT: since}
    return name_failures(out, windows)
