"""Probes over the records of the background load (the client's view: what users feel).

Every probe reads the per-attempt records that the load control streams to
``<infer_run_dir>/records.jsonl`` and judges the *logical requests* first sent in the last
``window_s`` seconds: the unit of the verdict's criteria (``docs/definitions.md``, "The unit"):
a request with its client retries is one request, and it fails only when its final attempt
failed; its latency runs from its first send. The attempts' own figures are shown beside
(``attempts`` in :func:`window_summary`, ``attempt_value`` in :func:`slo_check`), never judged
instead. A request whose last recorded attempt failed and will be retried (``final: false``,
its next attempt not yet ended) has no outcome yet: it is counted in ``pending_retries`` and
left out of the rates.
The window is judged only once every attempt sent in it has ended, or has been in flight past the
judging deadline (``infer_judge_deadline_s``, default the client's 10 s first-token timeout), and
such an attempt counts as a timeout: a request that hangs is never missing from the window
(:mod:`chaoslib_infer.measure.inflight`). Definitions follow ``docs/definitions.md``: availability, error rate and
timeout rate are over attempted requests; latency percentiles are over successful requests, with
the failed (censored) fraction reported beside them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from chaoslib_infer import settings
from chaoslib_infer.load.client import INFLIGHT_FILE
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.inflight import (
    DEFAULT_DEADLINE_S,
    judged_records,
    read_inflight,
    wait_for_window,
)
from chaoslib_infer.measure.metrics import logical_outcomes, select, window_stats
from chaoslib_infer.measure.slo import Thresholds, evaluate

__all__ = [
    "availability",
    "error_rate",
    "latency_percentile",
    "logical_window",
    "slo_check",
    "window_summary",
]

_LATENCY_KEYS = {
    ("e2e", 50): "p50_e2e_s",
    ("e2e", 95): "p95_e2e_s",
    ("e2e", 99): "p99_e2e_s",
    ("e2e", 99.9): "p999_e2e_s",
    ("ttft", 50): "p50_ttft_s",
    ("ttft", 99): "p99_ttft_s",
    ("itl", 50): "p50_itl_s",
    ("itl", 99): "p99_itl_s",
}


def thresholds_from(overrides: dict[str, float]) -> Thresholds:
    """Return the default :class:`Thresholds` with ``overrides`` applied.

    Raises:
        ValueError: an override names no threshold field, or is out of range (fractions in
            [0, 1], latencies > 0 s, the P95/P50 factor >= 1, always finite).
    """
    known = {f.name for f in dataclasses.fields(Thresholds)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"unknown SLO threshold(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for key, value in overrides.items():
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"SLO {key}={value}: not a finite number")
        if key in ("availability", "error_rate", "timeout_rate") and not 0.0 <= v <= 1.0:
            raise ValueError(f"SLO {key}={value}: a fraction must be between 0 and 1")
        if key.endswith("_s") and v <= 0:
            raise ValueError(f"SLO {key}={value}: a latency must be > 0 seconds")
        if key == "p95_over_p50" and v < 1.0:
            raise ValueError(f"SLO {key}={value}: P95 cannot be under P50; give a factor >= 1")
    return dataclasses.replace(Thresholds(), **overrides)


#: The attempt figures shown beside the logical ones (``attempts`` of :func:`logical_window`).
_ATTEMPT_KEYS = ("requests", "ok", "failed", "availability", "error_rate", "timeout_rate")


def logical_window(records: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Window statistics in the verdict's unit: logical requests first sent in ``[start, end)``.

    Args:
        records: attempt records (judged: in-flight attempts past the deadline as timeouts).
        start, end: the window (unix s).

    Returns:
        The keys of :func:`chaoslib_infer.measure.metrics.window_stats` over logical requests
        (``requests`` = logical requests with an outcome; E2E from the first send), with the
        attempts' schedule and client lag (``p99_send_lag_s``, ``p99_client_lag_s``: the
        client's own timing is per attempt), plus ``attempts`` (``{"requests", "ok", "failed",
        "availability", "error_rate", "timeout_rate"}`` over the attempts sent in the window),
        ``retries`` (attempts of the counted requests beyond their first) and
        ``pending_retries`` (requests whose outcome awaits a retry: left out).
    """
    logical = select(logical_outcomes(records), start, end)
    pending = [r for r in logical if r.get("final") is False]
    done = [r for r in logical if r.get("final") is not False]
    stats = window_stats(done, start, end)
    attempts = window_stats(records, start, end)
    stats["p99_send_lag_s"] = attempts.get("p99_send_lag_s")
    for key in ("p50_client_lag_s", "p99_client_lag_s", "max_client_lag_s", "client_lag_reads"):
        stats[key] = attempts.get(key)
    stats["kernel_time_fraction"] = attempts.get("kernel_time_fraction")
    stats["attempts"] = {k: attempts.get(k) for k in _ATTEMPT_KEYS}
    stats["retries"] = sum(int(r.get("attempts") or 1) - 1 for r in done)
    stats["pending_retries"] = len(pending)
    stats["unit"] = "logical requests"
    return stats


