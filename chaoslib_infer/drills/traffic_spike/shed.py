"""What the traffic-spike drill counts as shed load, and how shed load leaves the rates.

Definitions (``docs/definitions.md``, "Drill criteria", traffic-spike):

- a **shed answer** is an attempt answered 429 or 503 (:data:`SHED_STATUSES`: the engines'
  queue-full answer, HAProxy's queue timeout or refusal), whatever it took;
- a **shed** request is a logical request (``request_id``) whose final attempt is a shed answer
  that came *fast*: within ``within_s`` of that attempt's send (the threshold of the criterion
  ``shed_p99_s``, default 1 s; None: any 429/503). Shedding overload early is the sane answer to
  a spike; a 429/503 that kept the user waiting longer is a failure like any other;
- while the spike is on (from its start until the after window opens), shed requests are left
  out of availability, error rate and timeout rate (numerator and denominator: the rates of the
  requests the service took on) and judged by their own budget, the **shed share** (shed
  logical requests / logical requests sent) and by how fast they were answered (the P99 of the
  shed answers' times). Outside the spike a 429/503 is a failure like any other.

Pure functions over attempt records (``docs/contracts.md`` section 3); cut-off attempts (outcome
unknown) are left out as everywhere (:func:`chaoslib_infer.measure.metrics.select`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chaoslib_infer.measure.metrics import percentiles_s, select

__all__ = [
    "SHED_STATUSES",
    "is_fast_shed",
    "is_shed",
    "non_shed_failures",
    "shed_answer_p99_s",
    "shed_counts",
    "shed_ids",
    "shed_share",
    "without_shed",
]

Record = Mapping[str, Any]

#: HTTP statuses counted as shed load.
SHED_STATUSES = (429, 503)


def is_shed(record: Record) -> bool:
    """A failed attempt answered 429 or 503 (:data:`SHED_STATUSES`): load refused on purpose. A
    500, 502 or 504, a reset or a timeout is not a shed answer."""
    return not record.get("ok") and record.get("status") in SHED_STATUSES


def _took_s(record: Record) -> float | None:
    s, e = record.get("sent_at"), record.get("end_at")
    if isinstance(s, int | float) and isinstance(e, int | float):
        return float(e) - float(s)
    return None


def is_fast_shed(record: Record, within_s: float | None) -> bool:
    """A shed answer (:func:`is_shed`) that came within ``within_s`` seconds of the attempt's
    own send (None: any shed answer)."""
    if not is_shed(record):
        return False
    if within_s is None:
        return True
    took = _took_s(record)
    return took is not None and took <= within_s


def _key(record: Record) -> str:
    """The logical request of ``record``: its ``request_id``; a record without one is a request
    of its own (keyed by the object, the same in every pass over one list)."""
    rid = record.get("request_id")
    return str(rid) if rid is not None else f"<no request_id {id(record)}>"


def _attempt(record: Record) -> int:
    a = record.get("attempt")
    return a if isinstance(a, int) and not isinstance(a, bool) else 1


def _finals(records: Iterable[Record]) -> dict[str, tuple[Record, Record]]:
    """``{request key: (first attempt, final attempt)}``, the final attempt chosen as
    :func:`chaoslib_infer.measure.metrics.logical_outcomes` does (the last ``final: true``,
    else the highest ``attempt``), cut-off attempts left out."""
    groups: dict[str, list[Record]] = {}
    for r in select(records):
        groups.setdefault(_key(r), []).append(r)
    out: dict[str, tuple[Record, Record]] = {}
    for key, attempts in groups.items():
        attempts.sort(key=_attempt)
        finals = [r for r in attempts if r.get("final") is True]
        out[key] = (attempts[0], finals[-1] if finals else attempts[-1])
    return out


def shed_ids(
    records: Iterable[Record],
    within_s: float | None,
    start: float | None = None,
    end: float | None = None,
) -> set[str]:
    """The logical requests of ``records`` that were shed (final attempt a fast shed answer,
    :func:`is_fast_shed`) and whose first attempt was sent in ``[start, end)`` (unix seconds;
    None: unbounded)."""
    out = set()
    for key, (first, final) in _finals(records).items():
        sent = first.get("sent_at")
        if not isinstance(sent, int | float):
            continue
        if (start is None or sent >= start) and (end is None or sent < end):
            if is_fast_shed(final, within_s):
                out.add(key)
    return out


def without_shed(
    records: Iterable[Record],
    within_s: float | None,
    start: float | None = None,
    end: float | None = None,
) -> list[dict[str, Any]]:
    """``records`` without any attempt of the logical requests shed in ``[start, end)``
    (:func:`shed_ids`): what availability, error rate and timeout rate are computed over while
    the spike is on. Cut-off attempts are kept (the rates leave them out themselves)."""
    recs = list(records)
    gone = shed_ids(recs, within_s, start, end)
    kept: list[dict[str, Any]] = []
    for r in recs:
        if r.get("cut_off") or _key(r) not in gone:
            kept.append(dict(r))
    return kept


def shed_counts(
    records: Iterable[Record],
    within_s: float | None,
    start: float | None = None,
    end: float | None = None,
) -> tuple[int, int]:
    """``(shed, sent)``: the logical requests of ``records`` whose first attempt was sent in
    ``[start, end)`` (None: unbounded) that were shed (:func:`shed_ids`), and all of them."""
    recs = list(records)
    sent = 0
    for first, _ in _finals(recs).values():
        t = first.get("sent_at")
        if (
            isinstance(t, int | float)
            and (start is None or t >= start)
            and (end is None or t < end)
        ):
            sent += 1
    return len(shed_ids(recs, within_s, start, end)), sent


def shed_share(records: Iterable[Record], within_s: float | None) -> float | None:
    """Shed logical requests / logical requests in ``records`` (0..1; None without a request):
    the criterion ``shed_share_fault`` over the fault window's records."""
    shed, sent = shed_counts(records, within_s)
    return shed / sent if sent else None


def non_shed_failures(records: Iterable[Record], within_s: float | None = None) -> int:
    """Logical requests of ``records`` (cut-off attempts left out) that failed other than by a
    fast shed: a reset, another 5xx, a timeout, one still in flight past the judging deadline,
    a 429/503 slower than ``within_s`` (None: every 429/503 is a shed). The criterion
    ``non_shed_failures_fault``."""
    recs = list(records)
    shed = shed_ids(recs, within_s)
    return sum(
        1 for key, (_, final) in _finals(recs).items() if not final.get("ok") and key not in shed
    )


def shed_answer_p99_s(records: Iterable[Record]) -> float | None:
    """P99 (seconds) of the time each shed answer (:func:`is_shed`, any speed) took, send to
    end, over the attempts of ``records`` (cut-off ones left out); None without a shed answer:
    the criterion ``shed_p99_s``."""
    took = [t for r in select(records) if is_shed(r) and (t := _took_s(r)) is not None]
    return percentiles_s(took, (99,))[99] if took else None
