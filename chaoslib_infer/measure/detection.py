"""Detection figures of one drill, from a Prometheus server's own ``ALERTS`` series.

Pure functions over what :mod:`chaoslib_infer.measure.prom_api` read: the raw ``ALERTS``
samples (one per rule evaluation while an alert is pending or firing), the alerting rules (their
``for:``), which of each rule's metrics had series, and the burn rate the page rule should have
seen. Times in the output are seconds from the fault's injection (negative: before it).

- An **episode** is a run of samples of one alert (one label set) with no gap longer than 2.5
  evaluation intervals; its first sample is the rule's condition first holding (``pending``, or
  ``firing`` at once for ``for: 0s``), its first ``firing`` sample the alert firing.
- ``time_to_detect_s``: from injection to the first alert that *fired* in the drill after the
  injection (not carried over from before the drill); ``condition_held_s``: that alert's condition
  first holding. ``time_to_page_s``: the same for alerts labelled ``severity="page"``.
- **Baseline alarms**: alerts whose episode began (pending or firing) between the drill's start
  and the injection. An episode already active at the drill's start is reported as carried over
  (an earlier drill's), never blamed on this one. A page alert still firing at the injection is
  ``already_paging``: the fault found the on-call already paged.
- Per rule: ``for_s``, whether its condition held after the injection (``condition_held_s``),
  whether the fault lasted long enough for its ``for:`` (``fault_end - condition_first_held >=
  for``), when it would have fired had the fault lasted (``would_fire_s``), and why a silent rule
  stayed silent (``no metric X``, ``no series matches X``, ``for: Ns longer than the condition
  held``, ``condition never held``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Episode",
    "client_burn_peak",
    "detection_figures",
    "episodes",
    "records_burn",
    "rule_selectors",
]

_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "bool",
    "offset",
    "group_left",
    "group_right",
    "inf",
    "nan",
    # aggregation operators (followed by ``by``/``without`` before their parenthesis)
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
}


@dataclass(frozen=True)
class Episode:
    """One alert's pending/firing run.

    Attributes:
        alert: the alert name.
        severity: its ``severity`` label ("" when none).
        start: first sample (the condition first held), unix s.
        firing_at: first ``firing`` sample, or None (stayed pending).
        end: last sample plus one interval (when it stopped being active), unix s.
    """

    alert: str
    severity: str
    start: float
    firing_at: float | None
    end: float


def episodes(samples: Iterable[Mapping[str, Any]], interval_s: float) -> list[Episode]:
    """Episodes from :func:`~chaoslib_infer.measure.prom_api.alert_samples`, by start time."""
    by_series: dict[tuple[tuple[str, str], ...], list[tuple[float, str]]] = {}
    for s in samples:
        labels = dict(s.get("labels") or {})
        state = str(labels.pop("alertstate", ""))
        labels.pop("__name__", None)
        key = tuple(sorted(labels.items()))
        by_series.setdefault(key, []).extend((float(t), state) for t in s.get("t") or [])
    gap = 2.5 * interval_s
    out: list[Episode] = []
    for key, points in by_series.items():
        labels = dict(key)
        points.sort()
        run: list[tuple[float, str]] = []
        for point in [*points, (float("inf"), "")]:
            if run and point[0] - run[-1][0] > gap:
                firing = [t for t, st in run if st == "firing"]
                out.append(
                    Episode(
                        str(labels.get("alertname", "")),
                        str(labels.get("severity", "")),
                        run[0][0],
                        firing[0] if firing else None,
                        run[-1][0] + interval_s,
                    )
                )
                run = []
            run.append(point)
    return sorted(out, key=lambda e: e.start)


_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"\d+(\.\d*)?([eE][+-]?\d+)?(ms|s|m|h|d|w|y)?|\.\d+")
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def _close(text: str, i: int, opening: str, closing: str) -> int:
    """Index just past the ``closing`` that matches ``text[i] == opening`` (quotes skipped)."""
    depth, quote = 0, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def rule_selectors(query: str) -> list[str]:
    """The vector selectors of a PromQL expression (``name{...}`` or bare ``name``), in order,
    without duplicates: what must have series for the rule to ever hold."""
    out: list[str] = []
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if ch in "\"'`":  # a string: past its closing quote
            i += 1
            while i < n and query[i] != ch:
                i += 2 if query[i] == "\\" else 1
            i += 1
            continue
        if ch == "[":
            i = _close(query, i, "[", "]")
            continue
        num = _NUMBER.match(query, i)
        if num and (i == 0 or not (query[i - 1].isalnum() or query[i - 1] in "_:")):
            i = num.end()
            continue
        m = _IDENT.match(query, i)
        if not m:
            i += 1
            continue
        name, j = m.group(0), m.end()
        k = j
        while k < n and query[k].isspace():
            k += 1
        nxt = query[k : k + 1]
        if name.lower() in _GROUPING and nxt == "(":
            i = _close(query, k, "(", ")")
            continue
        if name.lower() in _KEYWORDS or nxt == "(":
            i = j
            continue
        if nxt == "{":
            end = _close(query, k, "{", "}")
            sel, i = name + query[k:end], end
        else:
            sel, i = name, j
        if sel not in out:
            out.append(sel)
    return out


def _rel(t: float | None, origin: float) -> float | None:
    return None if t is None else round(t - origin, 3)


def detection_figures(
    eps: list[Episode],
    rules: Sequence[Mapping[str, Any]],
    *,
    drill_start: float,
    injection_at: float,
    fault_end_at: float,
    drill_end: float,
    interval_s: float,
    missing: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The drill's detection figures (see the module docstring).

    Args:
        eps: :func:`episodes` over the drill.
        rules: the server's alerting rules (``name``, ``duration`` = the ``for:`` in seconds,
            ``labels``), from :func:`~chaoslib_infer.measure.prom_api.rules`.
        drill_start, injection_at, fault_end_at, drill_end: unix s; the baseline is
            ``[drill_start, injection_at)``, the fault ``[injection_at, fault_end_at]``.
        interval_s: the rules' evaluation interval, seconds.
        missing: ``{alert: ["no metric X", ...]}``: selectors of the rule with no series.

    Returns:
        ``{"alerts": [...], "baseline_alarms": [...], "carried_over": [...], "rules": [...],
        "time_to_detect_s", "detected_by", "condition_held_s", "time_to_page_s", "paged_by",
        "fault_held_s", "interval_s"}``; unmeasured figures are None.
    """
    missing = missing or {}
    o = injection_at
    alerts: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    carried: list[dict[str, Any]] = []
    for e in eps:
        if e.end <= drill_start or e.start > drill_end:
            continue
        row: dict[str, Any] = {
            "alert": e.alert,
            "severity": e.severity,
            "pending_s": _rel(e.start, o),
            "firing_s": _rel(e.firing_at, o),
            "ended_s": _rel(min(e.end, drill_end), o) if e.end <= drill_end else None,
            "active_s": round(min(e.end, drill_end) - max(e.start, drill_start), 3),
        }
        # firing when the fault was injected (an alert that began before it): already paging
        row["firing_at_injection"] = e.firing_at is not None and e.firing_at <= injection_at < e.end
        if e.start < drill_start - interval_s:
            row["phase"] = "carried over"
            carried.append(row)
        elif e.start < injection_at:
            row["phase"] = "baseline"
            baseline.append(row)
        else:
            row["phase"] = "fault" if e.start <= fault_end_at else "after"
        alerts.append(row)
    after_inj = [
        a for a in alerts if a["phase"] in ("fault", "after") and a["firing_s"] is not None
    ]
    first = min(after_inj, key=lambda a: a["firing_s"], default=None)
    pages = [a for a in after_inj if a["severity"] == "page"]
    first_page = min(pages, key=lambda a: a["firing_s"], default=None)
    already = [a for a in alerts if a["firing_at_injection"] and a["severity"] == "page"]
    held = round(fault_end_at - injection_at, 3)
    rule_rows = []
    for r in rules:
        name = str(r.get("name", ""))
        for_s = float(r.get("duration") or 0.0)
        mine = [a for a in alerts if a["alert"] == name and a["phase"] in ("fault", "after")]
        cond = min((a["pending_s"] for a in mine), default=None)
        fired = [a["firing_s"] for a in mine if a["firing_s"] is not None]
        rule_row: dict[str, Any] = {
            "alert": name,
            "severity": str((r.get("labels") or {}).get("severity", "")),
            "for_s": for_s,
            "condition_held_s": cond,
            "fired_s": min(fired) if fired else None,
            "fault_long_enough": None if cond is None else bool(held - cond >= for_s),
            "would_fire_s": None if cond is None else round(cond + for_s, 3),
            "health": r.get("health"),
        }
        if any(a["alert"] == name for a in alerts if a["firing_at_injection"]):
            rule_row["already_firing"] = True  # an earlier episode still firing at injection
        elif not fired:
            why = list(missing.get(name) or [])
            if r.get("health") not in (None, "ok", "unknown"):
                why.append(f"rule error: {r.get('lastError')}")
            if cond is not None:
                why.append(
                    f"for: {for_s:g} s longer than the condition held after it first held "
                    f"at {cond:+.1f} s (the fault ended at {held:+.1f} s; a fault lasting "
                    f"{cond + for_s:.0f} s would have fired it)"
                )
            elif not why:
                why.append("its condition never held")
            rule_row["why_silent"] = "; ".join(why)
        rule_rows.append(rule_row)
    return {
        "interval_s": interval_s,
        "fault_held_s": held,
        "alerts": alerts,
        "baseline_alarms": baseline,
        "carried_over": carried,
        "rules": rule_rows,
        "time_to_detect_s": first["firing_s"] if first else None,
        "detected_by": first["alert"] if first else None,
        "condition_held_s": first["pending_s"] if first else None,
        "time_to_page_s": first_page["firing_s"] if first_page else None,
        "paged_by": first_page["alert"] if first_page else None,
        "already_paging": sorted({a["alert"] for a in already}),
    }


