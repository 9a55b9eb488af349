"""Multi-window, multi-burn-rate alert rules for the plan's availability SLO.

The conventions are the SRE workbook's (chapter 5, "Alerting on SLOs", table 5-8) as Sloth and
Pyrra generate them: a **page** when the error budget burns at 14.4x over both 1 h and 5 min, or at
6x over both 6 h and 30 min; a **ticket** at 1x over both 3 d and 6 h. The short window (1/12 of
the long one) makes the alert stop soon after the burn stops. Like Sloth, one recording rule per
window holds the SLI's error ratio (Sloth: ``slo:sli_error:ratio_rate<window>``; here
``chaos_infer:sli_error:ratio_rate<window>``) and the alerts compare two of them with
``burn rate x (1 - SLO)``; the alerts carry no ``for:`` (Sloth's neither), so they fire at the
first evaluation where both windows burn.

The SLI defaults to the load client's own counters (served by
:mod:`chaoslib_infer.lab.exposition`): a logical request that timed out, was answered 5xx/429,
empty, garbled or cut counts as failed (``docs/definitions.md``, "Denominators"), which no
server-side counter sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLIENT_REQUESTS",
    "PAGE_ALERT",
    "PAGE_WINDOWS",
    "TICKET_ALERT",
    "TICKET_WINDOWS",
    "BurnWindow",
    "burn_rate_rules",
    "scaled",
    "sli_record",
]

#: The load client's logical-request counter (label ``result``: ``ok`` | ``failed``).
CLIENT_REQUESTS = "chaos_infer_client_requests_total"
PAGE_ALERT = "AvailabilityBurnRatePage"
TICKET_ALERT = "AvailabilityBurnRateTicket"

_DURATION = re.compile(r"^\d+(ms|s|m|h|d|w)$")


@dataclass(frozen=True)
class BurnWindow:
    """One multi-window condition: the budget burns at ``factor`` x over both windows.

    Attributes:
        short: the short window (Prometheus duration, e.g. ``5m``).
        long: the long window (e.g. ``1h``).
        factor: the burn rate (error ratio / (1 - SLO)) both windows must reach.
    """

    short: str
    long: str
    factor: float


#: The workbook's page conditions: 14.4x over 1 h and 5 min, 6x over 6 h and 30 min.
PAGE_WINDOWS: tuple[BurnWindow, ...] = (BurnWindow("5m", "1h", 14.4), BurnWindow("30m", "6h", 6.0))
#: The workbook's ticket condition: 1x over 3 d and 6 h.
TICKET_WINDOWS: tuple[BurnWindow, ...] = (BurnWindow("6h", "3d", 1.0),)


_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _seconds(duration: str) -> float:
    m = re.match(r"^(\d+)(ms|s|m|h|d|w)$", duration)
    if not m:
        raise ValueError(f"burn-rate window {duration!r} is not a Prometheus duration")
    return int(m.group(1)) * _SECONDS[m.group(2)]


def scaled(windows: tuple[BurnWindow, ...], scale: float) -> tuple[BurnWindow, ...]:
    """``windows`` with both windows divided by ``scale`` (whole seconds, at least 1 s): a
    time-compressed lab where a drill's seconds stand for a real incident's minutes
    (``scale`` 60: 14.4x over 1 min and 5 s). The factors are kept.

    Raises:
        ValueError: ``scale`` below 1.
    """
    if not scale >= 1:
        raise ValueError(f"window_scale must be >= 1, got {scale!r}")
    if scale == 1:
        return windows
    out = []
    for w in windows:
        short, long_ = (max(1, round(_seconds(d) / scale)) for d in (w.short, w.long))
        out.append(BurnWindow(f"{short}s", f"{long_}s", w.factor))
    return tuple(out)


def sli_record(window: str) -> str:
    """Name of the recording rule holding the SLI's error ratio over ``window``."""
    return f"chaos_infer:sli_error:ratio_rate{window}"


def _condition(windows: tuple[BurnWindow, ...], budget: float) -> str:
    """Sloth's shape: ``max without (window) (ratio_short > f x budget) and max without (window)
    (ratio_long > f x budget)``, the conditions joined by ``or`` (one alert, whichever holds)."""
    parts = [
        " and ".join(
            f"max without (slo_window) ({sli_record(d)} > ({w.factor:g} * {budget:.6g}))"
            for d in (w.short, w.long)
        )
        for w in windows
    ]
    return "(" + ")\nor\n(".join(parts) + ")"


def burn_rate_rules(
    slo: float = 0.999,
    error_query: str = f'sum(rate({CLIENT_REQUESTS}{{result="failed"}}[{{window}}]))',
    total_query: str = f"sum(rate({CLIENT_REQUESTS}[{{window}}]))",
    page: tuple[BurnWindow, ...] = PAGE_WINDOWS,
    ticket: tuple[BurnWindow, ...] = TICKET_WINDOWS,
    name: str = "chaos-infer-availability-slo",
) -> dict[str, Any]:
    """A Prometheus rule file (``rule_files:`` format): the SLI recording rules and the page and
    ticket burn-rate alerts of an availability SLO.

    Args:
        slo: the availability objective, a fraction in (0, 1) (0.999: a 0.1 % error budget).
        error_query: PromQL of failed events per second, ``{window}`` where the range goes.
        total_query: PromQL of all events per second, same placeholder.
        page: the page conditions (any of them pages); the workbook's by default.
        ticket: the ticket conditions; empty: no ticket alert.
        name: the rule groups' name prefix.

    Returns:
        ``{"groups": [recordings, alerts]}``, ready for ``yaml.safe_dump``.

    Raises:
        ValueError: ``slo`` outside (0, 1), a malformed window, a query without ``{window}``.
    """
    if not 0.0 < slo < 1.0:
        raise ValueError(f"slo must be in (0, 1), got {slo!r}")
    for q in (error_query, total_query):
        if "{window}" not in q:
            raise ValueError(f"SLI query {q!r} has no {{window}} placeholder")
    windows: list[str] = []
    for w in (*page, *ticket):
        for d in (w.short, w.long):
            if not _DURATION.match(d):
                raise ValueError(f"burn-rate window {d!r} is not a Prometheus duration")
            if d not in windows:
                windows.append(d)
    budget = 1.0 - slo
    records = [
        {
            "record": sli_record(w),
            "expr": f"({error_query.replace('{window}', w)}) / "
            f"({total_query.replace('{window}', w)})",
            "labels": {"slo_window": w},
        }
        for w in windows
    ]
    alerts: list[dict[str, Any]] = []
    for alert, severity, conds in ((PAGE_ALERT, "page", page), (TICKET_ALERT, "ticket", ticket)):
        if not conds:
            continue
        text = "; ".join(f"{c.factor:g}x over {c.long} and {c.short}" for c in conds)
        alerts.append(
            {
                "alert": alert,
                "expr": _condition(conds, budget),
                "labels": {"severity": severity, "layer": "slo"},
                "annotations": {
                    "summary": f"Availability SLO {slo:g}: error budget burning ({text})",
                    "source": "SRE workbook ch. 5 table 5-8; Sloth/Pyrra multi-window rules",
                },
            }
        )
    return {
        "groups": [
            {"name": f"{name}.sli", "rules": records},
            {"name": f"{name}.alerts", "rules": alerts},
        ]
    }
