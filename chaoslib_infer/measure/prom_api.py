"""Reading a Prometheus server's HTTP API (``/api/v1``): the raw ``ALERTS`` samples, the rules,
whether a metric has any series, and the reachability check run before any fault.

Every call takes the server's base URL (``http://host:9090``, a path prefix allowed) and raises
:class:`PrometheusAPIError` (one line) when the server cannot be read.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = [
    "PrometheusAPIError",
    "alert_samples",
    "check_prometheus",
    "instant",
    "metric_present",
    "range_query",
    "rules",
]


class PrometheusAPIError(Exception):
    """The server did not answer, or answered an error (the message is one line)."""


def _get(base: str, path: str, params: dict[str, Any] | None = None, timeout_s: float = 5.0) -> Any:
    url = base.rstrip("/") + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read()).get("error") or str(exc)
        except (ValueError, OSError):
            why = str(exc)
        raise PrometheusAPIError(f"{base}: {path}: {why}") from None
    except (OSError, ValueError) as exc:
        raise PrometheusAPIError(f"{base}: {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise PrometheusAPIError(f"{base}: {path}: {doc!r:.200}")
    return doc.get("data")


def check_prometheus(base: str, timeout_s: float = 3.0) -> None:
    """Check that ``base`` is a Prometheus HTTP API (``/api/v1/status/buildinfo`` answers).

    Raises:
        PrometheusAPIError: not a URL, unreachable, or not Prometheus' API.
    """
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PrometheusAPIError(f"{base!r} is not an http(s) URL")
    data = _get(base, "/api/v1/status/buildinfo", timeout_s=timeout_s)
    if not isinstance(data, dict) or "version" not in data:
        raise PrometheusAPIError(f"{base}: not a Prometheus HTTP API (no build info)")


def instant(base: str, query: str, at: float | None = None) -> list[dict[str, Any]]:
    """``/api/v1/query``: the result list (``metric``, ``value`` or ``values``)."""
    params: dict[str, Any] = {"query": query}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = _get(base, "/api/v1/query", params)
    result = data.get("result") if isinstance(data, dict) else None
    return result if isinstance(result, list) else []


def alert_samples(base: str, start: float, end: float) -> list[dict[str, Any]]:
    """Every raw ``ALERTS`` sample from ``start`` to ``end`` (unix s), by series:
    ``[{"labels": {alertname, alertstate, severity, ...}, "t": [unix s, ...]}]``.

    Read as a range selector evaluated at ``end``, so the timestamps are the rule evaluations'
    own, not a query step's.
    """
    span = max(1, math.ceil(end - start))
    out = []
    for series in instant(base, f"ALERTS[{span}s]", end):
        values = series.get("values") or []
        ts = [float(v[0]) for v in values if float(v[0]) >= start - 1e-3]
        if ts:
            out.append({"labels": dict(series.get("metric") or {}), "t": ts})
    return out


def rules(base: str) -> list[dict[str, Any]]:
    """The alerting rules the server evaluates: ``[{"name", "query", "duration" (s, the
    ``for:``), "labels", "health", "lastError", "file"}]``."""
    data = _get(base, "/api/v1/rules", {"type": "alert"})
    out = []
    for group in (data or {}).get("groups") or []:
        for r in group.get("rules") or []:
            if r.get("type", "alerting") == "alerting":
                out.append({**r, "file": group.get("file")})
    return out


def metric_present(base: str, name: str, at: float | None = None) -> bool:
    """Whether metric ``name`` had any series at ``at`` (or now)."""
    return bool(instant(base, f'count({{__name__="{name}"}})', at))


def range_query(
    base: str, query: str, start: float, end: float, step_s: float
) -> list[tuple[float, float]]:
    """``/api/v1/query_range`` of a query with one result series: ``[(unix s, value)]``
    (no result: ``[]``; NaN values left out)."""
    data = _get(
        base,
        "/api/v1/query_range",
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
    )
    out: list[tuple[float, float]] = []
    for series in (data or {}).get("result") or []:
        for t, v in series.get("values") or []:
            value = float(v)
            if math.isfinite(value):
                out.append((float(t), value))
        break
    return out