#: (records path, window) -> (time the judgement finished, stats): the probes of one
#: hypothesis share one judged window instead of each waiting for the same slow requests
_CACHE: dict[tuple[str, float], tuple[float, dict[str, Any]]] = {}
_CACHE_S = 3.0


def _deadline(configuration: dict[str, Any] | None) -> float:
    value = (configuration or {}).get("infer_judge_deadline_s")
    try:
        return float(value) if value not in (None, "") else DEFAULT_DEADLINE_S
    except (TypeError, ValueError):
        return DEFAULT_DEADLINE_S


def _stats(window_s: float, configuration: dict[str, Any] | None) -> dict[str, Any]:
    """Stats of the attempts sent in the last ``window_s`` seconds, judged only once each has
    ended or passed the judging deadline (then it counts as a timeout):
    :mod:`chaoslib_infer.measure.inflight`."""
    path = settings.records_path(configuration)
    key = (str(path), float(window_s))
    hit = _CACHE.get(key)
    if hit is not None and time.time() - hit[0] < _CACHE_S:
        return hit[1]
    end = time.time()
    deadline = _deadline(configuration)
    inflight_path = path.with_name(INFLIGHT_FILE)
    waited = wait_for_window(inflight_path, end, deadline)
    records = read_records(path) if path.exists() else []
    now = time.time()
    judged = judged_records(records, read_inflight(inflight_path), now, deadline)
    stats = logical_window(judged, end - float(window_s), end)
    stats["hung_in_flight"] = sum(
        1
        for r in judged
        if r.get("in_flight_at_judging") and end - float(window_s) <= r["sent_at"] < end
    )
    stats["judging_wait_s"] = round(waited, 3)
    _CACHE[key] = (time.time(), stats)
    return stats


