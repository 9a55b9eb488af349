"""Health disagreement: the health endpoint says "healthy" while completions on that replica fail.

Definition (``docs/definitions.md``, "Drill figures"): intervals where the health endpoint
reports healthy while completions fail. Made concrete here, per replica:

* The span from the replica's first to its last health sample is cut into windows of ``window_s``
  seconds (the last one may be shorter).
* A window is **reported healthy** when every health sample taken in it says healthy (with no sample
  in it, the last earlier sample stands).
* The window's **attempts** are the load records attributed to the replica whose active span
  ``[sent_at, end_at]`` overlaps the window: a request that hangs for 10 s counts in every window
  it hung through, not only where it was sent or where it timed out.
* A window **disagrees** when it is reported healthy, has at least one attempt, and at least
  ``min_failed_ratio`` of its attempts failed (default 1.0: none succeeded while requests were sent
  to it).

Consecutive disagreeing windows merge into one interval. A record is attributed to a replica by its
own ``replica`` field (the response's ``X-Replica-Id`` / ``X-Lab-Server``), else through
``replica_of`` (request id -> the first replica that received it; see
:func:`replica_of_requests`), which matters for requests that never got a response header (a
hung engine sends none). Unattributed records are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["attempt_replica", "header_replicas", "health_disagreement", "replica_of_requests"]

Record = Mapping[str, Any]


def replica_of_requests(
    ledger_entries: Iterable[Mapping[str, Any]] = (),
    routed: Iterable[tuple[str | None, str | None]] = (),
) -> dict[str, str]:
    """Map request ids to the **first** replica that received them, from server-side logs.

    A request can reach several replicas: the client's retries, or the gateway's redispatch
    (HAProxy's ``retry-on 503`` re-sends a hung request to a survivor when the hang clears,
    after its client left). A record without a replica header is the attempt that never got
    one, the one held on the first replica; attributing it to the last one would hand the hung
    replica's failures to a survivor (``health_disagreement_s`` 0 where the probe measured
    seconds). The generations made for a client that had left are counted apart
    (:func:`chaoslib_infer.measure.rerun.generations_after_client_left`).

    Args:
        ledger_entries: engine ledger lines (``{"event": "generation"|"fault", "replica",
            "request_id", "t"}``; other events are ignored): the earliest line (``t``, else file
            order) of a request names its replica.
        routed: ``(request_id, server)`` pairs from the load balancer's request log (HAProxy's
            ``<NOSRV>`` and empty names are ignored; it logs the server that answered last):
            used for requests the ledger does not name, the first pair of a request winning.

    Returns:
        ``{request_id: replica}``.
    """
    first: dict[str, tuple[float, int, str]] = {}
    for k, e in enumerate(ledger_entries):
        if e.get("event", "generation") not in ("generation", "fault"):
            continue
        rid, rep, t = e.get("request_id"), e.get("replica"), _num(e.get("t"))
        if isinstance(rid, str) and isinstance(rep, str) and rep:
            key = (t if t is not None else math.inf, k, rep)
            if rid not in first or key < first[rid]:
                first[rid] = key
    out = {rid: rep for rid, (_, _, rep) in first.items()}
    for rid, server in routed:
        if rid and server and not server.startswith("<"):
            out.setdefault(rid, server)
    return out


def header_replicas(records: Iterable[Record]) -> dict[str, set[str]]:
    """``{request_id: replicas named by its attempts' own headers}`` (the records' ``replica``)."""
    out: dict[str, set[str]] = {}
    for r in records:
        rep = r.get("replica")
        if rep and r.get("request_id") is not None:
            out.setdefault(str(r["request_id"]), set()).add(str(rep))
    return out


def attempt_replica(
    record: Record, replica_of: Mapping[str, str], named: Mapping[str, set[str]]
) -> str | None:
    """The replica of one attempt: its own ``replica`` header, else ``replica_of`` of its request
    (:func:`replica_of_requests`) unless another attempt of the request names that replica in
    its own header (``named``, :func:`header_replicas`): then the server-side line is that
    attempt's (a frozen engine writes no ledger line while frozen, so the first line of a
    request it held can be the client's retry on a survivor), and the attempt's replica is
    unknown (None)."""
    rep = record.get("replica")
    if rep:
        return str(rep)
    rid = str(record.get("request_id"))
    mapped = replica_of.get(rid)
    if mapped is None or mapped in named.get(rid, set()):
        return None
    return mapped


def _num(v: Any) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _class_counts(names: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def health_disagreement(
    health_samples: Iterable[Mapping[str, Any]],
    records: Iterable[Record],
    window_s: float = 1.0,
    replica_of: Mapping[str, str] | None = None,
    min_failed_ratio: float = 1.0,
) -> dict[str, Any]:
    """Seconds and intervals where health said healthy while that replica's completions failed.

    Args:
        health_samples: ``{"t": unix s, "replica": str, "healthy": bool}`` (any order).
        records: load attempt records (``docs/contracts.md`` section 3; unix seconds).
        window_s: window length in seconds (> 0).
        replica_of: request id -> replica for records without a ``replica``
            (:func:`attempt_replica`: not where another attempt's header names it).
        min_failed_ratio: share of a window's attempts that must have failed (0 < r <= 1).

    Returns:
        ``{"disagreement_s": float (seconds, all replicas), "intervals": [{"replica", "start",
        "end" (unix s), "duration_s", "attempts", "failed", "failed_classes"}],
        "failed_classes": {error class: failed attempts counted in the intervals (each once)},
        "by_replica": {replica: seconds},
        "windows": int (windows considered), "windows_judged": int (windows with attempts),
        "windows_healthy": int (windows reported healthy)}``.

    Raises:
        ValueError: ``window_s`` <= 0 or ``min_failed_ratio`` outside (0, 1].
    """
    if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    if not 0 < min_failed_ratio <= 1:
        raise ValueError(f"min_failed_ratio must be in (0, 1], got {min_failed_ratio!r}")
    by_rep: dict[str, list[tuple[float, bool]]] = {}
    for s in health_samples:
        t, rep = _num(s.get("t")), s.get("replica")
        if t is None or not isinstance(rep, str):
            continue
        by_rep.setdefault(rep, []).append((t, bool(s.get("healthy"))))
    spans: dict[str, list[tuple[int, float, float, bool]]] = {}
    classes: dict[int, str] = {}  # a failed attempt's error class, by its index
    mapping = replica_of or {}
    record_list = list(records)
    named = header_replicas(record_list)
    for idx, r in enumerate(record_list):
        rep = attempt_replica(r, mapping, named)
        sent = _num(r.get("sent_at"))
        if not rep or sent is None or str(rep) not in by_rep:
            continue
        end = _num(r.get("end_at"))
        end = sent if end is None else max(end, sent)
        spans.setdefault(str(rep), []).append((idx, sent, end, bool(r.get("ok"))))
        if not r.get("ok"):
            classes[idx] = str(r.get("error_class") or "error")

    intervals: list[dict[str, Any]] = []
    per_rep: dict[str, float] = {}
    n_windows = n_judged = n_healthy = 0
    for rep in sorted(by_rep):
        samples = sorted(by_rep[rep])
        t0, t_last = samples[0][0], samples[-1][0]
        rep_spans = spans.get(rep, [])
        total = 0.0
        current: dict[str, Any] | None = None
        i = 0
        a = t0
        while a < t_last:
            b = min(a + window_s, t_last)
            last_window = b >= t_last
            n_windows += 1
            inside = [h for t, h in samples if a <= t < b or (last_window and t == b)]
            if not inside:
                inside = [h for t, h in samples if t < a][-1:]
            healthy = bool(inside) and all(inside)
            hits = [(idx, ok) for idx, s, e, ok in rep_spans if s < b and e >= a]
            attempts = [ok for _, ok in hits]
            failed = sum(1 for ok in attempts if not ok)
            n_healthy += healthy
            n_judged += bool(attempts)
            bad = bool(attempts) and failed > 0 and failed >= min_failed_ratio * len(attempts)
            if healthy and bad:
                total += b - a
                if current is None:  # the previous window did not disagree
                    current = {"replica": rep, "start": a, "end": b, "_ids": {}}
                    intervals.append(current)
                current["end"] = b
                current["_ids"].update(hits)
            else:
                current = None
            i += 1
            a = t0 + i * window_s
        per_rep[rep] = total
    counted: set[int] = set()  # the failed attempts the intervals count (each once)
    for iv in intervals:
        ids = iv.pop("_ids")
        failed_ids = [i for i, ok in ids.items() if not ok]
        counted.update(failed_ids)
        iv["duration_s"] = iv["end"] - iv["start"]
        iv["attempts"] = len(ids)
        iv["failed"] = len(failed_ids)
        iv["failed_classes"] = _class_counts(classes[i] for i in failed_ids)
    return {
        "disagreement_s": sum(per_rep.values()),
        "failed_classes": _class_counts(classes[i] for i in counted),
        "intervals": intervals,
        "by_replica": per_rep,
        "windows": n_windows,
        "windows_judged": n_judged,
        "windows_healthy": n_healthy,
    }
