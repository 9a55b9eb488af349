"""PromQL probes: read the service's own monitoring during a drill (Prometheus HTTP API).

The queries are the ones the alert rules use (:mod:`chaoslib_infer.prometheus`), so a drill can
show that the monitoring saw what the load client saw. Every probe makes one instant query
(``GET <url>/api/v1/query?query=...``) with a bounded timeout, through httpx, and returns a JSON-able
mapping: ``{"query", "result_type", "samples": [{"labels", "value"}], "value"}`` plus the probe's
own keys. ``value`` is the single sample's value when the result is one sample or a scalar,
``None`` when the result is empty, and the maximum over the samples otherwise (``max_labels`` names
its series).

``url`` may be left empty: the experiment's ``configuration`` key ``prometheus_url`` is used.
Errors (unreachable server, timeout, HTTP error, a PromQL error answered by Prometheus) raise
``ActivityFailed`` with one line naming the URL and the cause.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx
from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import prometheus as pq
from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.safety.allowlist import check_target
from chaoslib_infer.safety.redact import clip

__all__ = ["error_rate", "p99_from_histogram", "prometheus_query", "queue_depth", "restarts"]

DEFAULT_TIMEOUT_S = 5.0


def _base_url(url: str, configuration: dict[str, Any] | None) -> str:
    base = url or str((configuration or {}).get("prometheus_url") or "")
    if not base:
        raise ActivityFailed("prometheus: no URL (argument url or configuration prometheus_url)")
    if not base.startswith(("http://", "https://")):
        raise ActivityFailed(f"prometheus: {base!r} is not an http(s) URL")
    return base.rstrip("/")


def _float(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value


def prometheus_query(
    url: str,
    query: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one PromQL instant query.

    Args:
        url: Prometheus base URL (e.g. ``http://127.0.0.1:9090``); empty: ``prometheus_url`` from
            the configuration.
        query: the PromQL expression.
        timeout_s: connect + read timeout (seconds).
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"url", "query", "result_type", "samples": [{"labels": {..}, "value": float|None}],
        "value": float|None, "max_labels": {..}|None}``; NaN values (e.g. 0/0) become ``None``.

    Raises:
        ActivityFailed: unreachable, timed out, non-2xx answer, or ``status != "success"``.
    """
    base = _base_url(url, configuration)
    endpoint = f"{base}/api/v1/query"
    try:  # the blast radius covers the monitoring too (issue 13)
        check_target(endpoint, configuration=configuration, what="prometheus URL")
    except InferChaosError as exc:
        raise ActivityFailed(str(exc)) from None
    try:
        resp = httpx.get(
            endpoint,
            params={"query": query},
            timeout=httpx.Timeout(float(timeout_s)),
            follow_redirects=False,
        )
    except httpx.TimeoutException:
        raise ActivityFailed(f"prometheus {base}: no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise ActivityFailed(f"prometheus {base}: {type(exc).__name__}: {exc}") from None
    if 300 <= resp.status_code < 400:
        raise ActivityFailed(
            f"prometheus {base}: HTTP {resp.status_code} redirect to "
            f"{clip(resp.headers.get('location', '?'), 200)}; redirects are not followed"
        )
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ActivityFailed(
            f"prometheus {base}: HTTP {resp.status_code}, not a Prometheus API answer"
        )
    if resp.status_code >= 400 or body.get("status") != "success":
        kind = body.get("errorType") or f"HTTP {resp.status_code}"
        raise ActivityFailed(
            f"prometheus {base}: query failed ({kind}): "
            f"{clip(str(body.get('error') or 'no error text'), 300)}"
        )
    data = body.get("data") or {}
    rtype = str(data.get("resultType") or "")
    result = data.get("result")
    samples: list[dict[str, Any]] = []
    if rtype == "vector" and isinstance(result, list):
        for item in result:
            pair = item.get("value") or [None, None]
            value = _float(pair[1] if len(pair) > 1 else None)
            samples.append(
                {
                    "labels": dict(item.get("metric") or {}),
                    "value": None if value is None or math.isnan(value) else value,
                }
            )
    elif rtype == "scalar" and isinstance(result, list) and len(result) > 1:
        value = _float(result[1])
        samples.append(
            {"labels": {}, "value": None if value is None or math.isnan(value) else value}
        )
    elif rtype:
        raise ActivityFailed(f"prometheus {base}: unsupported result type {rtype!r} for {query!r}")
    present = [s for s in samples if s["value"] is not None]
    top = max(present, key=lambda s: s["value"]) if present else None
    return {
        "url": base,
        "query": query,
        "result_type": rtype,
        "samples": samples,
        "value": top["value"] if top else None,
        "max_labels": top["labels"] if top else None,
    }


def _built_query(
    url: str,
    timeout_s: float,
    configuration: dict[str, Any] | None,
    build: Callable[..., str],
    *args: Any,
) -> dict[str, Any]:
    """:func:`prometheus_query` of the query ``build(*args)``; its ``ValueError`` (a bad window,
    selector or quantile) becomes ``ActivityFailed("prometheus: <why>")``."""
    try:
        query = build(*args)
    except ValueError as exc:
        raise ActivityFailed(f"prometheus: {exc}") from None
    return prometheus_query(url, query, timeout_s, configuration)


def error_rate(
    url: str = "",
    window: str = "2m",
    selector: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Share (0..1) of inference API requests answered with 5xx over ``window``.

    Query: :func:`chaoslib_infer.prometheus.error_rate_query` (vLLM's ``http_requests_total``).

    Returns:
        :func:`prometheus_query`'s mapping plus ``"threshold": 0.005`` and ``"passed"`` (value below
        the 0.5% alert threshold; ``None`` without data).

    Raises:
        ActivityFailed: see :func:`prometheus_query`; a malformed window or selector.
    """
    out = _built_query(url, timeout_s, configuration, pq.error_rate_query, window, selector)
    out["threshold"] = 0.005
    out["passed"] = None if out["value"] is None else out["value"] <= 0.005
    return out


def p99_from_histogram(
    url: str = "",
    histogram: str = pq.E2E_HISTOGRAM,
    quantile: float = 0.99,
    window: str = "2m",
    selector: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A latency quantile (seconds, default P99) from a Prometheus histogram over ``window``.

    Query: :func:`chaoslib_infer.prometheus.quantile_query` (``histogram_quantile`` over
    ``<histogram>_bucket`` summed by ``le``). The value is interpolated inside a bucket, so its
    precision is the bucket width.

    Raises:
        ActivityFailed: see :func:`prometheus_query`; a quantile outside (0, 1).
    """

    def query() -> str:  # float() inside, so a bad quantile is an ActivityFailed too
        return pq.quantile_query(float(quantile), window, selector, histogram)

    return _built_query(url, timeout_s, configuration, query)


def queue_depth(
    url: str = "",
    selector: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Requests waiting per instance (``vllm:num_requests_waiting``); ``value`` is the deepest.

    Raises:
        ActivityFailed: see :func:`prometheus_query`.
    """
    return _built_query(url, timeout_s, configuration, pq.queue_depth_query, selector)


def restarts(
    url: str = "",
    window: str = "1h",
    selector: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Container restarts per pod/container over ``window`` (kube-state-metrics).

    Returns:
        :func:`prometheus_query`'s mapping (``value``: the most restarts of any container) plus
        ``"threshold": 2`` and ``"passed"`` (no container above the alert's 2 per hour).

    Raises:
        ActivityFailed: see :func:`prometheus_query`.
    """
    out = _built_query(url, timeout_s, configuration, pq.restarts_query, window, selector)
    out["threshold"] = 2
    out["passed"] = out["value"] is None or out["value"] <= 2
    return out