def window_summary(
    window_s: float = 10.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Return every client-side figure over the last ``window_s`` seconds of the background load.

    Args:
        window_s: length of the look-back window in seconds (attempts sent in it and completed).
        configuration: Chaos Toolkit configuration (``infer_run_dir`` locates the records).

    Returns:
        The mapping of :func:`logical_window` (logical requests; the attempts beside in
        ``attempts``): ``requests``, ``availability`` (0..1), ``error_rate``,
        ``timeout_rate``, ``p50_e2e_s`` ... ``p99_ttft_s`` (seconds, ``None`` without data),
        ``censored_fraction``, ``errors_by_class``, ``retries``, ``pending_retries``.
    """
    return _stats(window_s, configuration)


def availability(window_s: float = 10.0, configuration: dict[str, Any] | None = None) -> float:
    """Return availability over the last ``window_s`` seconds: successful / attempted logical
    requests (0..1; a request that succeeded on a retry succeeded).

    Timeouts, HTTP 5xx and 429, error objects in a 200 stream, empty, garbled and truncated replies
    all count as failures (``docs/definitions.md``). Returns 0.0 when no request was attempted, so a
    silent target never passes.
    """
    stats = _stats(window_s, configuration)
    return float(stats.get("availability") or 0.0) if stats.get("requests") else 0.0


def error_rate(window_s: float = 10.0, configuration: dict[str, Any] | None = None) -> float:
    """Return the failed share of attempted logical requests over the last ``window_s`` seconds
    (0..1).

    Returns 1.0 when no request was attempted (no evidence of health is not health).
    """
    stats = _stats(window_s, configuration)
    return float(stats.get("error_rate") or 0.0) if stats.get("requests") else 1.0


def latency_percentile(
    metric: str = "e2e",
    percentile: float = 99.0,
    window_s: float = 10.0,
    configuration: dict[str, Any] | None = None,
) -> float:
    """Return a latency percentile in seconds over successful requests of the last ``window_s`` s.

    Args:
        metric: ``"e2e"`` (send to end of stream), ``"ttft"`` (send to first output-bearing chunk,
            the role-only chat chunk excluded, as AIPerf/SGLang define it) or ``"itl"`` (raw gaps
            between output chunks).
        percentile: one of 50, 95, 99, 99.9 for e2e; 50 or 99 for ttft and itl.
        window_s: look-back window in seconds.
        configuration: Chaos Toolkit configuration.

    Returns:
        Seconds; ``float("inf")`` when there is no successful request in the window.

    Raises:
        ValueError: unknown metric/percentile pair.
    """
    key = _LATENCY_KEYS.get((metric, float(percentile) if percentile == 99.9 else int(percentile)))
    if key is None:
        raise ValueError(f"unsupported latency percentile: {metric} P{percentile}")
    value = _stats(window_s, configuration).get(key)
    return float(value) if value is not None else float("inf")


def slo_check(
    metric: str,
    window_s: float = 10.0,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check one acceptance metric of ``docs/definitions.md`` over the last ``window_s`` seconds.

    Thresholds default to the acceptance table (P50 E2E <= 2 s, P95 <= 3x P50, P99 <= 10 s,
    timeout rate < 0.5%, error rate < 0.1%, availability >= 99.9%) and are overridden by
    ``slo_<metric>`` configuration keys (e.g. ``--var slo_p99_e2e_s=0.5``).

    Args:
        metric: one of ``availability``, ``error_rate``, ``timeout_rate``, ``p50_e2e_s``,
            ``p95_e2e_s``, ``p99_e2e_s``.
        window_s: look-back window in seconds.
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"metric", "value", "op", "threshold", "passed", "requests", "censored_fraction",
        "unit", "attempts", "attempt_value", "retries", "pending_retries"}``: ``value`` and
        ``requests`` are over logical requests (the verdict's unit); ``attempts`` is the
        attempts sent in the window and ``attempt_value`` the rate metric over them (None for a
        latency), shown beside, never judged. Use the tolerance
        ``{"type": "jsonpath", "path": "$.passed", "expect": true}``.

    Raises:
        ValueError: unknown metric name.
    """
    stats = _stats(window_s, configuration)
    thresholds = thresholds_from(settings.slo_overrides(configuration))
    rows = {row["metric"]: row for row in evaluate(stats, thresholds)}
    if metric not in rows:
        raise ValueError(f"unknown SLO metric {metric!r}; known: {', '.join(sorted(rows))}")
    row = dict(rows[metric])
    row["requests"] = stats.get("requests", 0)
    row["censored_fraction"] = stats.get("censored_fraction")
    row["hung_in_flight"] = stats.get("hung_in_flight", 0)
    attempts = stats.get("attempts") or {}
    row["unit"] = stats.get("unit", "logical requests")
    row["attempts"] = attempts.get("requests", 0)
    row["attempt_value"] = attempts.get(metric)
    row["retries"] = stats.get("retries", 0)
    row["pending_retries"] = stats.get("pending_retries", 0)
    if not stats.get("requests"):
        row["passed"] = False
    return row
