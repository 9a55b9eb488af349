"""Window statistics over load records (``docs/contracts.md`` section 4).

Definitions come from ``docs/definitions.md``:

* **E2E** = ``end_at - intended_at``; **TTFT** = ``first_token_at - intended_at`` (first
  output-bearing chunk): timed from when the request was due by the open-loop schedule, so the
  client's own lateness is not taken off the latency (coordinated omission corrected); the same
  from the actual send (``sent_at``) is given beside them (``p50/p99_e2e_from_send_s``,
  ``p99_ttft_from_send_s``). A record without ``intended_at``, or one later than ``sent_at``, is
  timed from ``sent_at``. **ITL** = every raw gap between successive ``chunk_times``; **TPOT** =
  ``(last chunk - first chunk) / (output_tokens - 1)``. Seconds.
* Availability, error rate and timeout rate are over **attempted** requests (records whose
  ``sent_at`` is in the window, a ``not_sent`` one included: a request due while the in-flight
  cap was full); every non-ok record is a failure; ``timeout_*`` classes are timeouts.
* Percentiles are over **successful** requests only, with ``censored_fraction`` (failed /
  attempted) beside them, so a server that sheds load cannot look faster.

**Client lag** (records with ``time_source: "kernel"``, ``load/kerneltime.py``): for each socket
read that delivered output chunks, the client's loop handling time (``chunk_times_loop``) minus
the kernel's arrival stamp (``chunk_times``), over every attempt, ok or not: how late the client
itself saw what the service had already delivered. A large lag means the client's own
scheduling, not the service, made the run slow (its open-loop schedule is then suspect too).

Percentiles use HDR histograms (``hdrh``) at microsecond resolution with 3 significant digits
(relative error <= 0.1%); values between 1 us and 1 hour are tracked, outside values are clamped.
A statistic without data is ``None``, never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hdrh.histogram import HdrHistogram

__all__ = [
    "TIMEOUT_CLASSES",
    "client_lag_s",
    "cut_off_count",
    "e2e_ok_s",
    "logical_outcomes",
    "logical_stats",
    "percentiles_s",
    "per_replica_share",
    "per_second_series",
    "retry_stats",
    "select",
    "window_stats",
]

Record = Mapping[str, Any]

#: Error classes counted in ``timeout_rate``.
TIMEOUT_CLASSES = frozenset({"timeout_connect", "timeout_ttft", "timeout_idle", "timeout_total"})
_US = 1_000_000
_HDR_MAX_US = 3600 * _US


def select(
    records: Iterable[Record], start: float | None = None, end: float | None = None
) -> list[Record]:
    """Records whose ``sent_at`` is in ``[start, end)`` (unix seconds; None = unbounded).

    Attempts *cut off* when the load stopped (``cut_off`` true: outcome unknown) are left out of
    every rate and percentile; :func:`cut_off_count` counts them. A judged window (the verdict,
    the steady-state probes) first turns a cut-off attempt in flight past the judging deadline
    into a timeout (``inflight.cut_off_timeouts``), which this then counts.
    """
    out = []
    for r in records:
        if r.get("cut_off"):
            continue
        t = r.get("sent_at")
        if not isinstance(t, int | float):
            continue
        if start is not None and t < start:
            continue
        if end is not None and t >= end:
            continue
        out.append(r)
    return out


def cut_off_count(
    records: Iterable[Record], start: float | None = None, end: float | None = None
) -> int:
    """Attempts sent in ``[start, end)`` that were still in flight when the load stopped."""
    n = 0
    for r in records:
        t = r.get("sent_at")
        if not r.get("cut_off") or not isinstance(t, int | float):
            continue
        if (start is None or t >= start) and (end is None or t < end):
            n += 1
    return n


def percentiles_s(values_s: Sequence[float], pcts: Sequence[float]) -> dict[float, float | None]:
    """Percentiles of durations through an HDR histogram (1 us units, 3 significant digits).

    Args:
        values_s: durations in seconds (non-finite values are ignored, negatives clamp to 1 us).
        pcts: percentiles in [0, 100].

    Returns:
        ``{pct: seconds}``; every value is None when there is no finite input. The value reported
        is HDR's highest equivalent value of the bucket holding the percentile.
    """
    vals = [v for v in values_s if isinstance(v, int | float) and math.isfinite(v)]
    if not vals:
        return {p: None for p in pcts}
    h = HdrHistogram(1, _HDR_MAX_US, 3)
    for v in vals:
        us = int(round(v * _US))
        h.record_value(min(max(us, 1), _HDR_MAX_US))
    got = h.get_percentile_to_value_dict(list(pcts))
    return {p: got[p] / _US for p in pcts}


def client_lag_s(records: Iterable[Record]) -> list[float]:
    """Client lag per socket read (module docstring), seconds, from kernel-timed records.

    A read is a run of equal ``chunk_times_loop`` values of a record (the chunks of one read share
    both times); its lag is that loop time minus the chunks' kernel time. Records without ``time_source: "kernel"`` or whose two lists differ
    in length are skipped.
    """
    out: list[float] = []
    for r in records:
        if r.get("time_source") != "kernel":
            continue
        kt, lt = r.get("chunk_times") or [], r.get("chunk_times_loop") or []
        if len(kt) != len(lt):
            continue
        prev: Any = None
        for k, lp in zip(kt, lt, strict=True):
            if lp != prev:
                out.append(max(float(lp) - float(k), 0.0))
                prev = lp
    return out


def _ok(r: Record) -> bool:
    return bool(r.get("ok"))


def _due(r: Record) -> float | None:
    """When ``r`` was due: ``intended_at`` when it is a number no later than ``sent_at``, else
    ``sent_at`` (None without one)."""
    s, i = r.get("sent_at"), r.get("intended_at")
    if not isinstance(s, int | float):
        return None
    return float(i) if isinstance(i, int | float) and i <= s else float(s)


def _since(r: Record, key: str, from_send: bool = False) -> float | None:
    """``r[key]`` minus when ``r`` was due (:func:`_due`), or minus ``sent_at``."""
    t = r.get(key)
    s = r.get("sent_at") if from_send else _due(r)
    if isinstance(s, int | float) and isinstance(t, int | float):
        return float(t) - float(s)
    return None


def _e2e(r: Record) -> float | None:
    return _since(r, "end_at")


def e2e_ok_s(records: Iterable[Record]) -> list[float]:
    """E2E latency (s, from the intended send, as ``window_stats`` measures it) of each
    successful record: what a latency SLO's count of requests over its threshold reads
    (:mod:`chaoslib_infer.measure.binomial`)."""
    return [v for v in (_e2e(r) for r in records if _ok(r)) if v is not None]


def _ratio(n: int, d: int) -> float | None:
    return n / d if d else None


def window_stats(
    records: Iterable[Record], start: float | None = None, end: float | None = None
) -> dict[str, Any]:
    """Request statistics of one window (contracts.md section 4).

    Args:
        records: attempt records (contracts.md section 3).
        start: window start, unix seconds, inclusive (None = unbounded).
        end: window end, unix seconds, exclusive (None = unbounded).

    Returns:
        ``requests, ok, failed, timeouts, not_sent`` (counts; ``not_sent``: requests due while
        the load's in-flight cap was full, among ``failed``); ``availability, error_rate,
        timeout_rate, censored_fraction`` (fractions of attempted); ``p50/p95/p99/p999_e2e_s,
        p50/p99_ttft_s`` (from the intended send), ``p50/p99_e2e_from_send_s,
        p99_ttft_from_send_s`` (the same from the actual send), ``p50/p99_itl_s,
        p50/p99_tpot_s`` (seconds, successful requests only); ``p99_send_lag_s``
        (``sent_at - intended_at``, all attempts: client-side queueing); ``ok_rps`` (successful
        requests per second of window; the window is [start, end) when both are given, else the
        span of ``sent_at``); ``errors_by_class: {class: {"count", "sample"}}``; the client's own
        lag (module docstring): ``p50_client_lag_s``, ``p99_client_lag_s``, ``max_client_lag_s``
        (seconds, all attempts, None without kernel-timed records), ``client_lag_reads`` and
        ``kernel_time_fraction`` (attempts with ``time_source: "kernel"`` / attempted). None where
        no data.
    """
    recs = select(records, start, end)
    n = len(recs)
    oks = [r for r in recs if _ok(r)]
    n_ok = len(oks)
    failed = n - n_ok
    timeouts = 0
    errors: dict[str, dict[str, Any]] = {}
    for r in recs:
        if _ok(r):
            continue
        cls = r.get("error_class") or "unknown"
        if cls in TIMEOUT_CLASSES:
            timeouts += 1
        slot = errors.setdefault(cls, {"count": 0, "sample": None})
        slot["count"] += 1
        if slot["sample"] is None and r.get("error"):
            slot["sample"] = r.get("error")
    e2e = [v for v in (_e2e(r) for r in oks) if v is not None]
    e2e_send = [v for v in (_since(r, "end_at", True) for r in oks) if v is not None]
    ttft = [v for v in (_since(r, "first_token_at") for r in oks) if v is not None]
    ttft_send = [v for v in (_since(r, "first_token_at", True) for r in oks) if v is not None]
    itl: list[float] = []
    tpot: list[float] = []
    for r in oks:
        ct = r.get("chunk_times") or []
        if len(ct) >= 2:
            itl.extend(b - a for a, b in zip(ct, ct[1:], strict=False))
            toks = r.get("output_tokens")
            if isinstance(toks, int) and toks >= 2:
                tpot.append((ct[-1] - ct[0]) / (toks - 1))
    lag = [
        r["sent_at"] - r["intended_at"]
        for r in recs
        if isinstance(r.get("intended_at"), int | float)
    ]
    pe = percentiles_s(e2e, (50, 95, 99, 99.9))
    pes = percentiles_s(e2e_send, (50, 99))
    pt = percentiles_s(ttft, (50, 99))
    pi = percentiles_s(itl, (50, 99))
    pp = percentiles_s(tpot, (50, 99))
    pl = percentiles_s([max(v, 0.0) for v in lag], (99,))
    clag = client_lag_s(recs)
    pcl = percentiles_s(clag, (50, 99))
    n_kernel = sum(1 for r in recs if r.get("time_source") == "kernel")
    if start is not None and end is not None:
        span: float | None = end - start
    elif recs:
        ts = [r["sent_at"] for r in recs]
        span = max(ts) - min(ts)
    else:
        span = None
    return {
        "start": start,
        "end": end,
        "requests": n,
        "ok": n_ok,
        "failed": failed,
        "timeouts": timeouts,
        "not_sent": sum(1 for r in recs if r.get("not_sent")),
        "availability": _ratio(n_ok, n),
        "error_rate": _ratio(failed, n),
        "timeout_rate": _ratio(timeouts, n),
        "censored_fraction": _ratio(failed, n),
        "p50_e2e_s": pe[50],
        "p95_e2e_s": pe[95],
        "p99_e2e_s": pe[99],
        "p999_e2e_s": pe[99.9],
        "p50_e2e_from_send_s": pes[50],
        "p99_e2e_from_send_s": pes[99],
        "p50_ttft_s": pt[50],
        "p99_ttft_s": pt[99],
        "p99_ttft_from_send_s": percentiles_s(ttft_send, (99,))[99],
        "p50_itl_s": pi[50],
        "p99_itl_s": pi[99],
        "p50_tpot_s": pp[50],
        "p99_tpot_s": pp[99],
        "p99_send_lag_s": pl[99],
        "ok_rps": (n_ok / span) if span else None,
        "errors_by_class": errors,
        "p50_client_lag_s": pcl[50],
        "p99_client_lag_s": pcl[99],
        "max_client_lag_s": max(clag) if clag else None,
        "client_lag_reads": len(clag),
        "kernel_time_fraction": _ratio(n_kernel, n),
    }


def _span(records: Sequence[Record], start: float | None, end: float | None) -> tuple[float, float]:
    ts = [r["sent_at"] for r in records if isinstance(r.get("sent_at"), int | float)]
    lo = start if start is not None else (min(ts) if ts else 0.0)
    hi = end if end is not None else (max(ts) + 1e-9 if ts else lo)
    return float(lo), float(hi)


def per_second_series(
    records: Iterable[Record],
    start: float | None = None,
    end: float | None = None,
    bucket_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Per-bucket counts and latency, bucketed by ``sent_at`` (for the timeline plot).

    Args:
        records: attempt records.
        start: first bucket start, unix seconds (None = earliest ``sent_at``).
        end: end of the last bucket, exclusive (None = just after the latest ``sent_at``).
        bucket_s: bucket width in seconds (default 1).

    Returns:
        One row per bucket, including empty ones: ``{"t": bucket start (unix s), "requests",
        "ok", "failed", "p50_e2e_s", "p99_e2e_s"}`` (percentiles over successful requests of the
        bucket, HDR as in ``window_stats``; None when the bucket has none).

    Raises:
        ValueError: ``bucket_s`` <= 0.
    """
    if not bucket_s > 0:
        raise ValueError(f"bucket_s must be > 0, got {bucket_s!r}")
    recs = list(records)
    lo, hi = _span(recs, start, end)
    nb = max(0, math.ceil((hi - lo) / bucket_s - 1e-9))
    buckets: list[list[Record]] = [[] for _ in range(nb)]
    for r in select(recs, lo, hi):
        i = int((r["sent_at"] - lo) // bucket_s)
        if 0 <= i < nb:
            buckets[i].append(r)
    rows = []
    for i, b in enumerate(buckets):
        ok = [r for r in b if _ok(r)]
        p = percentiles_s([v for v in (_e2e(r) for r in ok) if v is not None], (50, 99))
        rows.append(
            {
                "t": lo + i * bucket_s,
                "requests": len(b),
                "ok": len(ok),
                "failed": len(b) - len(ok),
                "p50_e2e_s": p[50],
                "p99_e2e_s": p[99],
            }
        )
    return rows


def per_replica_share(
    records: Iterable[Record], start: float | None = None, end: float | None = None
) -> dict[str, float]:
    """Share of the window's attempts that each replica answered.

    Counts records in ``[start, end)`` (by ``sent_at``) whose ``replica`` is known (the response
    carried ``X-Replica-Id`` / ``X-Lab-Server``), successful or not; attempts that never reached a
    replica (connect errors, timeouts before headers) are left out of the denominator.

    Returns:
        ``{replica: fraction}``, fractions summing to 1.0; ``{}`` when no record names a replica.
    """
    counts: dict[str, int] = {}
    for r in select(records, start, end):
        rep = r.get("replica")
        if rep:
            counts[str(rep)] = counts.get(str(rep), 0) + 1
    total = sum(counts.values())
    return {k: v / total for k, v in sorted(counts.items())} if total else {}


def _attempt_no(r: Record) -> int:
    a = r.get("attempt")
    return a if isinstance(a, int) and not isinstance(a, bool) else 1


def _by_request(records: Iterable[Record]) -> list[list[Record]]:
    groups: dict[str, list[Record]] = {}
    for k, r in enumerate(records):
        rid = r.get("request_id")
        groups.setdefault(str(rid) if rid is not None else f"<no request_id #{k}>", []).append(r)
    return [sorted(g, key=_attempt_no) for g in groups.values()]


def _outcome(attempts: Sequence[Record]) -> Record:
    finals = [r for r in attempts if r.get("final") is True]
    return finals[-1] if finals else attempts[-1]


def logical_outcomes(records: Iterable[Record]) -> list[dict[str, Any]]:
    """One record per logical request (``request_id``), as the caller of a retrying client sees it.

    The outcome is the request's final attempt (``final: true``, contracts.md section 3); when no
    attempt is marked final (a run stopped during a backoff, or records without ``final``) it is
    the highest ``attempt``. The returned record is a copy of that attempt with ``sent_at`` and
    ``intended_at`` taken from the first attempt, so E2E and TTFT run from the first send (retries
    and backoffs included), plus ``attempts`` (count of attempt records). Records without
    ``request_id`` each count as their own logical request.

    Returns:
        Logical records, ordered by first ``sent_at``.
    """
    out: list[dict[str, Any]] = []
    for attempts in _by_request(records):
        first = attempts[0]
        rec = dict(_outcome(attempts))
        rec["sent_at"] = first.get("sent_at")
        rec["intended_at"] = first.get("intended_at", first.get("sent_at"))
        rec["attempts"] = len(attempts)
        out.append(rec)
    out.sort(key=lambda r: r["sent_at"] if isinstance(r.get("sent_at"), int | float) else 0.0)
    return out


def logical_stats(
    records: Iterable[Record], start: float | None = None, end: float | None = None
) -> dict[str, Any]:
    """``window_stats`` per logical request instead of per attempt.

    Each ``request_id`` counts once with the outcome of its final attempt (``logical_outcomes``);
    it is in the window when its **first** attempt's ``sent_at`` is in ``[start, end)``, and its
    E2E/TTFT are measured from that first send. A request that failed once and succeeded on retry
    is available here and a failure in ``window_stats``.

    Args:
        records: attempt records (contracts.md section 3).
        start: window start, unix seconds, inclusive (None = unbounded).
        end: window end, unix seconds, exclusive (None = unbounded).

    Returns:
        The ``window_stats`` keys (``requests`` = logical requests) plus ``attempts`` (attempt
        records of those requests) and ``retries`` (``attempts - requests``).
    """
    logical = select(logical_outcomes(records), start, end)
    stats = window_stats(logical, start, end)
    attempts = sum(int(r["attempts"]) for r in logical)
    stats["attempts"] = attempts
    stats["retries"] = attempts - len(logical)
    return stats


def retry_stats(records: Iterable[Record]) -> dict[str, int]:
    """Retry counts of a run.

    Returns:
        ``logical_requests`` (distinct ``request_id``), ``attempts`` (records), ``retries``
        (``attempts - logical_requests``), ``retried_requests`` (requests with more than one
        attempt), ``succeeded_after_retry`` (requests whose outcome, as in ``logical_outcomes``,
        is ok on an attempt > 1).
    """
    groups = _by_request(records)
    attempts = sum(len(g) for g in groups)
    return {
        "logical_requests": len(groups),
        "attempts": attempts,
        "retries": attempts - len(groups),
        "retried_requests": sum(1 for g in groups if len(g) > 1),
        "succeeded_after_retry": sum(
            1 for g in groups if _outcome(g).get("ok") and _attempt_no(_outcome(g)) > 1
        ),
    }