def client_burn_peak(
    base: str,
    start: float,
    end: float,
    interval_s: float,
    budget: float,
    windows: Iterable[tuple[str, str, float]],
    counter: str = "chaos_infer_client_requests_total",
) -> tuple[float | None, float | None, bool, bool]:
    """The highest burn rate the page conditions saw from ``start`` to ``end``, measured from the
    load client's own counters (not the rule's metric): for each ``(short, long, factor)``,
    ``min(burn over short, burn over long)`` at each evaluation step.

    Returns:
        ``(peak, factor, reached, marginal)``: the peak burn of the condition that came closest
        to its rate (the highest burn / factor) and that factor; ``reached`` when a condition's
        burn reached its factor; ``marginal`` when its closest approach was within 10 % of the
        factor either way (one evaluation's timing decides: neither a silent nor a false page is
        judged). ``(None, None, False, False)`` when the counters had no series.
        Burn = failed share / ``budget``.
    """
    from chaoslib_infer.measure.prom_api import range_query

    peak: float | None = None
    peak_factor: float | None = None
    reached = marginal = False
    for short, long_, factor in windows:
        series = []
        for w in (short, long_):
            q = f'sum(increase({counter}{{result="failed"}}[{w}])) / sum(increase({counter}[{w}]))'
            series.append(dict(range_query(base, q, start, end, interval_s)))
        for t in set(series[0]) & set(series[1]):
            burn = min(series[0][t], series[1][t]) / budget
            if peak is None or peak_factor is None or burn / factor > peak / peak_factor:
                peak, peak_factor = burn, factor
            reached = reached or burn >= factor
            marginal = marginal or 0.9 * factor <= burn < 1.1 * factor
    return peak, peak_factor, reached, marginal


def records_burn(
    records: Iterable[Mapping[str, Any]], start: float, end: float, budget: float
) -> float | None:
    """Burn rate of the logical requests (final attempts) that ended in ``[start, end]``:
    failed share / ``budget``; None without any such request. The fallback where the
    Prometheus read does not scrape the load client (``--prometheus URL``)."""
    n = failed = 0
    for r in records:
        t = r.get("end_at") or r.get("sent_at")
        if r.get("final", True) is False or not isinstance(t, int | float) or not start <= t <= end:
            continue
        n += 1
        failed += 0 if r.get("ok") else 1
    return None if n == 0 else (failed / n) / budget
