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

Shedding as its own class (the traffic-spike experiments, ``docs/definitions.md``, "Drill
criteria"): ``slo_check(..., shed=true)`` leaves the requests shed as a fast 429/503 out of the
window, and :func:`shed_check` judges them by their own budget (shed share, shed answer P99), so
a sane shed never fails the hypothesis and every other failure still does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from chaoslib_infer import settings
from chaoslib_infer.drills.criterion import configured_overrides
from chaoslib_infer.drills.traffic_spike.shed import shed_answer_p99_s, shed_counts, without_shed
from chaoslib_infer.load.client import INFLIGHT_FILE
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.binomial import plan_settings
from chaoslib_infer.measure.inflight import (
    DEFAULT_DEADLINE_S,
    judged_records,
    read_inflight,
    wait_for_window,
)
from chaoslib_infer.measure.metrics import e2e_ok_s, logical_outcomes, select, window_stats
from chaoslib_infer.measure.slo import Thresholds, bad_word, evaluate, window_test
from chaoslib_infer.verdict.criteria import criteria_for
from chaoslib_infer.verdict.state import CLIENT_LAG, client_lag_rows, reason

__all__ = [
    "availability",
    "error_rate",
    "latency_percentile",
    "logical_window",
    "shed_bound_s",
    "shed_check",
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


#: (records path, window, sheds left out) -> (time the judgement finished, stats): the probes
#: of one hypothesis share one judged window instead of each waiting for the same slow requests
_CACHE: dict[tuple[str, float, bool], tuple[float, dict[str, Any]]] = {}
_CACHE_S = 3.0
#: The E2E of the window's successful logical requests, kept beside the statistics for the
#: latency SLOs' binomial test and left out of every probe's output.
_E2E_OK = "_e2e_ok_s"


def _deadline(configuration: dict[str, Any] | None) -> float:
    value = (configuration or {}).get("infer_judge_deadline_s")
    try:
        return float(value) if value not in (None, "") else DEFAULT_DEADLINE_S
    except (TypeError, ValueError):
        return DEFAULT_DEADLINE_S


def _stats(
    window_s: float, configuration: dict[str, Any] | None, shed: bool = False
) -> dict[str, Any]:
    """Stats of the attempts sent in the last ``window_s`` seconds, judged only once each has
    ended or passed the judging deadline (then it counts as a timeout):
    :mod:`chaoslib_infer.measure.inflight`. With ``shed`` the shed requests (a fast 429/503,
    :func:`shed_bound_s`) are left out (:func:`~chaoslib_infer.drills.traffic_spike.shed.
    without_shed`), and ``shed_requests``, ``sent_requests``, ``shed_share`` and
    ``shed_p99_s`` say what was shed (:func:`_leave_out_shed`)."""
    path = settings.records_path(configuration)
    key = (str(path), float(window_s), shed)
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
    judged, client_info = _without_client_not_sent(
        judged, end - float(window_s), end, configuration
    )
    shed_info: dict[str, Any] = {}
    if shed:
        judged, shed_info = _leave_out_shed(judged, end - float(window_s), end, configuration)
    stats = logical_window(judged, end - float(window_s), end)
    stats.update(shed_info)
    stats.update(client_info)
    done = [
        r
        for r in select(logical_outcomes(judged), end - float(window_s), end)
        if r.get("final") is not False
    ]
    stats[_E2E_OK] = e2e_ok_s(done)  # the latency SLOs' counts over threshold (slo_check)
    stats["hung_in_flight"] = sum(
        1
        for r in judged
        if r.get("in_flight_at_judging") and end - float(window_s) <= r["sent_at"] < end
    )
    stats["judging_wait_s"] = round(waited, 3)
    _CACHE[key] = (time.time(), stats)
    return stats


def _without_client_not_sent(
    records: list[dict[str, Any]], a: float, b: float, configuration: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``records`` without the ``not_sent`` requests of ``[a, b)`` when the client itself fell
    behind there (its send lag or read lag P99 over the window's attempts broke
    ``send_lag_p99_s`` / ``client_lag_p99_s``, the verdict's thresholds, overridden by
    ``infer_criteria`` as every criterion): its own cap filled, not the service's
    (``docs/definitions.md``, "Verdicts"). A client that kept up keeps them: an open-loop
    request the service's held slots kept back is the service's failure.

    Returns:
        ``(records, info)``: ``info`` is {} when nothing was left out, else
        ``{"not_sent_left_out": N, "client_fell_behind": [reason, ...]}`` (each broken lag
        criterion as the verdict words it).

    Raises:
        ValueError: a malformed ``infer_criteria`` item.
    """
    window = select(records, a, b)
    if not any(r.get("not_sent") for r in window):
        return records, {}
    ov = configured_overrides(configuration, "")  # the items every drill shares
    crits = criteria_for("", {k: v for k, v in ov.items() if k in CLIENT_LAG})
    lag = client_lag_rows(window, crits)
    if not lag:
        return records, {}
    kept = [r for r in records if not (r.get("not_sent") and a <= float(r["sent_at"]) < b)]
    info = {
        "not_sent_left_out": len(records) - len(kept),
        "client_fell_behind": [reason(r) for r in lag],
    }
    return kept, info


def _spike_thresholds(configuration: dict[str, Any] | None) -> dict[str, float | None]:
    """The traffic-spike drill's shed thresholds in force: ``shed_share_fault`` and
    ``shed_p99_s`` (defaults of ``drills/traffic_spike/criteria.py``, overridden by the
    ``infer_criteria`` configuration key like every criterion; None: off).

    Raises:
        ValueError: a malformed ``infer_criteria`` item, or one naming no traffic-spike criterion.
    """
    crits = criteria_for("traffic-spike", configured_overrides(configuration, "traffic-spike"))
    return {c.name: c.threshold for c in crits if c.name in ("shed_share_fault", "shed_p99_s")}


def shed_bound_s(configuration: dict[str, Any] | None = None) -> float | None:
    """How fast a 429/503 must come to be a shed (s): the ``shed_p99_s`` threshold in force
    (default 1 s; None when it is off: any 429/503 is a shed)."""
    return _spike_thresholds(configuration)["shed_p99_s"]


def _leave_out_shed(
    records: list[dict[str, Any]], a: float, b: float, configuration: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``records`` without the requests shed in ``[a, b)`` (:mod:`chaoslib_infer.drills.
    traffic_spike.shed`), and ``{"shed_requests", "sent_requests", "shed_share",
    "shed_p99_s"}`` of that window (logical requests; the P99 over the shed answers)."""
    bound = shed_bound_s(configuration)
    n_shed, n_sent = shed_counts(records, bound, a, b)
    info = {
        "shed_requests": n_shed,
        "sent_requests": n_sent,
        "shed_share": n_shed / n_sent if n_sent else None,
        "shed_p99_s": shed_answer_p99_s(select(records, a, b)),
    }
    return without_shed(records, bound, a, b), info


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
    return {k: v for k, v in _stats(window_s, configuration).items() if k != _E2E_OK}


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
    shed: bool = False,
) -> dict[str, Any]:
    """Check one acceptance metric of ``docs/definitions.md`` over the last ``window_s`` seconds.

    Thresholds default to the acceptance table (P50 E2E <= 2 s, P95 <= 3x P50, P99 <= 10 s,
    timeout rate < 0.5%, error rate < 0.1%, availability >= 99.9%) and are overridden by
    ``slo_<metric>`` configuration keys (e.g. ``--var slo_p99_e2e_s=0.5``).

    The window is judged by the exact binomial test on its count of bad requests
    (:func:`chaoslib_infer.measure.slo.window_test`; ``docs/definitions.md``, "Windows with
    stated error rates"): availability, error and timeout rates count failed / timed-out
    requests against the rate the SLO allows (0.1 %, 0.1 %, 0.5 %), P50 and P99 the
    successful requests over their threshold against 50 % and 1 %; the window fails at the
    smallest count whose false-alarm rate at the SLO is at most ``window_false_alarm``
    (default 0.05). ``value`` stays the point estimate; the P95 check (a factor of the
    measured P50) is judged on it.

    Args:
        metric: one of ``availability``, ``error_rate``, ``timeout_rate``, ``p50_e2e_s``,
            ``p95_e2e_s``, ``p99_e2e_s``.
        window_s: look-back window in seconds.
        configuration: Chaos Toolkit configuration.
        shed: shedding is its own class (the traffic-spike experiments): the requests shed as a
            fast 429/503 (:mod:`chaoslib_infer.drills.traffic_spike.shed`; "fast": the
            ``shed_p99_s`` criterion in force, default 1 s) are left out of the window, and
            :func:`shed_check` judges them by their own budget. Every other failure counts.

    Returns:
        ``{"metric", "value", "op", "threshold", "passed", "requests", "censored_fraction",
        "unit", "attempts", "attempt_value", "retries", "pending_retries"}``: ``value`` and
        ``requests`` are over logical requests (the verdict's unit); ``attempts`` is the
        attempts sent in the window and ``attempt_value`` the rate metric over them (None for a
        latency), shown beside, never judged (with ``shed``, also ``"shed_requests"``: the
        requests left out); where the client itself fell behind in the window, its own
        ``not_sent`` requests are left out too, ``"not_sent_left_out"`` counting them beside
        ``"client_fell_behind"`` (its broken lag criteria); for a binomial metric also
        ``"test"`` (:meth:`~chaoslib_infer.measure.binomial.WindowTest.as_dict`: ``n``, ``bad``,
        ``fails_at``, ``false_alarm`` at the SLO and its bound, ``power`` against the
        ``defect`` and its target, ``needed`` requests, ``powered``) and ``"statement"`` (the
        same in one line: ``"1 failed of 64: fails at 2 or more failed of 64 (false alarm
        0.19 % at the SLO, bound 5 %); catches a 2 % defect only 37 % of the time at n=64;
        194 needed for 90 %"``) and ``"test_settings"`` (``{"false_alarm", "power",
        "defect"}`` in force: the verdict reads them back). Use the tolerance
        ``{"type": "jsonpath", "path": "$.passed", "expect": true}``.

    Raises:
        ValueError: unknown metric name; a ``window_false_alarm``, ``window_power`` or
            ``window_defect`` not strictly between 0 and 1; with ``shed``, a malformed
            ``infer_criteria``.
    """
    if not isinstance(shed, bool):  # a ${var} arrives as text
        shed = str(shed).strip().lower() in ("1", "true", "yes")
    test_settings = plan_settings(configuration)  # a bad setting: one line, before the wait
    stats = _stats(window_s, configuration, shed=shed)
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
    if shed:
        row["shed_requests"] = stats.get("shed_requests", 0)
    if stats.get("not_sent_left_out"):  # the client's own, not the service's
        row["not_sent_left_out"] = stats["not_sent_left_out"]
        row["client_fell_behind"] = stats["client_fell_behind"]
    test = (
        window_test(metric, stats, stats.get(_E2E_OK) or [], row["threshold"], test_settings)
        if row["threshold"] is not None
        else None
    )
    if test is not None:  # the exact binomial test judges the window, its rates stated
        row["passed"] = test.passed
        row["test"] = test.as_dict()
        row["statement"] = test.statement(bad_word(metric, row["threshold"]))
        row["test_settings"] = test_settings  # the verdict judges its windows with the same
    if not stats.get("requests"):
        row["passed"] = False
    return row


def shed_check(
    window_s: float = 10.0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Judge the shed load of the last ``window_s`` seconds by its own budget: the share of the
    requests sent that were shed as a fast 429/503 (:mod:`chaoslib_infer.drills.traffic_spike.
    shed`) and the P99 of the shed answers' times. The traffic-spike experiments hold it beside
    the SLO probes run with ``shed: true``, so a sane shed never fails their hypotheses and an
    insane one always does.

    Thresholds: the traffic-spike criteria ``shed_share_fault`` (default 0.25) and
    ``shed_p99_s`` (default 1 s), overridden by ``infer_criteria`` like every criterion
    (``docs/definitions.md``, "Drill criteria"); ``off`` skips that check.

    Args:
        window_s: look-back window in seconds (attempts sent in it, judged as ``slo_check``
            judges them: an attempt in flight past the deadline is a timeout, never a shed).
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"metric": "shed_share", "value" (0..1, None without a request), "op": "<=",
        "threshold", "shed_p99_s", "shed_p99_threshold_s", "requests" (logical requests sent),
        "shed", "passed", "reasons"}``: ``passed`` is False when a check breaks or no request
        was sent; ``reasons`` names each broken one (value and threshold).

    Raises:
        ValueError: a malformed ``infer_criteria`` item.
    """
    stats = _stats(window_s, configuration, shed=True)
    limits = _spike_thresholds(configuration)
    share, p99 = stats.get("shed_share"), stats.get("shed_p99_s")
    max_share, max_p99 = limits["shed_share_fault"], limits["shed_p99_s"]
    reasons: list[str] = []
    if not stats.get("sent_requests"):
        reasons.append(f"no request was sent in the last {float(window_s):g} s")
    if share is not None and max_share is not None and share > max_share:
        reasons.append(
            f"shed share {share:.4g} > {max_share:g} ({stats['shed_requests']} of "
            f"{stats['sent_requests']} requests shed as a fast 429/503)"
        )
    if p99 is not None and max_p99 is not None and p99 > max_p99:
        reasons.append(f"shed answer P99 {p99:.3g} s > {max_p99:g} s")
    return {
        "metric": "shed_share",
        "value": share,
        "op": "<=",
        "threshold": max_share,
        "shed_p99_s": p99,
        "shed_p99_threshold_s": max_p99,
        "requests": stats.get("sent_requests", 0),
        "shed": stats.get("shed_requests", 0),
        "passed": not reasons,
        "reasons": reasons,
    }
