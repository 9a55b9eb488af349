"""Drill figures computed from load records (definitions: ``docs/definitions.md``, "Drill
figures"). All times are unix seconds; durations are seconds.

Conventions used here:

* A failure becomes **user-visible** at its ``end_at`` (when the client got the error); a success
  likewise counts at its ``end_at``.
* A replica **serves** a request when the response headers from it arrive (``first_byte_at`` of a
  successful record whose ``replica`` is that replica). The lab's ground truth for the same moment
  is the engine ledger / ``Lab.served``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .episodes import SETTLE_S, episodes
from .metrics import percentiles_s, select, window_stats

__all__ = [
    "SETTLE_S",
    "duplicates",
    "interruption",
    "MIN_BUCKET_REQUESTS",
    "RECOVERY_UNMEASURED",
    "recovery",
    "recovery_outcome",
    "restart",
    "restart_from_records",
    "steady_ttft_p50",
    "warmup",
]

Record = Mapping[str, Any]


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _fnum(v: Any) -> float | None:
    return float(v) if _num(v) else None


def interruption(
    records: Iterable[Record], fault_at: float, settle_s: float = SETTLE_S
) -> dict[str, Any]:
    """Interruption time: the time out of SLO over every episode from the fault to the end of the
    data, each from its first user-visible failure to its last failure before service is
    sustained again (:func:`chaoslib_infer.measure.episodes.episodes`: the settling rule, a
    pending failure keeping its episode open). The one computation every drill uses; a second
    collapse after a brief return counts like the first.

    Args:
        records: attempt records (unix-second ``sent_at`` / ``end_at``; cut-off ones ignored).
        fault_at: fault injection time (unix s); failures visible before it are ignored.
        settle_s: settling window in seconds.

    Returns:
        ``{"interruption_s", "failed_requests", "first_failure_at", "last_failure_at",
        "sustained", "episodes", "longest_episode_s", "episode_spans"}``: the time out of SLO
        (s, the episodes' lengths summed, 0.0 with no failure), the failed attempts of every
        episode, the first episode's first failure and the last one's last failure (None with
        no failure), whether sustained service was observed after the last episode, the number
        of episodes, the longest one's length (s, 0.0 with none) and ``[[start, end], ...]`` of
        every episode in seconds after ``fault_at``.
    """
    eps = episodes(records, fault_at, settle_s)
    longest = eps.longest
    return {
        "interruption_s": eps.total_s,
        "failed_requests": sum(e.failed for e in eps.items),
        "first_failure_at": eps.items[0].start if eps.items else None,
        "last_failure_at": eps.items[-1].end if eps.items else None,
        "sustained": eps.sustained,
        "episodes": len(eps.items),
        "longest_episode_s": longest.length_s if longest is not None else 0.0,
        "episode_spans": eps.spans(fault_at),
    }


def restart_from_records(records: Iterable[Record], replica: str, died_at: float) -> float | None:
    """Restart time seen by clients: from the replica's death to the first request it served again.

    The client learns which replica served a request only from a successful response; the moment
    that request reached the replica is taken as its send time (``sent_at``), because the load
    balancer dispatches at once when the replica is up. The first byte would add the restarted
    replica's warm-up TTFT, which is reported separately (:func:`warmup`).

    Args:
        records: attempt records.
        replica: replica name as in the records' ``replica`` field.
        died_at: time of death (unix s), e.g. the lab's ``exit`` event.

    Returns:
        Seconds from ``died_at`` to the earliest ``sent_at`` >= ``died_at`` of a successful record
        from ``replica``; None if it never served again in the data.
    """
    best: float | None = None
    for r in records:
        if not r.get("ok") or r.get("replica") != replica:
            continue
        sent = _fnum(r.get("sent_at"))
        if sent is not None and sent >= died_at and (best is None or sent < best):
            best = sent
    return None if best is None else best - died_at


#: Alias matching contracts.md section 4 (``figures.restart(...)``).
restart = restart_from_records


def warmup(
    records: Iterable[Record],
    replica: str,
    after: float,
    k: int = 3,
    steady_p50_ttft_s: float | None = None,
) -> dict[str, Any]:
    """First-request warm-up: TTFT of the first ``k`` successful requests a replica served after
    ``after`` (e.g. its ``ready`` event), against the steady-state median TTFT.

    Requests are those with ``sent_at >= after`` (so time spent queued before ``after`` does not
    inflate the figure), ordered by ``first_byte_at``.

    Args:
        records: attempt records.
        replica: replica name.
        after: unix seconds.
        k: how many first requests.
        steady_p50_ttft_s: optional steady-state median TTFT (see ``steady_ttft_p50``).

    Returns:
        ``{"n", "ttfts_s", "mean_ttft_s", "max_ttft_s", "ratio_to_steady"}``; ``n`` may be < k;
        means/maxima None when n == 0; ratio = mean / steady (None without a steady value).

    Raises:
        ValueError: k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    cand = [
        r
        for r in records
        if r.get("ok")
        and r.get("replica") == replica
        and _num(r.get("sent_at"))
        and r["sent_at"] >= after
        and _num(r.get("first_token_at"))
    ]
    cand.sort(key=lambda r: r["first_byte_at"] if _num(r.get("first_byte_at")) else r["sent_at"])
    ttfts = [r["first_token_at"] - r["sent_at"] for r in cand[:k]]
    mean = sum(ttfts) / len(ttfts) if ttfts else None
    ratio = mean / steady_p50_ttft_s if mean is not None and steady_p50_ttft_s else None
    return {
        "n": len(ttfts),
        "ttfts_s": ttfts,
        "mean_ttft_s": mean,
        "max_ttft_s": max(ttfts) if ttfts else None,
        "ratio_to_steady": ratio,
    }


def steady_ttft_p50(
    records: Iterable[Record], start: float | None = None, end: float | None = None
) -> float | None:
    """Median TTFT (s, HDR) of successful requests sent in ``[start, end)`` (None = unbounded);
    None without data."""
    ttft = [
        r["first_token_at"] - r["sent_at"]
        for r in select(records, start, end)
        if r.get("ok") and _num(r.get("first_token_at"))
    ]
    return percentiles_s(ttft, (50,))[50]


def duplicates(records: Iterable[Record], ledger_entries: Iterable[Mapping[str, Any]]) -> int:
    """Logical requests the engine generated more than once, every generation counted (the
    contracts.md section 4 helper). The drill's figure is not this count: a drill's
    ``duplicate_generations`` leaves out the re-runs of the generations its fault aborted
    (:func:`chaoslib_infer.measure.rerun.rerun_figures`, one computation for the verdict, the
    evidence and network-jitter's probe).

    Args:
        records: attempt records; only their ``request_id`` values are used (the ledger may hold
            other clients' traffic, which is ignored).
        ledger_entries: engine ledger lines
            ``{"t", "event": "generation", "replica", "request_id", "pid"}`` (contracts.md §1).

    Returns:
        Number of logical request ids of ``records`` with more than one ``generation`` entry.
    """
    ids = {r.get("request_id") for r in records}
    ids.discard(None)
    counts: dict[str, int] = {}
    for e in ledger_entries:
        if e.get("event", "generation") != "generation":
            continue
        rid = e.get("request_id")
        if isinstance(rid, str) and rid in ids:
            counts[rid] = counts.get(rid, 0) + 1
    return sum(1 for c in counts.values() if c > 1)


#: Fewest requests a recovery window (bucket) needs to be judged in or out of the baseline bands
#: (``docs/definitions.md``, "Drill figures", recovery). A thinner window (the load's last partial
#: window, a trickle) is skipped: it neither extends nor breaks a run, so one slow request in it
#: cannot read as "never back".
MIN_BUCKET_REQUESTS = 8

#: The note of a recovery the data could not show (the load ended first): the row reads
#: ``unmeasured``, never ``fail``.
RECOVERY_UNMEASURED = "unmeasured: "


def recovery(
    records: Iterable[Record],
    fault_at: float,
    baseline_stats: Mapping[str, Any],
    window_s: float = 2.0,
    settle_s: float = 5.0,
    p99_factor: float = 1.5,
    error_rate_margin: float = 0.005,
    end: float | None = None,
    min_requests: int = MIN_BUCKET_REQUESTS,
) -> float | None:
    """Recovery time in seconds, or None when not shown in the data (never back, or the load
    ended first): :func:`recovery_outcome`'s first element, same arguments."""
    return recovery_outcome(
        records,
        fault_at,
        baseline_stats,
        window_s,
        settle_s,
        p99_factor,
        error_rate_margin,
        end,
        min_requests,
    )[0]


def recovery_outcome(
    records: Iterable[Record],
    fault_at: float,
    baseline_stats: Mapping[str, Any],
    window_s: float = 2.0,
    settle_s: float = 5.0,
    p99_factor: float = 1.5,
    error_rate_margin: float = 0.005,
    end: float | None = None,
    min_requests: int = MIN_BUCKET_REQUESTS,
) -> tuple[float | None, str | None]:
    """Recovery time: from the fault until per-window P99 E2E latency and error rate are back
    inside the steady-state baseline bands, sustained for ``settle_s``.

    Windows of ``window_s`` are laid from ``fault_at`` on, by ``sent_at``. A window with fewer
    than ``min_requests`` requests is *thin* and skipped (neither in nor out of band: it neither
    extends nor breaks a run). Another window is in band when its P99 E2E (successful requests)
    is <= ``p99_factor`` x baseline P99 and its error rate is <= baseline error rate +
    ``error_rate_margin``. Recovery is the start of the first run of ``ceil(settle_s /
    window_s)`` consecutive judged in-band windows *after the first impact* (the first judged
    window out of band), minus ``fault_at``: an impact that starts a few seconds after the fault
    is not mistaken for an early recovery. 0.0 when no judged window left the band (no impact).
    Resolution: ``window_s``.

    When the data ends without such a run, the recovery is "never" only when the last
    ``ceil(settle_s / window_s)`` judged windows were all out of band (the service was seen out
    of band for the settling time at the end); otherwise (the load ended during a partial run,
    or fewer judged windows remain) it is unmeasured.

    Args:
        records: attempt records.
        fault_at: fault injection time, unix s.
        baseline_stats: ``window_stats`` of the steady state before the fault (``p99_e2e_s``,
            ``error_rate``).
        window_s: window width, s.
        settle_s: how long the bands must hold, s.
        p99_factor: latency band, multiple of the baseline P99 (1.5 as the domain's P99 alert).
        error_rate_margin: error-rate band above the baseline (0.5% as the domain's alert).
        end: last time to consider (default: the latest ``sent_at``).
        min_requests: fewest requests a window needs to be judged (:data:`MIN_BUCKET_REQUESTS`).

    Returns:
        ``(seconds, None)`` when recovered (0.0: no impact); ``(None, "never back inside the
        baseline bands before the load ended")`` when seen out of band to the end (a failing
        figure, never read as 0); ``(None, "unmeasured: ...")`` (:data:`RECOVERY_UNMEASURED`)
        when the data ended before a recovery could be shown or refuted.

    Raises:
        ValueError: window_s <= 0, min_requests < 1, or the baseline lacks
            ``p99_e2e_s``/``error_rate``.
    """
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    if min_requests < 1:
        raise ValueError(f"min_requests must be >= 1, got {min_requests!r}")
    base_p99 = _fnum(baseline_stats.get("p99_e2e_s"))
    base_err = _fnum(baseline_stats.get("error_rate"))
    if base_p99 is None or base_err is None:
        raise ValueError("baseline_stats needs numeric p99_e2e_s and error_rate")
    p99_band = p99_factor * base_p99
    err_band = base_err + error_rate_margin
    recs = [r for r in records if _num(r.get("sent_at"))]
    if end is None:
        end = max((r["sent_at"] for r in recs), default=fault_at) + 1e-9
    need = max(1, math.ceil(settle_s / window_s - 1e-9))
    nwin = math.ceil((end - fault_at) / window_s - 1e-9)
    buckets: list[list[Record]] = [[] for _ in range(max(nwin, 0))]
    for r in recs:
        i = int((r["sent_at"] - fault_at) // window_s)
        if 0 <= i < len(buckets):
            buckets[i].append(r)
    run: list[int] = []  # indices of the current run of judged in-band windows
    judged: list[bool] = []  # in band, per judged window
    impacted = False
    for i, b in enumerate(buckets):
        s = window_stats(b)
        if s["requests"] < min_requests:
            continue  # thin: neither in nor out of band
        good = (
            s["p99_e2e_s"] is not None
            and s["p99_e2e_s"] <= p99_band
            and s["error_rate"] <= err_band
        )
        judged.append(good)
        impacted = impacted or not good
        run = [*run, i] if good else []
        if impacted and len(run) >= need:
            return run[0] * window_s, None
    if not impacted:
        return 0.0, None
    if len(judged) >= need and not any(judged[-need:]):
        return None, "never back inside the baseline bands before the load ended"
    seen = len(run) * window_s
    return None, (
        f"{RECOVERY_UNMEASURED}the load ended before {settle_s:g} s in the baseline bands could "
        f"be seen ({seen:g} s in band at its end, windows of {window_s:g} s with at least "
        f"{min_requests} requests)"
    )
